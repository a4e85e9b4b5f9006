//! The idle-between-chunks timer of a streamed answer: [`IdleTimer`] fires
//! once the replica has sent nothing for its timeout, at most an eighth of
//! the timeout later.
//!
//! A frame only sets a flag: no clock is read per frame. The timer ticks
//! eight times per timeout while the answer waits, and each tick looks at
//! the flag; eight ticks in a row without a frame end the wait. The silence
//! is therefore at least the timeout (the tick that sees the last frame's
//! flag comes after it, and eight ticks follow) and at most nine ticks
//! when the answer's task is polled on time. Between ticks, a poll
//! with the waker the timer already holds costs one look at its state.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Waker};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// Ticks per timeout: how late, in parts of the timeout, it may fire.
const TICKS: u32 = 8;

pub struct IdleTimer {
    /// The next tick. Made when the answer first has to wait for the
    /// replica: an answer that arrives whole with its head never needs one.
    sleep: Option<Pin<Box<Sleep>>>,
    timeout: Duration,
    /// When the timer was made: a silence before the first wait counts.
    made: Instant,
    /// A frame came since the last tick.
    fresh: bool,
    /// Ticks in a row that saw no frame.
    quiet: u32,
    /// The waker the tick was last polled with while pending: polled again
    /// with the same one before it elapsed, there is nothing to do.
    registered: Option<Waker>,
}

impl IdleTimer {
    pub fn new(timeout: Duration) -> IdleTimer {
        IdleTimer {
            sleep: None,
            timeout,
            made: Instant::now(),
            fresh: false,
            quiet: 0,
            registered: None,
        }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A frame came: the silence starts again.
    pub fn touch(&mut self) {
        self.fresh = true;
    }

    fn tick(&self) -> Duration {
        self.timeout / TICKS
    }

    /// Whether nothing came for the timeout; otherwise `cx` is woken when
    /// that may have happened.
    #[inline]
    pub fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        let same_waker = self
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()));
        // Registered with this waker: only an elapsed tick has anything to do.
        if same_waker && self.sleep.as_ref().is_some_and(|s| !s.is_elapsed()) {
            return false;
        }
        self.tick_or_expire(cx, same_waker)
    }

    fn tick_or_expire(&mut self, cx: &mut Context<'_>, same_waker: bool) -> bool {
        let tick = self.tick();
        let sleep = match &mut self.sleep {
            Some(sleep) => sleep,
            None => {
                // The first wait: ticks count from the last frame if one
                // came (it came just now: its poll led here), else from
                // when the timer was made.
                let from = match std::mem::take(&mut self.fresh) {
                    true => Instant::now(),
                    false => self.made,
                };
                self.sleep
                    .insert(Box::pin(tokio::time::sleep_until(from + tick)))
            }
        };
        while sleep.as_mut().poll(cx).is_ready() {
            match std::mem::take(&mut self.fresh) {
                true => self.quiet = 0,
                false => self.quiet += 1,
            }
            if self.quiet >= TICKS {
                self.registered = None;
                return true;
            }
            // From now, not from the tick's deadline: ticks a busy task
            // polled late are not made up for, so a frame read after a
            // long wait (a client that read nothing for a while) starts a
            // full silence.
            sleep.as_mut().reset(Instant::now() + tick);
        }
        if !same_waker {
            self.registered = Some(cx.waker().clone());
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::poll_fn;
    use std::task::Poll;

    const TIMEOUT: Duration = Duration::from_millis(200);

    /// Feeds `timer` a frame at each of `frames` (from now) while waiting
    /// on it as the forwarding body does (the timer is looked at whenever
    /// no frame is ready, and the task is polled when either wakes it);
    /// returns when it fired, from now.
    async fn fires_at(timer: &mut IdleTimer, frames: &[u64]) -> Duration {
        let start = Instant::now();
        let mut frames = frames.iter().map(|&ms| start + Duration::from_millis(ms));
        let mut next = frames.next();
        let mut frame = Box::pin(tokio::time::sleep_until(next.unwrap_or(start)));
        poll_fn(|cx| {
            while next.is_some() && frame.as_mut().poll(cx).is_ready() {
                timer.touch();
                next = frames.next();
                if let Some(at) = next {
                    frame.as_mut().reset(at);
                }
            }
            match timer.expired(cx) {
                true => Poll::Ready(()),
                false => Poll::Pending,
            }
        })
        .await;
        Instant::now() - start
    }

    /// Not before the timeout after the last frame, and at most a tick
    /// (an eighth of it) later.
    fn within_a_tick_after(fired: Duration, last_frame: u64) {
        let silence = fired - Duration::from_millis(last_frame);
        assert!(silence >= TIMEOUT, "fired after {silence:?} of silence");
        assert!(
            silence <= TIMEOUT + TIMEOUT / TICKS,
            "fired after {silence:?} of silence"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn fires_a_timeout_after_the_last_frame_and_not_before() {
        let mut timer = IdleTimer::new(TIMEOUT);
        // Frames every 150 ms for 600 ms: never idle for 200 ms.
        let fired = fires_at(&mut timer, &[150, 300, 450, 600]).await;
        within_a_tick_after(fired, 600);
        // Frames 190 ms apart, then 10 ms apart.
        let mut timer = IdleTimer::new(TIMEOUT);
        let fired = fires_at(&mut timer, &[190, 380, 570, 580, 590]).await;
        within_a_tick_after(fired, 590);
    }

    /// Frames that came before the timer was first polled count: its first
    /// wait starts at the last of them.
    #[tokio::test(start_paused = true)]
    async fn frames_before_the_first_wait_count() {
        let mut timer = IdleTimer::new(TIMEOUT);
        tokio::time::advance(Duration::from_millis(150)).await;
        timer.touch();
        within_a_tick_after(fires_at(&mut timer, &[]).await, 0);
    }

    /// A frame read after the answer was not polled for longer than the
    /// timeout (a client that read nothing for a while) starts a full
    /// silence: the ticks missed meanwhile do not count.
    #[tokio::test(start_paused = true)]
    async fn a_frame_after_a_long_wait_starts_a_full_silence() {
        let mut timer = IdleTimer::new(TIMEOUT);
        let fired = fires_at(&mut timer, &[100]).await;
        within_a_tick_after(fired, 100);
        let mut timer = IdleTimer::new(TIMEOUT);
        assert!(!poll_fn(|cx| Poll::Ready(timer.expired(cx))).await);
        tokio::time::advance(Duration::from_secs(1)).await;
        timer.touch();
        within_a_tick_after(fires_at(&mut timer, &[]).await, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_answer_times_out_from_the_start() {
        let start = Instant::now();
        let mut timer = IdleTimer::new(Duration::from_secs(3));
        fires_at(&mut timer, &[]).await;
        assert_eq!(Instant::now() - start, Duration::from_secs(3));
        assert!(
            poll_fn(|cx| Poll::Ready(timer.expired(cx))).await,
            "stays expired"
        );
    }
}

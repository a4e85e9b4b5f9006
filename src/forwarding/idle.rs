//! The idle-between-chunks timer of a streamed answer: [`IdleTimer`] fires
//! once the replica has sent nothing for its timeout.
//!
//! A frame only notes the time (one clock read). The timer itself is moved
//! on when it fires before the last frame's deadline, so a stream of many
//! frames resets it about once per timeout rather than once per frame
//! (resetting a tokio timer costs several times a clock read).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Waker};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

pub struct IdleTimer {
    /// Fires at the deadline it was last set to, which may be early. Made
    /// when the answer first has to wait for the replica: an answer that
    /// arrives whole with its head never needs one.
    sleep: Option<Pin<Box<Sleep>>>,
    timeout: Duration,
    /// When the replica last sent a frame (or the timer was made).
    last: Instant,
    /// The waker the timer was last polled with while pending: polled again
    /// with the same one before its deadline, it has nothing to do, and a
    /// clock read is cheaper than the poll (which re-registers the waker).
    registered: Option<Waker>,
}

impl IdleTimer {
    pub fn new(timeout: Duration) -> IdleTimer {
        IdleTimer {
            sleep: None,
            timeout,
            last: Instant::now(),
            registered: None,
        }
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A frame came: the timeout counts from now.
    pub fn touch(&mut self) {
        self.last = Instant::now();
    }

    /// Whether nothing came for the timeout; otherwise `cx` is woken when
    /// that may have happened.
    pub fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        let same_waker = self
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()));
        let (last, timeout) = (self.last, self.timeout);
        // Made with the deadline the last frame sets: one made with the
        // timer would fire earlier only to be moved to it.
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(last + timeout)));
        if same_waker && Instant::now() < sleep.deadline() {
            return false;
        }
        while sleep.as_mut().poll(cx).is_ready() {
            let deadline = last + timeout;
            if deadline <= Instant::now() {
                self.registered = None;
                return true;
            }
            sleep.as_mut().reset(deadline);
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

    /// Polls `timer` once.
    async fn expired(timer: &mut IdleTimer) -> bool {
        poll_fn(|cx| Poll::Ready(timer.expired(cx))).await
    }

    /// Waits until `timer` fires.
    async fn fired(timer: &mut IdleTimer) {
        poll_fn(|cx| match timer.expired(cx) {
            true => Poll::Ready(()),
            false => Poll::Pending,
        })
        .await
    }

    /// The timer (of 200 ms, just touched) is not expired 199 ms from now
    /// and fires at 200 ms; returns the instant it was called.
    async fn fires_200ms_after_now(timer: &mut IdleTimer) -> Instant {
        let last = Instant::now();
        tokio::time::advance(Duration::from_millis(199)).await;
        assert!(!expired(timer).await, "one ms before the deadline");
        fired(timer).await;
        assert_eq!(Instant::now() - last, Duration::from_millis(200));
        last
    }

    #[tokio::test(start_paused = true)]
    async fn fires_a_timeout_after_the_last_frame_and_not_before() {
        let start = Instant::now();
        let mut timer = IdleTimer::new(Duration::from_millis(200));
        // Frames every 150 ms for 600 ms: never idle for 200 ms.
        for _ in 0..4 {
            tokio::time::advance(Duration::from_millis(150)).await;
            assert!(!expired(&mut timer).await);
            timer.touch();
        }
        let last = fires_200ms_after_now(&mut timer).await;
        assert_eq!(last - start, Duration::from_millis(600));
    }

    /// Frames that came before the timer was first polled count: its first
    /// wait starts at the last of them.
    #[tokio::test(start_paused = true)]
    async fn frames_before_the_first_wait_count() {
        let mut timer = IdleTimer::new(Duration::from_millis(200));
        tokio::time::advance(Duration::from_millis(150)).await;
        timer.touch();
        fires_200ms_after_now(&mut timer).await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_answer_times_out_from_the_start() {
        let start = Instant::now();
        let mut timer = IdleTimer::new(Duration::from_secs(3));
        fired(&mut timer).await;
        assert_eq!(Instant::now() - start, Duration::from_secs(3));
        assert!(expired(&mut timer).await, "stays expired");
    }
}

//! Sub-millisecond wake-ups for the real-time driver.
//!
//! tokio's timers have a one-millisecond resolution: a step that ends 3.6 ms
//! after the previous one is seen at the next whole millisecond, so at a few
//! milliseconds a step the gaps between tokens came out as 3 and 4 ms, their
//! median a whole millisecond, and about half a millisecond above the cost
//! model's. A [`Wake`] leaves the long part of a wait to tokio and the last
//! two milliseconds to one thread of the process, which sleeps on the
//! operating system's high-resolution timer and wakes the waiting task.
//!
//! On a paused tokio clock (tests of the simulator's virtual time) the
//! thread would wait in real time for instants the runtime never reaches,
//! so there a [`Wake`] is a plain tokio sleep.

use std::sync::OnceLock;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

/// What is left to the precise thread at the end of a wait.
const FINE: Duration = Duration::from_millis(2);

type Request = (std::time::Instant, oneshot::Sender<()>);

/// How the driver waits for an instant.
#[derive(Debug, Clone, Copy)]
pub struct Wake {
    precise: bool,
}

impl Wake {
    /// Precise on a running clock, tokio's own on a paused one.
    pub fn for_current_clock() -> Self {
        Self {
            precise: !clock_is_paused(),
        }
    }

    /// Waits until `at`; forever when there is nothing to wait for.
    pub async fn until(self, at: Option<Instant>) {
        match at {
            None => std::future::pending().await,
            Some(at) if !self.precise => tokio::time::sleep_until(at).await,
            Some(at) => precise_until(at).await,
        }
    }
}

async fn precise_until(at: Instant) {
    if let Some(coarse) = at.checked_sub(FINE)
        && coarse > Instant::now()
    {
        tokio::time::sleep_until(coarse).await;
    }
    let (tx, rx) = oneshot::channel();
    if timer().send((at.into_std(), tx)).is_err() || rx.await.is_err() {
        tokio::time::sleep_until(at).await;
    }
}

/// A paused clock does not move while the runtime is not polled.
fn clock_is_paused() -> bool {
    let before = Instant::now();
    std::thread::sleep(Duration::from_micros(20));
    Instant::now() == before
}

/// The process's timer thread, started on first use.
fn timer() -> &'static mpsc::Sender<Request> {
    static TIMER: OnceLock<mpsc::Sender<Request>> = OnceLock::new();
    TIMER.get_or_init(|| {
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("replica-sim-timer".into())
            .spawn(move || run(rx))
            .expect("the timer thread starts");
        tx
    })
}

/// Fires each request at its instant. A request whose waiter went away
/// (the driver's `select!` dropped the wait) is dropped as it is found.
fn run(requests: mpsc::Receiver<Request>) {
    let mut pending: Vec<Request> = Vec::new();
    loop {
        let now = std::time::Instant::now();
        for (_, tx) in pending.extract_if(.., |(at, tx)| *at <= now || tx.is_closed()) {
            let _ = tx.send(());
        }
        let next = pending.iter().map(|r| r.0).min();
        let got = match next {
            Some(t) => match requests.recv_timeout(t.saturating_duration_since(now)) {
                Ok(r) => Some(r),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            },
            None => match requests.recv() {
                Ok(r) => Some(r),
                Err(_) => return,
            },
        };
        pending.extend(got);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_running_clock_goes_through_the_thread_and_never_wakes_early() {
        let wake = Wake::for_current_clock();
        assert!(wake.precise);
        // Not a wall-time bound on the machine: the wait may end late under
        // load, but never early, and a late timer thread cannot lose it.
        for micros in [300, 1_700, 3_600] {
            let at = Instant::now() + Duration::from_micros(micros);
            wake.until(Some(at)).await;
            assert!(Instant::now() >= at);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_paused_clock_keeps_tokio_timers() {
        let wake = Wake::for_current_clock();
        assert!(!wake.precise);
        let at = Instant::now() + Duration::from_secs(3_600);
        wake.until(Some(at)).await;
        assert!(Instant::now() >= at);
    }

    #[tokio::test]
    async fn a_dropped_wait_leaves_the_others() {
        let wake = Wake::for_current_clock();
        let soon = Instant::now() + Duration::from_micros(1_900);
        let dropped = tokio::spawn(wake.until(Some(soon)));
        tokio::task::yield_now().await;
        dropped.abort();
        let near = Instant::now() + Duration::from_micros(500);
        wake.until(Some(near)).await;
        assert!(Instant::now() >= near);
    }
}

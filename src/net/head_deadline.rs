//! The first-byte timeout of an upstream connection, kept by the task that
//! drives the connection instead of by a timer per request.
//!
//! A request sets the time by which its response head must arrive (one
//! atomic store) and clears it when the head is in. The connection's task
//! keeps one `Sleep` that never runs later than the deadline set: while
//! requests follow each other on the connection, it stays at an earlier
//! request's deadline and is moved only when it fires (at most once per
//! timeout's length), so a request puts nothing into tokio's timer wheel.
//! When a deadline passes with no head, the task marks the connection
//! timed out and drops it: the request in flight fails, and the replica
//! sees the connection close and stops its work.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};

const NONE: u64 = u64::MAX;

/// What a connection's requests and its task share.
#[derive(Debug)]
pub struct HeadDeadline {
    /// The connection's start, the origin of `due_ms`.
    base: Instant,
    /// Milliseconds after `base` by which the response head must be in;
    /// `NONE` while no request waits for one.
    due_ms: AtomicU64,
    /// The task closed the connection at a deadline.
    expired: AtomicBool,
}

impl HeadDeadline {
    pub fn new() -> HeadDeadline {
        HeadDeadline {
            base: Instant::now(),
            due_ms: AtomicU64::new(NONE),
            expired: AtomicBool::new(false),
        }
    }

    /// A request is sent now; its head is due within `limit`.
    pub fn set(&self, limit: Duration) {
        let due = self.base.elapsed().saturating_add(limit).as_millis();
        self.due_ms
            .store(u64::try_from(due).unwrap_or(NONE - 1), Ordering::Relaxed);
    }

    /// The head is in.
    pub fn clear(&self) {
        self.due_ms.store(NONE, Ordering::Relaxed);
    }

    /// The connection was closed because a head was late.
    pub fn expired(&self) -> bool {
        self.expired.load(Ordering::Relaxed)
    }
}

impl Default for HeadDeadline {
    fn default() -> Self {
        HeadDeadline::new()
    }
}

/// The connection task's side: its one timer.
pub struct Watch {
    sleep: Option<Pin<Box<Sleep>>>,
    /// The deadline (`due_ms`) last looked at, with the timer set no later.
    seen: u64,
}

impl Default for Watch {
    fn default() -> Self {
        Watch {
            sleep: None,
            seen: NONE,
        }
    }
}

impl Watch {
    /// Whether a deadline set on `head` has passed; otherwise the task is
    /// woken by the time it may have.
    pub fn poll_expired(&mut self, head: &HeadDeadline, cx: &mut Context<'_>) -> bool {
        let ms = head.due_ms.load(Ordering::Relaxed);
        if ms == NONE {
            // Nothing waits; a timer still set only wakes the task once.
            return false;
        }
        // The task is polled a few times per request: the same deadline
        // with the timer not fired needs nothing more.
        if ms == self.seen && self.sleep.as_ref().is_some_and(|s| !s.is_elapsed()) {
            return false;
        }
        self.seen = ms;
        let due = head.base + Duration::from_millis(ms);
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
        if sleep.deadline() > due {
            sleep.as_mut().reset(due);
        } else if sleep.deadline() < due && !sleep.is_elapsed() {
            // Set (and polled, so registered) for an earlier request's
            // deadline: it fires first, and is moved on then.
            return false;
        }
        loop {
            match sleep.as_mut().poll(cx) {
                Poll::Pending => return false,
                // The timer is at or before `due`: the head is late when
                // it was set for `due` itself.
                Poll::Ready(()) if sleep.deadline() >= due => {
                    head.expired.store(true, Ordering::Relaxed);
                    return true;
                }
                Poll::Ready(()) => sleep.as_mut().reset(due),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn expired(watch: &mut Watch, head: &HeadDeadline) -> bool {
        std::future::poll_fn(|cx| Poll::Ready(watch.poll_expired(head, cx))).await
    }

    async fn wait_expired(watch: &mut Watch, head: &HeadDeadline) {
        std::future::poll_fn(|cx| match watch.poll_expired(head, cx) {
            true => Poll::Ready(()),
            false => Poll::Pending,
        })
        .await
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_late_by_the_limit_expires_the_connection_then() {
        let head = HeadDeadline::new();
        let mut watch = Watch::default();
        let start = Instant::now();
        head.set(Duration::from_secs(5));
        wait_expired(&mut watch, &head).await;
        assert_eq!(start.elapsed(), Duration::from_secs(5));
        assert!(head.expired());
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_expires_while_no_request_waits() {
        let head = HeadDeadline::new();
        let mut watch = Watch::default();
        assert!(!expired(&mut watch, &head).await);
        tokio::time::advance(Duration::from_secs(3600)).await;
        assert!(!expired(&mut watch, &head).await);
        head.set(Duration::from_secs(5));
        head.clear();
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(!expired(&mut watch, &head).await);
        assert!(!head.expired());
    }

    #[tokio::test(start_paused = true)]
    async fn requests_in_time_one_after_another_never_expire_it() {
        let head = HeadDeadline::new();
        let mut watch = Watch::default();
        // Each request waits 2 s for its head, within a 5 s limit; the
        // timer set for the first fires and moves on to the later ones.
        for _ in 0..10 {
            head.set(Duration::from_secs(5));
            assert!(!expired(&mut watch, &head).await);
            tokio::time::advance(Duration::from_secs(2)).await;
            assert!(!expired(&mut watch, &head).await);
            head.clear();
        }
        assert!(!head.expired());
    }

    #[tokio::test(start_paused = true)]
    async fn a_late_head_after_timely_ones_expires_at_its_own_deadline() {
        let head = HeadDeadline::new();
        let mut watch = Watch::default();
        head.set(Duration::from_secs(5));
        assert!(!expired(&mut watch, &head).await);
        tokio::time::advance(Duration::from_secs(4)).await;
        head.clear();
        // The next request is sent at 4 s: due at 9 s, not at 5 s.
        let sent = Instant::now();
        head.set(Duration::from_secs(5));
        wait_expired(&mut watch, &head).await;
        assert_eq!(sent.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn a_shorter_limit_after_a_longer_one_is_kept() {
        let head = HeadDeadline::new();
        let mut watch = Watch::default();
        head.set(Duration::from_secs(60));
        assert!(!expired(&mut watch, &head).await);
        head.clear();
        let sent = Instant::now();
        head.set(Duration::from_secs(1));
        wait_expired(&mut watch, &head).await;
        assert_eq!(sent.elapsed(), Duration::from_secs(1));
    }
}

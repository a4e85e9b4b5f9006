//! Live state of one replica: identity, weight, in-flight count and passive health.
//!
//! Everything mutable is an atomic so the request path never takes a lock.
//! The in-flight count is held by an RAII [`InFlightGuard`] that travels inside
//! the response body and is released at end of stream or when the client goes away.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use prometheus::IntGauge;

use crate::telemetry::clock::now_millis;

/// Process-unique identity of a replica, stable across config reloads while the
/// replica stays in the config.
pub type ReplicaId = u64;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

#[derive(Debug)]
pub struct Replica {
    pub id: ReplicaId,
    /// Label for metrics and logs (`host:port` unless configured).
    pub name: String,
    /// `host:port` used to build upstream URIs.
    pub authority: http::uri::Authority,
    pub weight: u32,
    /// Concurrency limit when the pool queues (`max_inflight`).
    pub max_inflight: Option<u32>,
    in_flight: AtomicU64,
    consecutive_failures: AtomicU32,
    /// Milliseconds on the process clock until which the replica is set aside (0 = eligible).
    down_until_ms: AtomicU64,
    in_flight_gauge: IntGauge,
}

impl Replica {
    pub fn new(
        name: String,
        authority: http::uri::Authority,
        weight: u32,
        in_flight_gauge: IntGauge,
    ) -> Replica {
        Replica {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            name,
            authority,
            weight,
            max_inflight: None,
            in_flight: AtomicU64::new(0),
            consecutive_failures: AtomicU32::new(0),
            down_until_ms: AtomicU64::new(0),
            in_flight_gauge,
        }
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Sets the concurrency limit (builder style, before sharing).
    pub fn with_limit(mut self, max_inflight: Option<u32>) -> Replica {
        self.max_inflight = max_inflight;
        self
    }

    /// Whether the replica is under its concurrency limit (always, without one).
    pub fn has_free_slot(&self) -> bool {
        self.max_inflight
            .is_none_or(|limit| self.in_flight() < u64::from(limit))
    }

    /// Counts one more request in flight until the guard is dropped.
    pub fn acquire(self: &Arc<Self>) -> InFlightGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.in_flight_gauge.inc();
        InFlightGuard {
            replica: Arc::clone(self),
        }
    }

    /// Whether the replica may receive new work now.
    pub fn is_eligible(&self) -> bool {
        self.is_eligible_at(now_millis())
    }

    pub fn is_eligible_at(&self, now_ms: u64) -> bool {
        self.down_until_ms.load(Ordering::Relaxed) <= now_ms
    }

    /// Records a connection failure; returns true when this failure set the replica aside.
    pub fn record_failure(&self, threshold: u32, cooldown: Duration) -> bool {
        let n = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if n >= threshold {
            let until = now_millis() + cooldown.as_millis() as u64;
            let before = self.down_until_ms.swap(until, Ordering::Relaxed);
            // After the cooldown one more failure sets it aside again at once.
            self.consecutive_failures
                .store(threshold.saturating_sub(1), Ordering::Relaxed);
            return before <= now_millis();
        }
        false
    }

    /// Records a request that reached the replica and got an answer.
    pub fn record_success(&self) {
        self.consecutive_failures.store(0, Ordering::Relaxed);
        self.down_until_ms.store(0, Ordering::Relaxed);
    }

    /// Whether the replica is currently set aside by passive health.
    pub fn is_down(&self) -> bool {
        !self.is_eligible()
    }
}

/// One unit of in-flight load on a replica, released on drop.
#[derive(Debug)]
pub struct InFlightGuard {
    replica: Arc<Replica>,
}

impl InFlightGuard {
    pub fn replica(&self) -> &Arc<Replica> {
        &self.replica
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.replica.in_flight.fetch_sub(1, Ordering::Relaxed);
        self.replica.in_flight_gauge.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica() -> Arc<Replica> {
        Arc::new(Replica::new(
            "r".into(),
            "127.0.0.1:1".parse().unwrap(),
            1,
            IntGauge::new("g", "g").unwrap(),
        ))
    }

    #[test]
    fn guard_counts_and_releases() {
        let r = replica();
        let a = r.acquire();
        let b = r.acquire();
        assert_eq!(r.in_flight(), 2);
        drop(a);
        assert_eq!(r.in_flight(), 1);
        drop(b);
        assert_eq!(r.in_flight(), 0);
    }

    #[test]
    fn failures_set_aside_then_success_restores() {
        let r = replica();
        let cooldown = Duration::from_secs(60);
        assert!(!r.record_failure(3, cooldown));
        assert!(!r.record_failure(3, cooldown));
        assert!(r.is_eligible());
        assert!(r.record_failure(3, cooldown));
        assert!(!r.is_eligible());
        r.record_success();
        assert!(r.is_eligible());
    }
}

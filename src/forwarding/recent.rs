//! The last few dispatch decisions, for the status page: a bounded ring
//! buffer of [`Dispatch`] records (time, pool, replica, balancer branch,
//! routing branches, outcome), newest last.
//!
//! Each record holds only names and labels llmlb chose itself: never an API
//! key, a tenant, a header or any prompt text.
//!
//! Cost: one short `Mutex<VecDeque>` push per dispatch attempt and one update
//! when the replica answers (or fails). The lock is never held across an
//! `.await` or while formatting anything; the strings are built before it is
//! taken. A poisoned lock is taken over (the data is only a display aid).
//! Contention is two pointer-sized critical sections per request, far below
//! the cost of the upstream round trip; `/admin/status` copies the buffer
//! under the same lock once a second.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

/// How many dispatches the status page shows.
pub const DEFAULT_CAPACITY: usize = 50;

/// One dispatch attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatch {
    /// Sequence number, increasing from 1 per process.
    pub seq: u64,
    /// Wall-clock time of the decision, in Unix milliseconds.
    pub at_unix_ms: u64,
    pub pool: Arc<str>,
    pub replica: Arc<str>,
    /// The balancer's branch (`least_loaded`, `stale_fallback`, ...).
    pub balancer_branch: &'static str,
    /// The routing stage's branches, joined (`canary,prefix_hit`; empty when
    /// none acted).
    pub route: String,
    /// 1 for the first try, 2 for the first retry, ...
    pub attempt: u32,
    /// The replica's HTTP status, or `connect`/`reset`/`timeout`; `None`
    /// while waiting for the answer.
    pub outcome: Option<String>,
}

/// A bounded ring of the latest dispatches.
#[derive(Debug)]
pub struct RecentDispatches {
    capacity: usize,
    next_seq: AtomicU64,
    ring: Mutex<VecDeque<Dispatch>>,
}

impl Default for RecentDispatches {
    fn default() -> Self {
        RecentDispatches::new(DEFAULT_CAPACITY)
    }
}

impl RecentDispatches {
    /// A ring keeping at most `capacity` records (at least 1).
    pub fn new(capacity: usize) -> RecentDispatches {
        let capacity = capacity.max(1);
        RecentDispatches {
            capacity,
            next_seq: AtomicU64::new(1),
            ring: Mutex::new(VecDeque::with_capacity(capacity)),
        }
    }

    /// Records a decision (outcome not yet known); returns its sequence
    /// number for [`RecentDispatches::settle`]. The oldest record goes when
    /// the ring is full.
    pub fn record(
        &self,
        pool: Arc<str>,
        replica: Arc<str>,
        balancer_branch: &'static str,
        route: String,
        attempt: u32,
    ) -> u64 {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        let entry = Dispatch {
            seq,
            at_unix_ms: unix_ms(),
            pool,
            replica,
            balancer_branch,
            route,
            attempt,
            outcome: None,
        };
        let evicted = {
            let mut ring = self.lock();
            let evicted = if ring.len() >= self.capacity {
                ring.pop_front()
            } else {
                None
            };
            ring.push_back(entry);
            evicted
        };
        drop(evicted); // freed outside the lock
        seq
    }

    /// Sets the outcome of dispatch `seq`, if it is still in the ring.
    pub fn settle(&self, seq: u64, outcome: String) {
        let mut ring = self.lock();
        // Recent entries are at the back; the one sought is almost always last.
        if let Some(d) = ring.iter_mut().rev().find(|d| d.seq == seq) {
            d.outcome = Some(outcome);
        }
    }

    /// A copy of the ring, newest first.
    pub fn newest_first(&self) -> Vec<Dispatch> {
        self.lock().iter().rev().cloned().collect()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    fn lock(&self) -> MutexGuard<'_, VecDeque<Dispatch>> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn push(r: &RecentDispatches, replica: &str) -> u64 {
        r.record(
            Arc::from("pool"),
            Arc::from(replica),
            "least_loaded",
            "prefix_hit".into(),
            1,
        )
    }

    #[test]
    fn keeps_only_the_newest_up_to_capacity() {
        let r = RecentDispatches::new(3);
        for i in 0..10 {
            push(&r, &format!("r{i}"));
        }
        let all = r.newest_first();
        assert_eq!(all.len(), 3);
        let names: Vec<&str> = all.iter().map(|d| &*d.replica).collect();
        assert_eq!(names, ["r9", "r8", "r7"]);
        assert_eq!(all[0].seq, 10);
        assert!(all.iter().all(|d| d.outcome.is_none()));
    }

    #[test]
    fn settle_sets_the_outcome_of_that_dispatch_only() {
        let r = RecentDispatches::new(4);
        let a = push(&r, "a");
        let b = push(&r, "b");
        r.settle(a, "connect".into());
        r.settle(b, "200".into());
        let all = r.newest_first();
        assert_eq!(all[0].outcome.as_deref(), Some("200"));
        assert_eq!(all[1].outcome.as_deref(), Some("connect"));
    }

    #[test]
    fn settling_an_evicted_dispatch_is_a_no_op() {
        let r = RecentDispatches::new(1);
        let old = push(&r, "old");
        push(&r, "new");
        r.settle(old, "200".into());
        let all = r.newest_first();
        assert_eq!(all.len(), 1);
        assert_eq!(&*all[0].replica, "new");
        assert_eq!(all[0].outcome, None);
    }

    #[test]
    fn zero_capacity_keeps_one() {
        let r = RecentDispatches::new(0);
        push(&r, "a");
        push(&r, "b");
        assert_eq!(r.capacity(), 1);
        assert_eq!(r.newest_first().len(), 1);
    }
}

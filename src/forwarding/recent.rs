//! The last few dispatch decisions, for the status page: a bounded ring
//! buffer of [`Dispatch`] records (time, pool, replica, balancer branch,
//! routing branches, outcome), newest last.
//!
//! Each record holds only names and labels llmlb chose itself: never an API
//! key, a tenant, a header or any prompt text.
//!
//! Cost: the ring is a fixed array of slots; a dispatch takes the next
//! sequence number (one atomic add) and puts its record, built before, into
//! slot `seq % capacity` under that slot's own lock (held for a move; two
//! requests meet on a slot only when 50 dispatches go by between them, the
//! status page once a second). An `ArcSwap` store in its place cost about
//! 0.5 k instructions a request (a store settles every thread's pending
//! loads) and an allocation. The outcome is one compare-and-swap on the
//! slot's outcome word, which names the sequence number it belongs to, so
//! an outcome never lands on a newer record that took the slot meanwhile.
//! `/admin/status` reads the slots once a second; a slot caught between its
//! record and its outcome word shows no outcome.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
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

/// How a dispatch ended, as the ring stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The replica's HTTP status.
    Status(u16),
    Connect,
    Reset,
    Timeout,
    /// Anything else (shown as `other`).
    Other,
}

impl Outcome {
    /// Outcome codes in the low 16 bits of a slot's word; 0 is "none yet".
    fn code(self) -> u64 {
        match self {
            Outcome::Status(s) => u64::from(s.clamp(1, 999)),
            Outcome::Connect => 1001,
            Outcome::Reset => 1002,
            Outcome::Timeout => 1003,
            Outcome::Other => 1004,
        }
    }

    fn from_code(code: u64) -> Option<Outcome> {
        Some(match code {
            0 => return None,
            1001 => Outcome::Connect,
            1002 => Outcome::Reset,
            1003 => Outcome::Timeout,
            1..=999 => Outcome::Status(code as u16),
            _ => Outcome::Other,
        })
    }

    fn text(self) -> String {
        match self {
            Outcome::Status(s) => s.to_string(),
            Outcome::Connect => "connect".into(),
            Outcome::Reset => "reset".into(),
            Outcome::Timeout => "timeout".into(),
            Outcome::Other => "other".into(),
        }
    }
}

impl From<&str> for Outcome {
    fn from(text: &str) -> Outcome {
        match text {
            "connect" => Outcome::Connect,
            "reset" => Outcome::Reset,
            "timeout" => Outcome::Timeout,
            _ => text.parse().map_or(Outcome::Other, Outcome::Status),
        }
    }
}

/// The sequence number's share of a slot's outcome word.
const SEQ_SHIFT: u32 = 16;
const CODE_MASK: u64 = (1 << SEQ_SHIFT) - 1;

#[derive(Debug, Default)]
struct Slot {
    record: Mutex<Option<Dispatch>>,
    /// `seq << 16 | outcome code` of the record in `record`.
    outcome: AtomicU64,
}

/// A bounded ring of the latest dispatches.
#[derive(Debug)]
pub struct RecentDispatches {
    next_seq: AtomicU64,
    slots: Box<[Slot]>,
}

impl Default for RecentDispatches {
    fn default() -> Self {
        RecentDispatches::new(DEFAULT_CAPACITY)
    }
}

impl RecentDispatches {
    /// A ring keeping at most `capacity` records (at least 1).
    pub fn new(capacity: usize) -> RecentDispatches {
        RecentDispatches {
            next_seq: AtomicU64::new(1),
            slots: (0..capacity.max(1)).map(|_| Slot::default()).collect(),
        }
    }

    /// Records a decision (outcome not yet known); returns its sequence
    /// number for [`RecentDispatches::settle`]. It takes the place of the
    /// record `capacity` dispatches older.
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
        let slot = self.slot(seq);
        slot.outcome.store(seq << SEQ_SHIFT, Ordering::Release);
        // The record it replaces is dropped after the lock.
        let _older = slot
            .record
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .replace(entry);
        seq
    }

    /// Sets the outcome of dispatch `seq`, if it is still in the ring.
    pub fn settle(&self, seq: u64, outcome: Outcome) {
        let pending = seq << SEQ_SHIFT;
        let _ = self.slot(seq).outcome.compare_exchange(
            pending,
            pending | outcome.code(),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// A copy of the ring, newest first.
    pub fn newest_first(&self) -> Vec<Dispatch> {
        let mut all: Vec<Dispatch> = self
            .slots
            .iter()
            .filter_map(|slot| {
                let mut d = slot
                    .record
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone()?;
                let word = slot.outcome.load(Ordering::Acquire);
                if word >> SEQ_SHIFT == d.seq {
                    d.outcome = Outcome::from_code(word & CODE_MASK).map(Outcome::text);
                }
                Some(d)
            })
            .collect();
        all.sort_unstable_by_key(|d| std::cmp::Reverse(d.seq));
        all
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    fn slot(&self, seq: u64) -> &Slot {
        &self.slots[(seq % self.slots.len() as u64) as usize]
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
        r.settle(a, Outcome::Connect);
        r.settle(b, Outcome::Status(200));
        let all = r.newest_first();
        assert_eq!(all[0].outcome.as_deref(), Some("200"));
        assert_eq!(all[1].outcome.as_deref(), Some("connect"));
    }

    #[test]
    fn settling_an_evicted_dispatch_is_a_no_op() {
        let r = RecentDispatches::new(1);
        let old = push(&r, "old");
        push(&r, "new");
        r.settle(old, Outcome::Status(200));
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

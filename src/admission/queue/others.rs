//! One queue order across llmlb instances: what the other instances'
//! queues of the pool hold, as the fleet store last reported it, and how it
//! bends this queue's decisions.
//!
//! - **Order**: a waiter here is *held back* while another instance has a
//!   front waiter that goes before it: a lower effective level (aging
//!   counted, each level's oldest waiter compared as [`next_level`] does
//!   here), or the same effective level and older by more than a grace (one
//!   refresh or two: the report is that stale). A held-back waiter is not
//!   granted a slot this instance holds, and it is not counted as this
//!   instance's demand ([`PoolQueue::unheld_waiting`]), so the slot's lease
//!   moves to the instance whose waiter goes first on the next refreshes.
//! - **Estimates**: the `max_wait` and deadline tests and `Retry-After`
//!   count the other instances' waiters and divide by the fleet's drain
//!   rate (the pool's whole `max_inflight` ÷ the service time), not by this
//!   instance's lease of it. The deadline test prices the share of the
//!   levels above with the fleet's admitted arrivals per second: this
//!   instance's rates plus the ones the others report
//!   ([`Drain::with_others`]).
//! - **Staleness**: a report older than its `until` (the store's instance
//!   TTL) counts as none, and the caller clears it when the store stops
//!   answering: then each instance orders its own queue only.
//!
//! [`next_level`]: super::super::refusal::next_level

use std::time::{Duration, Instant};

use super::super::estimate::{Arrivals, Drain};
use super::super::refusal::effective_level;
use super::{FairLevel, Inner, PoolQueue};

/// The other instances' side of one pool's queue.
#[derive(Debug, Clone)]
pub struct Others {
    /// Their waiters, per level.
    pub depths: Vec<usize>,
    /// Per level, when the oldest of their waiters there began waiting.
    pub fronts: Vec<Option<Instant>>,
    /// Requests they run in the pool.
    pub active: usize,
    /// The pool's slots for the whole fleet (each limited replica's
    /// `max_inflight`, summed over the eligible ones).
    pub capacity: usize,
    /// How much older a waiter of the same effective level must be to go
    /// first.
    pub grace: Duration,
    /// The report counts until then.
    pub until: Instant,
    /// Their admitted arrivals per level and second, summed.
    pub arrivals: Arrivals,
}

/// This queue's side, as an instance reports it to the others.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueState {
    pub active: usize,
    pub depths: Vec<usize>,
    /// Per level, how long its oldest waiter has waited.
    pub fronts: Vec<Option<Duration>>,
    /// Its admitted arrivals per level and second, now.
    pub arrivals: Arrivals,
}

impl PoolQueue {
    /// The other instances' report (`None`: there is none, the store is
    /// out of reach); grants what it allows now.
    pub fn set_others(&self, others: Option<Others>) {
        if let Some(next) = self.successor() {
            return next.set_others(others);
        }
        self.lock().others = others;
        self.poke();
    }

    /// What this queue holds now, for the other instances.
    pub fn state(&self, now: Instant) -> QueueState {
        if let Some(next) = self.successor() {
            return next.state(now);
        }
        let inner = self.lock();
        let now_s = self.seconds(now);
        QueueState {
            active: inner.active,
            depths: inner.waiting.iter().map(FairLevel::len).collect(),
            fronts: (inner.waiting.iter())
                .map(|q| {
                    q.oldest()
                        .map(|(since, _)| Duration::from_secs_f64((now_s - since).max(0.0)))
                })
                .collect(),
            arrivals: inner.drain.arrivals(now_s),
        }
    }

    /// The other instances' waiters per level, as this queue counts them
    /// now (empty: no live report).
    pub fn others_depths(&self, now: Instant) -> Vec<usize> {
        if let Some(next) = self.successor() {
            return next.others_depths(now);
        }
        let inner = self.lock();
        self.others(&inner, now)
            .map_or_else(Vec::new, |o| o.depths.clone())
    }

    /// Waiters here that no other instance's waiter goes before: this
    /// instance's demand for slots.
    pub fn unheld_waiting(&self, now: Instant) -> usize {
        if let Some(next) = self.successor() {
            return next.unheld_waiting(now);
        }
        let inner = self.lock();
        (inner.waiting.iter().enumerate())
            .filter(|(level, q)| {
                q.oldest()
                    .is_some_and(|(since, _)| !self.held_back(&inner, *level, since, now))
            })
            .map(|(_, q)| q.len())
            .sum()
    }

    /// The other instances' report, while it counts.
    pub(super) fn others<'a>(&self, inner: &'a Inner, now: Instant) -> Option<&'a Others> {
        inner.others.as_ref().filter(|o| now < o.until)
    }

    /// The drain the estimates price with: this queue's, with the other
    /// instances' arrival rates added while their report counts.
    pub(super) fn fleet_drain<'a>(
        &self,
        inner: &'a Inner,
        now: Instant,
    ) -> std::borrow::Cow<'a, Drain> {
        match self.others(inner, now) {
            Some(o) if !o.arrivals.rates.is_empty() => {
                std::borrow::Cow::Owned(inner.drain.with_others(&o.arrivals))
            }
            _ => std::borrow::Cow::Borrowed(&inner.drain),
        }
    }

    /// Whether a waiter here at `level` that began waiting at `since`
    /// (seconds on this queue's clock) waits for another instance's.
    pub(super) fn held_back(&self, inner: &Inner, level: usize, since: f64, now: Instant) -> bool {
        let Some(others) = self.others(inner, now) else {
            return false;
        };
        let now_s = self.seconds(now);
        let levels = &self.params.levels;
        let promote = |l: usize| levels.get(l).map_or(Duration::ZERO, |l| l.promote_after);
        let mine = effective_level(level, now_s - since, promote(level));
        let grace = others.grace.as_secs_f64();
        others.fronts.iter().enumerate().any(|(l, front)| {
            front.is_some_and(|at| {
                let theirs = self.seconds(at);
                let effective = effective_level(l, now_s - theirs, promote(l));
                effective < mine || (effective == mine && theirs + grace < since)
            })
        })
    }

    /// Whether a newcomer at `level` goes at once: a slot is free, and no
    /// waiter here or on another instance goes before it.
    pub(super) fn first_in_line(
        &self,
        inner: &Inner,
        (level, tenant): (usize, &str),
        capacity: usize,
        now: Instant,
    ) -> bool {
        let now_s = self.seconds(now);
        if self.others(inner, now).is_none() {
            return inner.free(level, tenant, capacity, now_s);
        }
        if inner.active >= capacity {
            return false;
        }
        if inner.waiting[level].holds_for(tenant, now_s) {
            return true;
        }
        let levels = &self.params.levels;
        let ahead_here = inner.waiting.iter().enumerate().any(|(l, q)| {
            q.oldest().is_some_and(|(since, _)| {
                let promote = levels.get(l).map_or(Duration::ZERO, |l| l.promote_after);
                effective_level(l, now_s - since, promote) <= level
            })
        });
        !ahead_here
            && inner.active + inner.held(now_s) < capacity
            && !self.held_back(inner, level, now_s, now)
    }

    /// The waiters per level and the slots a newcomer's estimate counts:
    /// this instance's, plus the other instances' when they report.
    pub(super) fn fleet_view(&self, inner: &Inner, capacity: usize, now: Instant) -> FleetView {
        let mut depths: Vec<usize> = inner.waiting.iter().map(FairLevel::len).collect();
        let Some(others) = self.others(inner, now) else {
            return FleetView {
                depths,
                capacity,
                remote_active: 0,
            };
        };
        for (d, o) in depths.iter_mut().zip(&others.depths) {
            *d += o;
        }
        FleetView {
            depths,
            capacity: capacity.max(others.capacity),
            remote_active: others.active,
        }
    }
}

/// The queue as the fleet holds it, for a newcomer's estimate.
#[derive(Debug, Clone)]
pub(super) struct FleetView {
    pub depths: Vec<usize>,
    pub capacity: usize,
    /// Requests the other instances run: their slots' ages are unknown
    /// here and are taken to be like this instance's.
    pub remote_active: usize,
}

/// The ages of the requests holding slots here, followed by as many for
/// the other instances' (`remote`), taken in turn from this instance's.
pub(super) fn fleet_ages(ages: Vec<f64>, remote: usize) -> Vec<f64> {
    if remote == 0 {
        return ages;
    }
    let mut all = ages.clone();
    all.extend((0..remote).map(|i| ages.get(i % ages.len().max(1)).copied().unwrap_or(0.0)));
    all
}

#[cfg(test)]
mod tests {
    use super::super::{Admit, Level, QueueParams};
    use super::*;
    use crate::admission::fair::FairParams;
    use std::sync::Arc;

    fn queue(capacity: usize) -> Arc<PoolQueue> {
        let level = |name: &str| Level {
            name: name.into(),
            max_wait: Duration::from_secs(10),
            promote_after: Duration::from_secs(3600),
            ttft_objective: None,
        };
        PoolQueue::new(
            QueueParams {
                prefix_handoff: Duration::ZERO,
                levels: vec![level("high"), level("low")],
                max_depth: 100,
                fair: FairParams::default(),
            },
            Box::new(move || capacity),
        )
    }

    /// The other instances hold `depths` waiters, the oldest of each level
    /// having waited `waited`.
    fn others(depths: [usize; 2], waited: [Option<u64>; 2], capacity: usize) -> Others {
        let now = Instant::now();
        Others {
            depths: depths.to_vec(),
            fronts: (waited.iter())
                .map(|w| w.map(|ms| now - Duration::from_millis(ms)))
                .collect(),
            active: 0,
            capacity,
            grace: Duration::from_millis(100),
            until: now + Duration::from_secs(60),
            arrivals: Arrivals::default(),
        }
    }

    fn admit(q: &PoolQueue, level: usize) -> Admit {
        q.admit(level, Instant::now(), Duration::ZERO)
    }

    #[test]
    fn a_freed_slot_waits_for_a_higher_waiter_elsewhere() {
        let q = queue(1);
        let Admit::Now(running) = admit(&q, 1) else {
            panic!("a free slot")
        };
        let Admit::Wait(mut low) = admit(&q, 1) else {
            panic!("queued")
        };
        q.set_others(Some(others([1, 0], [Some(0), None], 4)));
        assert_eq!(
            q.unheld_waiting(Instant::now()),
            0,
            "not this instance's demand"
        );
        drop(running);
        assert!(
            low.rx.try_recv().is_err(),
            "held back for the other's high waiter"
        );
        assert_eq!(q.active(), 0);
        // The other's waiter was served: the slot goes to ours.
        q.set_others(Some(others([0, 0], [None, None], 4)));
        low.rx
            .try_recv()
            .expect("granted once nothing goes before it");
    }

    #[test]
    fn a_newcomer_goes_at_once_only_when_nothing_elsewhere_goes_first() {
        let q = queue(2);
        // The other instance has an old low waiter and a fresh high one.
        q.set_others(Some(others([1, 1], [Some(0), Some(5000)], 4)));
        let low = admit(&q, 1);
        assert!(matches!(low, Admit::Wait(_)), "low waits");
        // High: the other's high waiter is not older by the grace: a tie.
        let high = admit(&q, 0);
        assert!(matches!(high, Admit::Now(_)), "high goes");
        // An older high waiter elsewhere goes first.
        q.set_others(Some(others([1, 1], [Some(500), Some(5000)], 4)));
        let later = admit(&q, 0);
        assert!(matches!(later, Admit::Wait(_)));
        assert_eq!(q.active(), 1, "a slot stays free for the other's waiter");
        // A report past its time counts as none.
        let mut stale = others([1, 1], [Some(500), Some(5000)], 4);
        stale.until = Instant::now() - Duration::from_millis(1);
        q.set_others(Some(stale));
        assert_eq!(q.depths(), vec![0, 1], "the high waiter took the free slot");
        assert_eq!(q.unheld_waiting(Instant::now()), 1);
    }

    #[test]
    fn estimates_count_the_fleets_waiters_and_slots() {
        let q = queue(1);
        // One request held 1 s: 1 req/s per slot.
        let Admit::Now(mut p) = q.admit(1, Instant::now() - Duration::from_secs(1), Duration::ZERO)
        else {
            panic!("a free slot")
        };
        p.served();
        drop(p);
        let _running = admit(&q, 1);
        let alone = q.backlog_drain_time();
        // Twelve waiters elsewhere, and the fleet has 2 slots.
        q.set_others(Some(others([0, 12], [None, Some(0)], 2)));
        let fleet = q.backlog_drain_time();
        assert!(fleet > alone * 5, "{fleet:?} against {alone:?}");
        // 13 ahead at 2 req/s: 6.5 s, within the 10 s max_wait; 25: not.
        assert!(matches!(admit(&q, 1), Admit::Wait(_)));
        q.set_others(Some(others([0, 24], [None, Some(0)], 2)));
        assert!(matches!(
            admit(&q, 1),
            Admit::Refused(super::super::Refusal::OverObjective { .. })
        ));
        // A high request goes before all of them.
        assert!(matches!(admit(&q, 0), Admit::Wait(_)));
    }
}

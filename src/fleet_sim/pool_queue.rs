//! The pool queue on the virtual clock, for pools whose replicas have a
//! `max_inflight`: what `serve`'s queue and forwarder do together, with the
//! config's `[[priorities]]` levels.
//!
//! An arrival is admitted or refused by the same function `serve`'s queue
//! calls ([`crate::admission::refusal::refusal`]), over what this model
//! holds: the waiters per level, the slots (the `max_inflight` of the
//! replicas that may take work), the requests holding one and since when,
//! and the queue's measured [`Drain`] (the mean service time of requests a
//! replica answered, from dispatch to the last token, and each level's
//! admitted arrivals per second). It gets 429 when its level's queue is full
//! (`queue.max_depth`), when its estimated wait exceeds the level's
//! `max_wait`, or, on a level with a `ttft_objective`, when its predicted
//! time to first token (the release schedule of the slots in service plus
//! `routing::placement_ttft` on the best replica) exceeds the objective;
//! it gets 503 when it waited `queue.timeout`.
//!
//! Waiters go strictly by level, with the real queue's aging
//! ([`crate::admission::refusal::effective_level`]: one level up per
//! `promote_after` waited), and within a level by the queue's fair share
//! among tenants ([`crate::admission::fair`], with the pool's
//! `[pools.queue]` fairness settings and the config's `[[tenants]]`),
//! including its short hold of a freed slot for the tenant that freed it
//! (`anticipate`; a closed-loop client here sends its next request the
//! instant its answer ends, so a hold is always taken in time).
//!
//! Not modelled: the queue's capacity counting replicas a canary split
//! excludes (the forwarder's wait, which this is, does not).

use std::collections::HashMap;
use std::time::Duration;

use crate::admission::estimate::{Arrivals, Drain};
use crate::admission::fair::FairParams;
use crate::admission::refusal::{Standing, effective_level, lifted_ahead, refusal};
use crate::admission::{Level, Refusal};
use crate::pool::Pool;

/// The queue settings of one pool, and what it measured so far.
#[derive(Debug, Clone)]
pub struct QueueModel {
    levels: Vec<Level>,
    max_depth: usize,
    /// Seconds a request may wait before 503.
    pub timeout: f64,
    /// Per llmlb instance, its own measured drain (one without
    /// `--instances`).
    drains: Vec<Drain>,
    /// The instances share a store: each prices the higher levels' share
    /// with the fleet's arrival rates (its own and the others'), as
    /// `serve` does with `[fleet]`.
    fleet_counts: bool,
    /// When each request holding a slot was dispatched (seconds), by
    /// request index.
    started: HashMap<u32, f64>,
    /// How a level is shared among tenants.
    fair: FairParams,
    /// Seconds the next waiter may be passed for one whose prompt a free
    /// replica caches (0: never).
    pub prefix_handoff: f64,
}

impl QueueModel {
    /// The model of `pool`'s queue, when it has one.
    pub fn of(pool: &Pool) -> Option<QueueModel> {
        let admission = pool.admission.as_ref()?;
        Some(QueueModel {
            levels: admission.queue.levels().to_vec(),
            max_depth: admission.queue.max_depth(),
            timeout: admission.timeout.as_secs_f64(),
            drains: vec![Drain::default()],
            fleet_counts: false,
            started: HashMap::new(),
            fair: admission.queue.fairness().clone(),
            prefix_handoff: admission.queue.prefix_handoff().as_secs_f64(),
        })
    }

    /// `count` llmlb instances measure their own drains; with a store
    /// (`fleet_counts`) each prices with the fleet's arrival rates.
    pub fn set_instances(&mut self, count: usize, fleet_counts: bool) {
        self.drains = vec![Drain::default(); count.max(1)];
        self.fleet_counts = fleet_counts;
    }

    /// The drain instance `k` prices with at `now`: its own, with the
    /// other instances' arrival rates added when they share a store (`serve`
    /// reads them one refresh late; here at once).
    fn drain(&self, k: usize, now: f64) -> std::borrow::Cow<'_, Drain> {
        let own = &self.drains[k.min(self.drains.len() - 1)];
        if !self.fleet_counts || self.drains.len() < 2 {
            return std::borrow::Cow::Borrowed(own);
        }
        let mut others = Arrivals::default();
        for (j, d) in self.drains.iter().enumerate() {
            if j != k {
                others.add(&d.arrivals(now));
            }
        }
        std::borrow::Cow::Owned(own.with_others(&others))
    }

    /// How a level is shared among tenants.
    pub fn fairness(&self) -> &FairParams {
        &self.fair
    }

    /// Gives `tenant` the fair-share `weight` (a `--tenants` weight).
    pub fn set_weight(&mut self, tenant: &str, weight: f64) {
        let share =
            self.fair
                .tenants
                .entry(tenant.to_string())
                .or_insert(crate::admission::fair::Share {
                    weight,
                    max_depth: None,
                });
        share.weight = weight;
    }

    /// The levels' settings.
    pub fn level_settings(&self) -> &[Level] {
        &self.levels
    }

    /// Whether requests at `level` are admitted by their predicted time to
    /// first token.
    pub fn has_deadline(&self, level: usize) -> bool {
        let last = self.levels.len().saturating_sub(1);
        self.levels
            .get(level.min(last))
            .is_some_and(|l| l.ttft_objective.is_some())
    }

    /// Why a newcomer standing as `standing` at `now` on instance `k` is
    /// refused, if it is.
    pub fn refusal(&self, standing: Standing<'_>, now: f64, k: usize) -> Option<Refusal> {
        let ages = || self.started.values().map(|s| now - s).collect();
        let drain = self.drain(k, now);
        refusal(&self.levels, self.max_depth, &drain, standing, ages)
    }

    /// Whether a waiter at `waiter` that has waited `waited` seconds goes
    /// before a newcomer at `newcomer` (aging, as `serve`'s queue counts it).
    pub fn lifted_ahead(&self, newcomer: usize, waiter: usize, waited: f64) -> bool {
        lifted_ahead(&self.levels, newcomer, waiter, waited)
    }

    /// The level a waiter at `level` competes at after `waited` seconds.
    pub fn effective_level(&self, level: usize, waited: f64) -> usize {
        let promote_after = self
            .levels
            .get(level)
            .map_or(Duration::ZERO, |l| l.promote_after);
        effective_level(level, waited, promote_after)
    }

    /// The drain instance `k` measures.
    fn own(&mut self, k: usize) -> &mut Drain {
        let last = self.drains.len() - 1;
        &mut self.drains[k.min(last)]
    }

    /// Request `i` took a slot at `now`.
    pub fn granted(&mut self, i: usize, now: f64) {
        self.started.insert(i as u32, now);
    }

    /// A request at `level` was admitted (dispatched or queued) on
    /// instance `k` at `now`.
    pub fn arrived(&mut self, level: usize, now: f64, k: usize) {
        self.own(k).arrived(level, now);
    }

    /// Request `i` freed its slot.
    pub fn released(&mut self, i: usize) {
        self.started.remove(&(i as u32));
    }

    /// A request a replica answered held its slot on instance `k` for
    /// `held` seconds.
    pub fn served(&mut self, held: f64, k: usize) {
        self.own(k).served(held);
    }

    /// Priority levels.
    pub fn levels(&self) -> usize {
        self.levels.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(depth: usize, max_wait: f64, objective: Option<f64>) -> QueueModel {
        let level = |name: &str, objective: Option<f64>| Level {
            name: name.into(),
            max_wait: Duration::from_secs_f64(max_wait),
            promote_after: Duration::from_secs(5),
            ttft_objective: objective.map(Duration::from_secs_f64),
        };
        QueueModel {
            levels: vec![level("high", objective), level("low", None)],
            max_depth: depth,
            timeout: 30.0,
            drains: vec![Drain::default()],
            fleet_counts: false,
            started: HashMap::new(),
            fair: FairParams::default(),
            prefix_handoff: 0.0,
        }
    }

    fn at(level: usize, depths: &[usize], capacity: usize) -> Standing<'_> {
        Standing {
            level,
            depths,
            level_ahead: depths.get(level).copied().unwrap_or(0),
            tenant_depth: 0,
            tenant_max_depth: usize::MAX,
            promoted: 0,
            capacity,
            free: false,
            placement: Duration::from_millis(100).into(),
        }
    }

    #[test]
    fn a_full_level_refuses() {
        let q = model(2, 10.0, None);
        assert!(q.refusal(at(1, &[0, 1], 4), 0.0, 0).is_none());
        assert!(q.refusal(at(1, &[0, 2], 4), 0.0, 0).is_some());
        assert!(q.refusal(at(0, &[0, 2], 4), 0.0, 0).is_none());
    }

    #[test]
    fn the_estimated_wait_refuses_once_a_rate_is_known() {
        let mut q = model(100, 10.0, None);
        // No served request yet: only the depth bound applies.
        assert!(q.refusal(at(1, &[0, 50], 1), 0.0, 0).is_none());
        q.granted(0, 0.0);
        q.served(2.0, 0);
        q.released(0);
        // 2 s per request on 2 slots: position 10 waits 10 s, 11 waits 11 s.
        assert!(q.refusal(at(1, &[0, 9], 2), 0.0, 0).is_none());
        assert!(q.refusal(at(1, &[0, 10], 2), 0.0, 0).is_some());
        // A failed request frees its slot and teaches nothing.
        q.granted(1, 0.0);
        q.released(1);
        assert!(q.refusal(at(1, &[0, 9], 2), 0.0, 0).is_none());
    }

    #[test]
    fn a_deadline_level_reads_the_ages_of_the_slots_in_service() {
        let mut q = model(100, 3600.0, Some(2.0));
        assert!(q.has_deadline(0) && !q.has_deadline(1));
        q.granted(0, 0.0);
        q.served(3.0, 0);
        q.released(0);
        // Of four slots, two free and two taken at 0 s, held 3 s on
        // average. A newcomer is counted as needing ⌈1 + 2.33⌉ = 4
        // releases: at 0.5 s the fourth comes at 3 s, 2.5 s (+ 0.1 s
        // placement) from now: refused. At 2.5 s it comes in 0.5 s.
        q.granted(1, 0.0);
        q.granted(2, 0.0);
        assert!(q.refusal(at(0, &[0, 0], 4), 0.5, 0).is_some());
        assert!(q.refusal(at(0, &[0, 0], 4), 2.5, 0).is_none());
        assert_eq!(q.effective_level(1, 4.0), 1);
        assert_eq!(q.effective_level(1, 5.0), 0);
    }
}

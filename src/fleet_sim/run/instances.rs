//! Several llmlb instances on the virtual clock ([`crate::fleet_sim::instances`]):
//! which instance a request goes to, and with a store the lease renewals,
//! the dispatch records read back by the other instances and the one queue
//! order.

use std::time::Duration;

use tokio::sync::mpsc;

use crate::admission::refusal::effective_level;
use crate::fleet::PrefixRecord;
use crate::fleet::prefixes::POLL;
use crate::fleet_sim::SimulateError;
use crate::fleet_sim::clock::{Event, millis};
use crate::fleet_sim::decide::Decider;
use crate::fleet_sim::instances::Leases;
use crate::pool::{queue_capacity, queue_capacity_of_fleet};

use super::{RunSpec, Sim, Waiter};
use crate::admission::fair::Entry;

/// What the instances share through the store.
pub(super) struct Store {
    leases: Leases,
    /// Each instance's dispatch records, as its outbox sends them.
    records: Vec<mpsc::Receiver<PrefixRecord>>,
    /// A renewal at once is already due, per instance.
    nudged: Vec<bool>,
    /// Per instance: a waiter there was held back for another instance's
    /// since its last renewal, so that renewal gives slots back and wakes
    /// the other instances (`serve` publishes on the store's wake channel).
    gave_back: Vec<bool>,
    refresh: f64,
}

/// Instances 1.. of the run (instance 0 is the run's own decider).
pub(super) fn others(spec: &RunSpec<'_>) -> Result<Vec<Decider>, SimulateError> {
    (1..spec.instances.count.max(1))
        .map(|k| Decider::new(spec.config, spec.model, spec.seed.wrapping_add(k as u64)))
        .collect()
}

/// Instance `k` of `first` and `others`.
fn nth<'a>(first: &'a Decider, others: &'a [Decider], k: usize) -> &'a Decider {
    if k == 0 { first } else { &others[k - 1] }
}

impl Sim<'_> {
    pub(super) fn instance_count(&self) -> usize {
        1 + self.others.len()
    }

    /// The instance request `i` went to.
    pub(super) fn instance(&self, i: usize) -> &Decider {
        nth(
            &self.decider,
            &self.others,
            usize::from(self.instance_of[i]),
        )
    }

    /// Every instance.
    pub(super) fn instances(&self) -> impl Iterator<Item = &Decider> {
        std::iter::once(&self.decider).chain(&self.others)
    }

    /// Request `i` arrives at the next instance in turn.
    pub(super) fn assign_instance(&mut self, i: usize) {
        if !self.others.is_empty() {
            self.instance_of[i] = ((self.arrived - 1) % self.instance_count()) as u16;
        }
    }

    /// With a store: every instance starts without a slot (as `serve`
    /// joins), its renewals spread over the refresh interval, and its
    /// dispatch records go to the store.
    pub(super) fn start_store(&mut self) {
        let spec = self.spec.instances;
        if !spec.store {
            return;
        }
        let n = self.instance_count();
        let refresh = spec.refresh.as_secs_f64();
        let mut records = Vec::with_capacity(n);
        for k in 0..n {
            let d = nth(&self.decider, &self.others, k);
            let dropped = prometheus::IntCounter::new("dropped", "records dropped").expect("name");
            let (outbox, rx) = crate::fleet::prefixes::channel(dropped);
            d.share_prefixes(&outbox);
            records.push(rx);
            for at in 0..d.decode_replicas() {
                d.replica(at).set_fleet_cap(0);
            }
            self.queue
                .push(refresh * k as f64 / n as f64, Event::Renew(k as u32));
        }
        self.queue.push(0.0, Event::Records);
        self.store = Some(Store {
            leases: Leases::new(self.decider.decode_replicas(), n),
            records,
            nudged: vec![false; n],
            gave_back: vec![false; n],
            refresh,
        });
    }

    /// Instance `k` renews its leases at `now`; a periodic renewal sets the
    /// next one.
    pub(super) fn renew(&mut self, k: usize, now: f64, periodic: bool) {
        let more = self.work_left();
        let Some(store) = &mut self.store else {
            return;
        };
        let d = nth(&self.decider, &self.others, k);
        let spin = (millis(now) / 250) as usize;
        for at in 0..d.decode_replicas() {
            let r = d.replica(at);
            let Some(limit) = r.max_inflight else {
                continue;
            };
            let held = r.in_flight() as u32;
            let cap = (store.leases).renew(at, k, limit, held, held + r.waiting(), spin);
            if Some(cap) > r.limit() {
                self.slot_freed = true;
            }
            r.set_fleet_cap(cap);
        }
        if !periodic {
            store.nudged[k] = false;
        } else if more {
            self.queue.push(now + store.refresh, Event::Renew(k as u32));
        }
        if std::mem::take(&mut store.gave_back[k]) {
            for j in (0..store.nudged.len()).filter(|&j| j != k) {
                if !std::mem::replace(&mut store.nudged[j], true) {
                    self.queue.push(now, Event::Nudge(j as u32));
                }
            }
        }
    }

    /// A waiter on instance `k` was held back for another instance's: `k`
    /// gives the slot back at once (`serve`'s hand-back, woken by the
    /// held-back grant), and that renewal wakes the others.
    pub(super) fn held_back_on(&mut self, k: usize, now: f64) {
        if let Some(store) = &mut self.store {
            store.gave_back[k] = true;
        }
        self.nudge(k, now);
    }

    /// A request started waiting for a slot on instance `k`: with a store,
    /// the instance renews at once (as `serve`'s refresh loop is woken).
    pub(super) fn nudge(&mut self, k: usize, now: f64) {
        if let Some(store) = &mut self.store
            && !std::mem::replace(&mut store.nudged[k], true)
        {
            self.queue.push(now, Event::Nudge(k as u32));
        }
    }

    /// Every instance folds the others' dispatch records sent since the
    /// last read.
    pub(super) fn read_records(&mut self, now: f64) {
        let Some(store) = &mut self.store else {
            return;
        };
        let now_ms = millis(now);
        for k in 0..store.records.len() {
            while let Ok(record) = store.records[k].try_recv() {
                for j in (0..store.records.len()).filter(|&j| j != k) {
                    nth(&self.decider, &self.others, j).fold(&record, now_ms);
                }
            }
        }
        if self.work_left() {
            self.queue.push(now + POLL.as_secs_f64(), Event::Records);
        }
    }

    /// The requests the pool may run at once: with a store its replicas'
    /// `max_inflight`, without one each instance's own.
    pub(super) fn capacity(&self, now_ms: u64) -> usize {
        if self.store.is_some() {
            queue_capacity_of_fleet(&self.decider.pool().replicas, now_ms)
        } else {
            (self.instances())
                .map(|d| queue_capacity(&d.pool().replicas, now_ms))
                .sum()
        }
    }
}

impl Sim<'_> {
    /// With a store: whether a waiter on another instance goes before
    /// request `i` (waiting since `since`), so `i` takes no slot and counts
    /// as no demand: one at a higher effective level (aging counted), or
    /// at the same one and older by more than two refreshes, as `serve`'s
    /// shared queue order holds a local waiter back. `kept` are waiters
    /// out of the queue for now: (level, since, request).
    pub(super) fn goes_first_elsewhere(
        &self,
        i: usize,
        since: f64,
        now: f64,
        kept: &[(usize, f64, usize)],
    ) -> bool {
        let (Some(store), Some(q)) = (&self.store, &self.pool_queue) else {
            return false;
        };
        let levels = q.level_settings();
        let effective = |level: usize, since: f64| {
            let after = levels
                .get(level)
                .map_or(Duration::ZERO, |l| l.promote_after);
            effective_level(level, now - since, after)
        };
        let me = self.instance_of[i];
        let mine = effective(self.level(i), since);
        let slack = 2.0 * store.refresh;
        let queued = (self.waiting.iter().enumerate())
            .flat_map(|(l, w)| w.iter().map(move |(_, e)| (l, e.since, e.item.index)));
        let first = |(l, at, w): (usize, f64, usize)| {
            let theirs = effective(l, at);
            w != i
                && self.instance_of[w] != me
                && (theirs < mine || theirs == mine && at + slack < since)
        };
        queued.chain(kept.iter().copied()).any(first)
    }

    /// [`goes_first_elsewhere`](Self::goes_first_elsewhere) for a waiter
    /// while `kept` are out of the queue.
    pub(super) fn held_back_by_fleet<T>(
        &self,
        i: usize,
        since: f64,
        now: f64,
        kept: &[(usize, T, f64, Entry<Waiter>)],
    ) -> bool {
        let out: Vec<_> = (kept.iter())
            .map(|(l, _, _, e)| (*l, e.since, e.item.index))
            .collect();
        self.goes_first_elsewhere(i, since, now, &out)
    }
}

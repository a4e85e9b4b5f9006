//! A pool's central queue: a counting gate over the pool's capacity with
//! strict priority between levels, FIFO within a level, aging so low levels
//! never starve, and admission control by estimated wait.
//!
//! - **Capacity** is the sum of the per-replica `max_inflight` limits of the
//!   replicas that may take work, read through a callback at each decision.
//!   Each dispatched request holds one [`Permit`]; dropping it (end of
//!   stream, error, client gone) frees the slot and grants the next waiter at
//!   once: event-driven, no polling. The one exception: under fair share a
//!   slot freed by a tenant at its fair share with nothing waiting may be
//!   held a few milliseconds for that tenant's next request
//!   ([`super::fair::anticipate`]); a timer gives it on when nothing came.
//! - **Order**: each level's oldest waiter is considered with its *effective*
//!   level, `level − ⌊waited / promote_after⌋` (not below 0). The lowest
//!   effective level wins; ties go to the longest waiting. Within the
//!   winning level, the waiter comes from the tenant with the least
//!   weighted service so far ([`super::fair`], the Virtual Token Counter),
//!   or the oldest waiter with `fairness = "fifo"`.
//! - **Admission control** ([`super::estimate`]): a newcomer is refused
//!   (429) when its level is full or its tenant's share of the level is, when its estimated wait (its position ÷
//!   the drain rate measured on requests a replica answered) exceeds the
//!   level's `max_wait`, or, on a level with a `ttft_objective`, when its
//!   predicted time to first token (a high-percentile queue wait plus the
//!   placement the caller predicts) exceeds the objective. `Retry-After` is
//!   the time to drain the whole backlog at the measured rate.
//!
//! Cost: O(levels + tenants of the level) per grant under one short mutex;
//! no `.await` inside it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::estimate::{Drain, Placement};
use super::fair::{Entry, FairLevel, FairParams, TenantView, anticipate};
use super::refusal::{Standing, lifted_ahead, next_level, refusal};

mod others;
mod reload;

pub use others::{Others, QueueState};

/// Per-level settings.
#[derive(Debug, Clone)]
pub struct Level {
    pub name: String,
    /// Reject at once when the estimated wait exceeds this.
    pub max_wait: Duration,
    /// Move up one level after waiting this long.
    pub promote_after: Duration,
    /// Admit only when the predicted time to first token is within this.
    pub ttft_objective: Option<Duration>,
}

#[derive(Debug, Clone)]
pub struct QueueParams {
    pub levels: Vec<Level>,
    /// Waiters per level.
    pub max_depth: usize,
    /// Fair share among the tenants of a level.
    pub fair: FairParams,
    /// How long the waiter that goes next may be passed for one whose
    /// prompt a replica with a free slot caches (zero: never; see
    /// [`crate::admission::fair`]'s `pop_preferring`).
    pub prefix_handoff: Duration,
}

/// How much of a waiter's prompt the pool's replicas with a free slot
/// cache right now, in tokens (the most of any of them); read when a slot
/// frees, under the queue's lock.
#[derive(Clone)]
pub struct Affinity(pub Arc<dyn Fn() -> u64 + Send + Sync>);

impl std::fmt::Debug for Affinity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Affinity")
    }
}

/// Who asks for a slot: its level, its tenant and its token estimate.
#[derive(Debug, Clone)]
pub struct Claim {
    pub level: usize,
    /// The tenant it is counted to (empty: none named).
    pub tenant: Arc<str>,
    /// The prompt's tokens, as estimated before dispatch.
    pub prompt_tokens: u64,
    /// The output allowance (`max_tokens`, else the pool's default),
    /// charged when the replica reports no `usage`.
    pub output_tokens: u64,
    /// Where its prompt is cached, for the prefix handoff.
    pub affinity: Option<Affinity>,
}

impl Claim {
    /// A request at `level` of no named tenant, of no known size.
    pub fn anonymous(level: usize) -> Claim {
        Claim {
            level,
            tenant: Arc::from(""),
            prompt_tokens: 0,
            output_tokens: 0,
            affinity: None,
        }
    }
}

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Refusal {
    QueueFull {
        retry_after: Duration,
    },
    /// The tenant has its bound of waiters at the level.
    TenantFull {
        retry_after: Duration,
    },
    OverObjective {
        /// The estimate that missed; `None`: no request served yet to
        /// estimate a wait from.
        estimated: Option<Duration>,
        retry_after: Duration,
    },
}

/// The outcome of [`PoolQueue::admit`].
#[derive(Debug)]
pub enum Admit {
    Now(Permit),
    Wait(Ticket),
    Refused(Refusal),
}

pub type Capacity = Box<dyn Fn() -> usize + Send + Sync>;

pub struct PoolQueue {
    me: Weak<PoolQueue>,
    params: QueueParams,
    /// Where the fair-share structures' seconds count from.
    origin: Instant,
    capacity: arc_swap::ArcSwap<Capacity>,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for PoolQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolQueue")
            .field("params", &self.params)
            .finish()
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// Per level, its waiters by tenant.
    waiting: Vec<FairLevel<Waiter>>,
    active: usize,
    next_id: u64,
    /// When each permit held now was handed out, by permit id.
    started: HashMap<u64, Instant>,
    /// The measured service time and the levels' shares of the slots.
    drain: Drain,
    /// The queue that replaced this one on a reload that changed its shape:
    /// admissions, cancellations and releases go there.
    successor: Option<Arc<PoolQueue>>,
    /// The other llmlb instances' side of the pool's queue (`[fleet]`).
    others: Option<Others>,
}

impl Inner {
    /// Slots held for a tenant's next request at `now`.
    fn held(&self, now: f64) -> usize {
        self.waiting.iter().map(|l| l.held(now)).sum()
    }

    /// Whether a newcomer of `tenant` at `level` would be dispatched at
    /// once: a slot is held for it, or one is free (not held) and nobody
    /// waits.
    fn free(&self, level: usize, tenant: &str, capacity: usize, now: f64) -> bool {
        if self.active >= capacity {
            return false;
        }
        let queued: usize = self.waiting.iter().map(FairLevel::len).sum();
        self.waiting[level].holds_for(tenant, now)
            || (queued == 0 && self.active + self.held(now) < capacity)
    }
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    tx: oneshot::Sender<Permit>,
    prompt_tokens: u64,
    output_tokens: u64,
    affinity: Option<Affinity>,
}

/// A place in the queue; resolves to a [`Permit`] when granted.
#[derive(Debug)]
pub struct Ticket {
    pub id: u64,
    pub level: usize,
    pub since: Instant,
    pub rx: oneshot::Receiver<Permit>,
}

/// One dispatched request's slot. Dropping it frees the slot.
#[derive(Debug)]
pub struct Permit {
    queue: Arc<PoolQueue>,
    id: u64,
    since: Instant,
    /// Level the request was admitted at.
    pub level: usize,
    /// A replica answered: the hold time counts toward the service time.
    served: bool,
    /// The tenant its service is counted to.
    pub tenant: Arc<str>,
    /// The prompt's tokens charged at dispatch, and the output allowance.
    estimate: (u64, u64),
    /// The tokens the replica reported (prompt, output), when it did.
    reported: Option<(u64, u64)>,
    /// Where the tenant's weighted tokens are counted when the slot frees.
    service: Option<prometheus::Counter>,
}

impl Permit {
    /// Marks the request as answered by a replica (a success status), so
    /// the time it holds its slot teaches the queue its drain rate.
    pub fn served(&mut self) {
        self.served = true;
    }

    /// The tokens the replica's `usage` reported: the tenant's service is
    /// corrected with them when the slot frees.
    pub fn report_usage(&mut self, prompt: u64, output: u64) {
        self.reported = Some((prompt, output));
    }

    /// Counts the request's weighted tokens on `counter` when the slot frees.
    pub fn count_service(&mut self, counter: prometheus::Counter) {
        self.service = Some(counter);
    }

    /// Tokens to charge the tenant when the slot frees, on top of the
    /// prompt charged at dispatch: the reported output and the prompt's
    /// correction; else the output allowance for an answered request, and
    /// the prompt refunded for one no replica answered.
    fn end_charge(&self, prompt_weight: f64) -> f64 {
        let (prompt, output) = self.estimate;
        match self.reported {
            Some((p, o)) => prompt_weight * (p as f64 - prompt as f64) + o as f64,
            None if self.served => output as f64,
            None => -prompt_weight * prompt as f64,
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let held = self.served.then(|| self.since.elapsed());
        let prompt_weight = self.queue.params.fair.prompt_weight;
        let charge = self.end_charge(prompt_weight);
        let total = (prompt_weight * self.estimate.0 as f64 + charge).max(0.0);
        if let Some(counter) = &self.service {
            counter.inc_by(total);
        }
        let charges = (charge, total);
        self.queue
            .release(held, self.id, self.level, &self.tenant, charges);
    }
}

impl PoolQueue {
    pub fn new(params: QueueParams, capacity: Capacity) -> Arc<PoolQueue> {
        PoolQueue::counting_from(params, capacity, Instant::now())
    }

    /// A queue whose waiters' arrivals count from `origin` (a successor
    /// keeps its predecessor's).
    fn counting_from(params: QueueParams, capacity: Capacity, origin: Instant) -> Arc<PoolQueue> {
        let levels = params.levels.len().max(1);
        Arc::new_cyclic(|me| PoolQueue {
            me: me.clone(),
            params,
            origin,
            capacity: arc_swap::ArcSwap::from_pointee(capacity),
            inner: Mutex::new(Inner {
                waiting: (0..levels).map(|_| FairLevel::default()).collect(),
                ..Inner::default()
            }),
        })
    }

    pub fn levels(&self) -> &[Level] {
        &self.params.levels
    }

    /// The prefix handoff's bound ([`QueueParams::prefix_handoff`]; zero:
    /// off).
    pub fn prefix_handoff(&self) -> Duration {
        self.params.prefix_handoff
    }

    /// Waiters allowed per level.
    pub fn max_depth(&self) -> usize {
        self.params.max_depth
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a request at `level` of no named tenant now, queues it, or
    /// refuses it (see [`PoolQueue::admit_claim`]).
    pub fn admit(&self, level: usize, now: Instant, placement: impl Into<Placement>) -> Admit {
        self.admit_claim(Claim::anonymous(level), now, placement)
    }

    /// Admits `claim` now, queues it, or refuses it. `placement` is its
    /// predicted time to first token once dispatched (read only on a level
    /// with a `ttft_objective`).
    pub fn admit_claim(
        &self,
        claim: Claim,
        now: Instant,
        placement: impl Into<Placement>,
    ) -> Admit {
        let placement = placement.into();
        if let Some(next) = self.successor() {
            return next.admit_claim(claim, now, placement);
        }
        let level = claim.level.min(self.params.levels.len().saturating_sub(1));
        let capacity = (self.capacity.load())();
        let mut inner = self.lock();
        let free = self.first_in_line(&inner, (level, &claim.tenant), capacity, now);
        let now_s = self.seconds(now);
        let standing = (level, &*claim.tenant, capacity, free);
        if let Some(refusal) = self.refusal(&inner, standing, placement, now) {
            return Admit::Refused(refusal);
        }
        inner.drain.arrived(level, now_s);
        let weight = self.params.fair.weight(&claim.tenant);
        if free {
            inner.waiting[level].take_hold(&claim.tenant, now_s);
            let estimate = (claim.prompt_tokens, claim.output_tokens);
            return Admit::Now(self.permit(&mut inner, level, claim.tenant, weight, estimate, now));
        }
        let (tx, rx) = oneshot::channel();
        let id = inner.next_id;
        inner.next_id += 1;
        let since = now_s;
        let waiter = Waiter {
            id,
            tx,
            prompt_tokens: claim.prompt_tokens,
            output_tokens: claim.output_tokens,
            affinity: claim.affinity,
        };
        inner.waiting[level].push(&claim.tenant, weight, since, waiter);
        Admit::Wait(Ticket {
            id,
            level,
            since: now,
            rx,
        })
    }

    /// `at` in seconds since the queue's origin (negative before it).
    fn seconds(&self, at: Instant) -> f64 {
        match at.checked_duration_since(self.origin) {
            Some(d) => d.as_secs_f64(),
            None => -self.origin.duration_since(at).as_secs_f64(),
        }
    }

    /// What [`PoolQueue::admit`] would refuse a request at `level` of
    /// `tenant` with now, without queueing it (`None`: it would be admitted
    /// or queued), before its placement is known (counted as zero).
    pub fn check(&self, level: usize, tenant: &str) -> Option<Refusal> {
        if let Some(next) = self.successor() {
            return next.check(level, tenant);
        }
        let level = level.min(self.params.levels.len().saturating_sub(1));
        let capacity = (self.capacity.load())();
        let inner = self.lock();
        let now = Instant::now();
        let free = self.first_in_line(&inner, (level, tenant), capacity, now);
        self.refusal(
            &inner,
            (level, tenant, capacity, free),
            Placement::default(),
            now,
        )
    }

    /// A full level or tenant share, a wait estimated beyond the level's
    /// `max_wait`, or a time to first token predicted beyond its
    /// `ttft_objective` ([`super::refusal`]). `at`: the newcomer's level
    /// and tenant, the capacity, and whether a slot is free and nobody
    /// waits.
    fn refusal(
        &self,
        inner: &Inner,
        at: (usize, &str, usize, bool),
        placement: Placement,
        now: Instant,
    ) -> Option<Refusal> {
        let (level, tenant, capacity, free) = at;
        let fleet = self.fleet_view(inner, capacity, now);
        let depths = fleet.depths;
        let own_level = inner.waiting[level].len();
        // `max_depth` bounds this instance's waiters (its memory), whatever
        // the other instances hold.
        if !free && own_level >= self.params.max_depth {
            let queued: usize = depths.iter().sum();
            let retry_after = inner.drain.backlog(queued, fleet.capacity);
            return Some(Refusal::QueueFull { retry_after });
        }
        let now_s = self.seconds(now);
        // Each tenant's waiters are oldest first, so its lifted ones are a
        // prefix.
        let promoted = inner
            .waiting
            .iter()
            .enumerate()
            .skip(level + 1)
            .map(|(l, q)| {
                q.count_prefix(|since| lifted_ahead(&self.params.levels, level, l, now_s - since))
            })
            .sum();
        let fair = &self.params.fair;
        let at_level = &inner.waiting[level];
        let standing = Standing {
            level,
            depths: &depths,
            // The other instances' waiters of the level are older.
            level_ahead: at_level.ahead(fair.enabled, tenant, fair.weight(tenant)) + depths[level]
                - own_level,
            tenant_depth: at_level.depth(tenant),
            tenant_max_depth: fair.max_depth(tenant),
            promoted,
            capacity: fleet.capacity,
            free,
            placement,
        };
        let ages = || {
            let here = (inner.started.values())
                .map(|s| now.saturating_duration_since(*s).as_secs_f64())
                .collect();
            others::fleet_ages(here, fleet.remote_active)
        };
        refusal(
            &self.params.levels,
            usize::MAX,
            &self.fleet_drain(inner, now),
            standing,
            ages,
        )
    }

    /// Removes a waiter (its client went away or it timed out). Returns false
    /// when it was no longer waiting (already granted).
    pub fn cancel(&self, ticket_id: u64, level: usize) -> bool {
        let mut inner = self.lock();
        if let Some(next) = inner.successor.clone() {
            drop(inner);
            return next.cancel(ticket_id, level);
        }
        // A waiter moved here by `replace` may sit at a lower level.
        for q in inner.waiting.iter_mut().skip(level) {
            if q.remove(|w| w.id == ticket_id).is_some() {
                return true;
            }
        }
        false
    }

    /// Number of waiters per level.
    pub fn depths(&self) -> Vec<usize> {
        match self.successor() {
            Some(next) => next.depths(),
            None => self.lock().waiting.iter().map(FairLevel::len).collect(),
        }
    }

    /// The tenants of each level: waiters, slots held, service counted.
    pub fn tenants(&self) -> Vec<Vec<TenantView>> {
        match self.successor() {
            Some(next) => next.tenants(),
            None => self.lock().waiting.iter().map(FairLevel::tenants).collect(),
        }
    }

    /// How the levels share among tenants.
    pub fn fairness(&self) -> &FairParams {
        &self.params.fair
    }

    /// Requests holding a permit.
    pub fn active(&self) -> usize {
        match self.successor() {
            Some(next) => next.active(),
            None => self.lock().active,
        }
    }

    /// Time to drain the current backlog at the measured rate (1 s without data).
    pub fn backlog_drain_time(&self) -> Duration {
        let capacity = (self.capacity.load())();
        let inner = self.lock();
        let fleet = self.fleet_view(&inner, capacity, Instant::now());
        let queued: usize = fleet.depths.iter().sum();
        inner
            .drain
            .backlog(queued.saturating_sub(1), fleet.capacity)
    }

    /// Takes a slot for a request at `level` of `tenant`, starting `now`,
    /// and charges the tenant its prompt.
    fn permit(
        &self,
        inner: &mut Inner,
        level: usize,
        tenant: Arc<str>,
        weight: f64,
        estimate: (u64, u64),
        now: Instant,
    ) -> Permit {
        inner.active += 1;
        let prompt = self.params.fair.prompt_weight * estimate.0 as f64;
        inner.waiting[level].started(&tenant, weight, prompt);
        let id = inner.next_id;
        inner.next_id += 1;
        inner.started.insert(id, now);
        Permit {
            queue: self.me.upgrade().expect("a live queue hands out permits"),
            id,
            since: now,
            level,
            served: false,
            tenant,
            estimate,
            reported: None,
            service: None,
        }
    }

    /// Frees permit `id`'s slot; `held` is the service time of a served
    /// request; `charges` the tokens its tenant is charged at the end, and
    /// for the whole request.
    fn release(
        &self,
        held: Option<Duration>,
        id: u64,
        level: usize,
        tenant: &Arc<str>,
        charges: (f64, f64),
    ) {
        let (charge, total) = charges;
        let (granted, holds) = {
            let mut inner = self.lock();
            if let Some(next) = inner.successor.clone() {
                drop(inner);
                return next.release(held, id, level, tenant, charges);
            }
            inner.active = inner.active.saturating_sub(1);
            inner.started.remove(&id);
            let weight = self.params.fair.weight(tenant);
            let level = level.min(inner.waiting.len().saturating_sub(1));
            inner.waiting[level].ended(tenant, weight, charge);
            if let Some(held) = held {
                inner.drain.served(held.as_secs_f64());
            }
            let holds = self.params.fair.enabled && {
                let window = self.params.fair.anticipate.as_secs_f64();
                let now_s = self.seconds(Instant::now());
                let levels = &self.params.levels;
                let ended = (level, tenant, total);
                anticipate(levels, &mut inner.waiting, ended, now_s, window)
            };
            (self.grant(&mut inner), holds)
        };
        // Sent outside the lock: a permit refused by a vanished waiter is
        // dropped here and releases its slot again.
        for (tx, permit) in granted {
            let _ = tx.send(permit);
        }
        if holds {
            self.end_hold_later();
        }
    }

    /// Gives a held slot to the waiters when its hold ends (without a
    /// runtime, at the next admission or release instead).
    fn end_hold_later(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let me = self.me.clone();
        let window = self.params.fair.anticipate;
        runtime.spawn(async move {
            tokio::time::sleep(window).await;
            if let Some(queue) = me.upgrade() {
                queue.poke();
            }
        });
    }

    /// Wakes waiters while capacity allows (after capacity grew, e.g. a
    /// replica came back).
    pub fn poke(&self) {
        let granted = self.grant(&mut self.lock());
        for (tx, permit) in granted {
            let _ = tx.send(permit);
        }
    }

    /// The waiter of `level` that takes a free slot: the next one, or with
    /// the prefix handoff a younger one whose prompt a free replica caches.
    fn next_waiter(
        &self,
        inner: &mut Inner,
        level: usize,
        now_s: f64,
    ) -> (Arc<str>, f64, Entry<Waiter>) {
        let fair = self.params.fair.enabled;
        let handoff = self.params.prefix_handoff.as_secs_f64();
        let waiting = &mut inner.waiting[level];
        let next = match handoff > 0.0 {
            true => waiting.pop_preferring(fair, now_s - handoff, |w| {
                w.affinity.as_ref().map_or(0, |a| (a.0)())
            }),
            false => waiting.pop(fair),
        };
        next.expect("non-empty level")
    }

    fn grant(&self, inner: &mut Inner) -> Vec<(oneshot::Sender<Permit>, Permit)> {
        let mut out = Vec::new();
        let capacity = (self.capacity.load())();
        let now = Instant::now();
        let now_s = self.seconds(now);
        while inner.active + inner.held(now_s) < capacity {
            let fronts = inner.waiting.iter().map(FairLevel::oldest);
            let Some(level) = next_level(&self.params.levels, fronts, now_s) else {
                break;
            };
            let since = inner.waiting[level].oldest().map_or(now_s, |(s, _)| s);
            if self.held_back(inner, level, since, now) {
                // Another instance's waiter goes first: ask the store to
                // move the slot there now rather than at the next tick.
                crate::fleet::nudge();
                break;
            }
            let (tenant, weight, entry) = self.next_waiter(inner, level, now_s);
            let w = entry.item;
            if w.tx.is_closed() {
                continue;
            }
            let estimate = (w.prompt_tokens, w.output_tokens);
            let permit = self.permit(inner, level, tenant, weight, estimate, now);
            out.push((w.tx, permit));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn queue(
        capacity: usize,
        depth: usize,
        promote_after: Duration,
    ) -> (Arc<PoolQueue>, Arc<AtomicUsize>) {
        let cap = Arc::new(AtomicUsize::new(capacity));
        let c = Arc::clone(&cap);
        let level = |name: &str| Level {
            name: name.into(),
            max_wait: Duration::from_secs(10),
            promote_after,
            ttft_objective: None,
        };
        let q = PoolQueue::new(
            QueueParams {
                prefix_handoff: Duration::ZERO,
                levels: vec![level("high"), level("low")],
                max_depth: depth,
                fair: FairParams::default(),
            },
            Box::new(move || c.load(Ordering::SeqCst)),
        );
        (q, cap)
    }

    fn now_permit(a: Admit) -> Permit {
        match a {
            Admit::Now(p) => p,
            other => panic!("expected Now, got {other:?}"),
        }
    }

    /// Drops `p` as a request a replica answered.
    fn served(mut p: Permit) {
        p.served();
    }

    fn ticket(a: Admit) -> Ticket {
        match a {
            Admit::Wait(t) => t,
            other => panic!("expected Wait, got {other:?}"),
        }
    }

    #[test]
    fn strict_priority_then_fifo() {
        let (q, _) = queue(1, 10, Duration::from_secs(3600));
        let t0 = Instant::now();
        let running = now_permit(q.admit(1, t0, Duration::ZERO));
        let mut low_a = ticket(q.admit(1, t0, Duration::ZERO));
        let mut low_b = ticket(q.admit(1, t0, Duration::ZERO));
        let mut high = ticket(q.admit(0, t0, Duration::ZERO));
        assert_eq!(q.depths(), vec![1, 2]);
        drop(running);
        let p = high
            .rx
            .try_recv()
            .expect("high goes first although it came last");
        assert!(low_a.rx.try_recv().is_err());
        drop(p);
        let p = low_a.rx.try_recv().expect("then the older low request");
        assert!(low_b.rx.try_recv().is_err());
        drop(p);
        low_b.rx.try_recv().expect("then the next");
        assert_eq!(q.depths(), vec![0, 0]);
    }

    #[test]
    fn aging_promotes_a_long_waiting_low_request() {
        let (q, _) = queue(1, 10, Duration::from_millis(100));
        let now = Instant::now();
        let running = now_permit(q.admit(0, now, Duration::ZERO));
        // The low request has waited 150 ms: one level up, level 0, and older.
        let mut low = ticket(q.admit(1, now - Duration::from_millis(150), Duration::ZERO));
        let mut high = ticket(q.admit(0, now, Duration::ZERO));
        drop(running);
        let _p = low
            .rx
            .try_recv()
            .expect("aged low request goes before the newer high one");
        assert!(high.rx.try_recv().is_err());
    }

    #[test]
    fn low_waiters_lifted_by_aging_count_against_a_high_newcomer() {
        for (promote_after, refused) in [
            (Duration::from_secs(3600), false),
            (Duration::from_millis(100), true),
        ] {
            let (q, _) = queue(1, 100, promote_after);
            let now = Instant::now();
            // One request held for ~1.9 s teaches the queue its drain rate.
            served(now_permit(q.admit(
                0,
                now - Duration::from_millis(1900),
                Duration::ZERO,
            )));
            let _running = now_permit(q.admit(0, now, Duration::ZERO));
            // Five low requests that have waited 150 ms.
            let _low: Vec<Ticket> = (0..5)
                .map(|_| ticket(q.admit(1, now - Duration::from_millis(150), Duration::ZERO)))
                .collect();
            // Lifted, they go before a high newcomer: six at ~1.9 s is over
            // the 10 s max_wait; not lifted, it goes first (~1.9 s).
            let high = q.admit(0, now, Duration::ZERO);
            assert_eq!(
                matches!(high, Admit::Refused(Refusal::OverObjective { .. })),
                refused,
                "promote_after {promote_after:?}: {high:?}"
            );
        }
    }

    #[test]
    fn a_deadline_newcomer_counts_waiters_aging_lifts_before_its_objective() {
        // High: 2 s objective. Low: lifted one level per second waited.
        let level = |name: &str, objective: Option<u64>| Level {
            name: name.into(),
            max_wait: Duration::from_secs(3600),
            promote_after: Duration::from_secs(1),
            ttft_objective: objective.map(Duration::from_secs),
        };
        let q = PoolQueue::new(
            QueueParams {
                prefix_handoff: Duration::ZERO,
                levels: vec![level("high", Some(2)), level("low", None)],
                max_depth: 100,
                fair: FairParams::default(),
            },
            Box::new(|| 1),
        );
        let now = Instant::now();
        // The one slot turns over every 0.25 s.
        served(now_permit(q.admit(
            0,
            now - Duration::from_millis(250),
            Duration::ZERO,
        )));
        let _running = now_permit(q.admit(0, now, Duration::ZERO));
        // A high newcomer alone waits for k' = ⌈1 + 2.33⌉ = 4 releases: 1 s.
        let alone = ticket(q.admit(0, now, Duration::ZERO));
        assert!(q.cancel(alone.id, alone.level));
        // Six low requests that waited 0.2 s: none is lifted yet, all are
        // within the next 2 s, and then they are older than the newcomer
        // and go first: k' = ⌈7 + 2.33·√7⌉ = 14 releases, 3.5 s.
        let _low: Vec<Ticket> = (0..6)
            .map(|_| ticket(q.admit(1, now - Duration::from_millis(200), Duration::ZERO)))
            .collect();
        assert!(matches!(
            q.admit(0, now, Duration::ZERO),
            Admit::Refused(Refusal::OverObjective { .. })
        ));
    }

    #[test]
    fn depth_is_bounded_per_level() {
        let (q, _) = queue(1, 2, Duration::from_secs(3600));
        let t0 = Instant::now();
        let _running = now_permit(q.admit(0, t0, Duration::ZERO));
        let _a = ticket(q.admit(1, t0, Duration::ZERO));
        let _b = ticket(q.admit(1, t0, Duration::ZERO));
        assert!(matches!(
            q.admit(1, t0, Duration::ZERO),
            Admit::Refused(Refusal::QueueFull { .. })
        ));
        // The other level still has room.
        let _h = ticket(q.admit(0, t0, Duration::ZERO));
    }

    #[test]
    fn cancelled_waiter_frees_its_place_and_is_skipped() {
        let (q, _) = queue(1, 1, Duration::from_secs(3600));
        let t0 = Instant::now();
        let running = now_permit(q.admit(1, t0, Duration::ZERO));
        let gone = ticket(q.admit(1, t0, Duration::ZERO));
        assert!(matches!(
            q.admit(1, t0, Duration::ZERO),
            Admit::Refused(Refusal::QueueFull { .. })
        ));
        assert!(q.cancel(gone.id, gone.level));
        let mut next = ticket(q.admit(1, t0, Duration::ZERO));
        drop(running);
        let _p = next.rx.try_recv().expect("the next request takes the slot");
        assert_eq!(q.active(), 1);
    }

    #[test]
    fn dropped_receiver_does_not_leak_a_slot() {
        let (q, _) = queue(1, 4, Duration::from_secs(3600));
        let t0 = Instant::now();
        let running = now_permit(q.admit(1, t0, Duration::ZERO));
        let vanished = ticket(q.admit(1, t0, Duration::ZERO));
        let mut next = ticket(q.admit(1, t0, Duration::ZERO));
        drop(vanished.rx);
        drop(running);
        let _p = next
            .rx
            .try_recv()
            .expect("the slot passes over the vanished waiter");
        assert_eq!(q.active(), 1);
    }

    #[test]
    fn only_served_requests_teach_the_drain_rate() {
        let (q, _) = queue(1, 100, Duration::from_secs(3600));
        let now = Instant::now();
        let no_data = q.backlog_drain_time();
        // Requests that failed, or whose client left before an answer: the
        // slot frees, no rate is learned from them.
        for _ in 0..5 {
            drop(now_permit(q.admit(
                0,
                now - Duration::from_millis(1900),
                Duration::ZERO,
            )));
        }
        assert_eq!(q.backlog_drain_time(), no_data);
        served(now_permit(q.admit(
            0,
            now - Duration::from_millis(1900),
            Duration::ZERO,
        )));
        let taught = q.backlog_drain_time();
        assert!((taught.as_secs_f64() - 1.9).abs() < 0.2, "{taught:?}");
        // A burst of fast failures afterwards does not make the fleet look
        // faster than it is.
        for _ in 0..20 {
            drop(now_permit(q.admit(0, now, Duration::ZERO)));
        }
        assert_eq!(q.backlog_drain_time(), taught);
        assert_eq!(q.active(), 0);
    }

    #[test]
    fn estimated_wait_rejects_and_retry_after_grows_with_backlog() {
        let (q, _) = queue(1, 100, Duration::from_secs(3600));
        let now = Instant::now();
        // One request held for ~1.9 s teaches the queue its drain rate.
        served(now_permit(q.admit(
            0,
            now - Duration::from_millis(1900),
            Duration::ZERO,
        )));
        let _running = now_permit(q.admit(0, now, Duration::ZERO));
        let mut retry = Vec::new();
        let mut waiting = Vec::new();
        loop {
            match q.admit(1, now, Duration::ZERO) {
                Admit::Wait(t) => waiting.push(t),
                Admit::Refused(Refusal::OverObjective {
                    estimated,
                    retry_after,
                }) => {
                    assert!(estimated.unwrap() > Duration::from_secs(10));
                    retry.push(retry_after);
                    break;
                }
                other => panic!("{other:?}"),
            }
        }
        // 10 s objective at ~1.9 s per request: five wait (estimated 1.9 .. 9.5 s),
        // the sixth (11.4 s) is refused.
        assert_eq!(waiting.len(), 5);
        // A bigger backlog gives a longer Retry-After.
        let high_retry = match q.admit(0, now, Duration::ZERO) {
            Admit::Wait(t) => {
                waiting.push(t);
                match q.admit(1, now, Duration::ZERO) {
                    Admit::Refused(Refusal::OverObjective { retry_after, .. }) => retry_after,
                    other => panic!("{other:?}"),
                }
            }
            other => panic!("{other:?}"),
        };
        assert!(high_retry > retry[0], "{high_retry:?} vs {:?}", retry[0]);
        // Retry-After is the whole backlog's drain time: 6 × 1.9 s.
        assert!(
            (retry[0].as_secs_f64() - 11.4).abs() < 0.2,
            "{:?}",
            retry[0]
        );
    }

    /// A one-level queue of `capacity` whose level has a 2 s TTFT objective
    /// (and a `max_wait` too long to matter).
    fn deadline_queue(capacity: usize) -> Arc<PoolQueue> {
        PoolQueue::new(
            QueueParams {
                prefix_handoff: Duration::ZERO,
                levels: vec![Level {
                    name: "only".into(),
                    max_wait: Duration::from_secs(3600),
                    promote_after: Duration::from_secs(3600),
                    ttft_objective: Some(Duration::from_secs(2)),
                }],
                max_depth: 1000,
                fair: FairParams::default(),
            },
            Box::new(move || capacity),
        )
    }

    #[test]
    fn a_ttft_objective_admits_waiters_while_their_predicted_ttft_holds() {
        let q = deadline_queue(4);
        let now = Instant::now();
        let placement = Duration::from_millis(200);
        // Before anything was served, a free slot admits by the placement
        // alone; once every slot is taken a newcomer would wait for a
        // release nothing predicts yet: refused, with no estimate.
        let mut running: Vec<Permit> = (0..3)
            .map(|_| now_permit(q.admit(0, now, placement)))
            .collect();
        assert!(matches!(
            q.admit(0, now, Duration::from_secs(3)),
            Admit::Refused(Refusal::OverObjective {
                estimated: Some(_),
                ..
            })
        ));
        running.push(now_permit(q.admit(0, now, placement)));
        assert!(matches!(
            q.admit(0, now, placement),
            Admit::Refused(Refusal::OverObjective {
                estimated: None,
                ..
            })
        ));
        // Four slots held 1 s each by served requests: 4 req/s. Fast
        // failures in between teach nothing.
        drop(running);
        for _ in 0..4 {
            served(now_permit(q.admit(
                0,
                now - Duration::from_secs(1),
                placement,
            )));
        }
        for _ in 0..20 {
            drop(now_permit(q.admit(0, now, placement)));
        }
        let _running: Vec<Permit> = (0..4)
            .map(|_| now_permit(q.admit(0, now, placement)))
            .collect();
        let mut waiting = Vec::new();
        let (predicted, retry_after) = loop {
            match q.admit(0, now, placement) {
                Admit::Wait(t) => waiting.push(t),
                Admit::Refused(Refusal::OverObjective {
                    estimated,
                    retry_after,
                }) => break (estimated, retry_after),
                other => panic!("{other:?}"),
            }
        };
        // The four running requests started together: all four slots free
        // in 1 s, and again 1 s later. The first waiter needs k' = ⌈1 +
        // 2.33⌉ = 4 releases (1 s, 1.2 s with its placement); a second would
        // need ⌈2 + 2.33·√2⌉ = 6, the next wave (2.2 s): refused.
        assert_eq!(waiting.len(), 1);
        assert!(
            (predicted.unwrap().as_secs_f64() - 2.2).abs() < 1e-2,
            "{predicted:?}"
        );
        // Retry-After: the backlog of one plus one at 4 req/s.
        assert!(
            (retry_after.as_secs_f64() - 0.5).abs() < 1e-2,
            "{retry_after:?}"
        );
        // A waiter leaving makes room for the next one.
        let gone = waiting.pop().unwrap();
        assert!(q.cancel(gone.id, gone.level));
        assert!(matches!(q.admit(0, now, placement), Admit::Wait(_)));
    }

    #[test]
    fn a_replacing_queue_keeps_the_active_count_and_the_waiters() {
        let (q, _) = queue(1, 4, Duration::from_secs(3600));
        let t0 = Instant::now();
        let running = now_permit(q.admit(1, t0, Duration::ZERO));
        let mut waiting = ticket(q.admit(1, t0, Duration::ZERO));
        let one = || Level {
            name: "only".into(),
            max_wait: Duration::from_secs(10),
            promote_after: Duration::from_secs(3600),
            ttft_objective: None,
        };
        let next = q.replace(
            QueueParams {
                prefix_handoff: Duration::ZERO,
                levels: vec![one()],
                max_depth: 4,
                fair: FairParams::default(),
            },
            Box::new(|| 1),
        );
        assert_eq!(next.active(), 1, "the running request still counts");
        assert_eq!(next.depths(), vec![1], "the waiter moved to the new queue");
        assert!(
            matches!(q.admit(0, t0, Duration::ZERO), Admit::Wait(_)),
            "old handle forwards"
        );
        assert!(waiting.rx.try_recv().is_err());
        drop(running);
        let _p = waiting.rx.try_recv().expect("granted by the new queue");
        assert_eq!(next.active(), 1);
    }

    #[test]
    fn capacity_growth_is_picked_up_by_poke() {
        let (q, cap) = queue(0, 4, Duration::from_secs(3600));
        let mut t = ticket(q.admit(0, Instant::now(), Duration::ZERO));
        cap.store(1, Ordering::SeqCst);
        q.poke();
        t.rx.try_recv().expect("granted once capacity appeared");
    }

    fn claim(tenant: &str, level: usize) -> Claim {
        Claim {
            level,
            tenant: Arc::from(tenant),
            prompt_tokens: 100,
            output_tokens: 200,
            affinity: None,
        }
    }

    fn fair_queue(capacity: usize, fair: FairParams) -> Arc<PoolQueue> {
        PoolQueue::new(
            QueueParams {
                prefix_handoff: Duration::ZERO,
                levels: vec![Level {
                    name: "only".into(),
                    max_wait: Duration::from_secs(3600),
                    promote_after: Duration::from_secs(3600),
                    ttft_objective: None,
                }],
                max_depth: 100,
                fair,
            },
            Box::new(move || capacity),
        )
    }

    /// With the prefix handoff a freed slot goes to the waiter whose
    /// prompt a free replica caches the most, passing the next waiter
    /// while it has waited less than the bound, never after.
    #[test]
    fn a_freed_slot_goes_to_the_waiter_whose_prompt_is_cached_within_the_bound() {
        let q = PoolQueue::new(
            QueueParams {
                prefix_handoff: Duration::from_secs(1),
                ..fair_queue(1, FairParams::default()).params.clone()
            },
            Box::new(|| 1),
        );
        let cached = |tokens: u64| Claim {
            affinity: Some(Affinity(Arc::new(move || tokens))),
            ..claim("", 0)
        };
        let t0 = Instant::now();
        let running = now_permit(q.admit_claim(cached(0), t0, Duration::ZERO));
        // The next waiter arrived two seconds ago: due, never passed.
        let mut due = ticket(q.admit_claim(cached(0), t0 - Duration::from_secs(2), Duration::ZERO));
        let mut cold = ticket(q.admit_claim(cached(0), t0, Duration::ZERO));
        let mut warm = ticket(q.admit_claim(cached(512), t0, Duration::ZERO));
        let mut warmer = ticket(q.admit_claim(cached(900), t0, Duration::ZERO));
        drop(running);
        let p = due.rx.try_recv().expect("the due waiter goes first");
        assert!(warmer.rx.try_recv().is_err());
        drop(p);
        let p = warmer.rx.try_recv().expect("then the warmest");
        drop(p);
        let p = warm.rx.try_recv().expect("then the warm one");
        assert!(cold.rx.try_recv().is_err());
        drop(p);
        assert!(cold.rx.try_recv().is_ok());
    }

    /// Frees the oldest running slot as an answered request and returns
    /// the tenants granted by it, adding their permits to `running`.
    fn release_one(running: &mut Vec<Permit>, waiting: &mut Vec<Ticket>) -> Vec<Arc<str>> {
        let mut p = running.remove(0);
        p.served();
        p.report_usage(100, 200);
        drop(p);
        let mut out = Vec::new();
        waiting.retain_mut(|t| match t.rx.try_recv() {
            Ok(p) => {
                out.push(Arc::clone(&p.tenant));
                running.push(p);
                false
            }
            Err(_) => true,
        });
        out
    }

    #[test]
    fn a_light_tenant_beside_a_flood_takes_the_next_free_slot() {
        for (enabled, light_after) in [(true, 1), (false, 9)] {
            let fair = FairParams {
                enabled,
                ..FairParams::default()
            };
            let q = fair_queue(4, fair);
            let now = Instant::now();
            let mut running: Vec<Permit> = (0..4)
                .map(|_| now_permit(q.admit_claim(claim("heavy", 0), now, Duration::ZERO)))
                .collect();
            let mut waiting: Vec<Ticket> = (0..8)
                .map(|_| ticket(q.admit_claim(claim("heavy", 0), now, Duration::ZERO)))
                .collect();
            waiting.push(ticket(q.admit_claim(
                claim("light", 0),
                now,
                Duration::ZERO,
            )));
            let mut releases = 0;
            loop {
                releases += 1;
                let granted = release_one(&mut running, &mut waiting);
                assert_eq!(granted.len(), 1);
                if &*granted[0] == "light" {
                    break;
                }
                // The heavy tenant's stream sends its next request.
                waiting.push(ticket(q.admit_claim(
                    claim("heavy", 0),
                    now,
                    Duration::ZERO,
                )));
            }
            assert_eq!(releases, light_after, "fair share {enabled}");
        }
    }

    /// One slot held by the light tenant, one by the heavy, two heavy
    /// waiters; the heavy tenant served more so far. The light request
    /// ends (its stream sends the next one soon after): returns the queue,
    /// when it ended, the heavy waiters and the heavy request's slot.
    fn light_releases(anticipate: Duration) -> (Arc<PoolQueue>, Instant, Vec<Ticket>, Permit) {
        let fair = FairParams {
            anticipate,
            ..FairParams::default()
        };
        let q = fair_queue(2, fair);
        let now = Instant::now();
        for _ in 0..3 {
            let mut p = now_permit(q.admit_claim(claim("heavy", 0), now, Duration::ZERO));
            p.served();
            p.report_usage(100, 200);
        }
        let mut light = now_permit(q.admit_claim(claim("light", 0), now, Duration::ZERO));
        let heavy = now_permit(q.admit_claim(claim("heavy", 0), now, Duration::ZERO));
        let waiting: Vec<Ticket> = (0..2)
            .map(|_| ticket(q.admit_claim(claim("heavy", 0), now, Duration::ZERO)))
            .collect();
        light.served();
        light.report_usage(100, 50);
        let ended = Instant::now();
        drop(light);
        (q, ended, waiting, heavy)
    }

    #[test]
    fn a_light_tenant_s_next_request_2ms_after_its_release_takes_that_slot() {
        let soon = Duration::from_millis(2);
        let (q, ended, mut waiting, _heavy) = light_releases(Duration::from_millis(5));
        assert!(waiting.iter_mut().all(|t| t.rx.try_recv().is_err()), "held");
        let next = q.admit_claim(claim("light", 0), ended + soon, Duration::ZERO);
        assert!(matches!(next, Admit::Now(_)), "{next:?}");
        assert!(waiting.iter_mut().all(|t| t.rx.try_recv().is_err()));
        // Work-conserving fair share: a heavy waiter took it.
        let (q, ended, mut waiting, _heavy) = light_releases(Duration::ZERO);
        assert!(waiting[0].rx.try_recv().is_ok());
        let next = q.admit_claim(claim("light", 0), ended + soon, Duration::ZERO);
        assert!(matches!(next, Admit::Wait(_)), "{next:?}");
    }

    #[tokio::test]
    async fn a_held_slot_goes_to_the_next_waiter_when_the_window_ends() {
        let (_q, _, mut waiting, _heavy) = light_releases(Duration::from_millis(5));
        let granted = tokio::time::timeout(Duration::from_secs(10), &mut waiting[0].rx).await;
        assert!(matches!(granted, Ok(Ok(_))), "{granted:?}");
        assert!(waiting[1].rx.try_recv().is_err());
    }

    #[test]
    fn weights_two_to_one_share_the_slots_two_to_one() {
        let mut fair = FairParams::default();
        fair.tenants.insert(
            "gold".into(),
            super::super::fair::Share {
                weight: 2.0,
                max_depth: None,
            },
        );
        let q = fair_queue(2, fair);
        let now = Instant::now();
        let mut running: Vec<Permit> = (0..2)
            .map(|_| now_permit(q.admit_claim(claim("other", 0), now, Duration::ZERO)))
            .collect();
        let mut waiting = Vec::new();
        for _ in 0..50 {
            waiting.push(ticket(q.admit_claim(claim("gold", 0), now, Duration::ZERO)));
            waiting.push(ticket(q.admit_claim(
                claim("plain", 0),
                now,
                Duration::ZERO,
            )));
        }
        let mut served: Vec<Arc<str>> = Vec::new();
        for _ in 0..60 {
            served.extend(release_one(&mut running, &mut waiting));
        }
        let gold = served.iter().filter(|t| &***t == "gold").count() as f64;
        let plain = served.iter().filter(|t| &***t == "plain").count() as f64;
        assert!((gold / plain - 2.0).abs() <= 0.2, "{gold}:{plain}");
    }

    #[test]
    fn a_tenant_at_its_bound_is_refused_while_others_still_queue() {
        let mut fair = FairParams {
            tenant_max_depth: 2,
            ..FairParams::default()
        };
        fair.tenants.insert(
            "big".into(),
            super::super::fair::Share {
                weight: 1.0,
                max_depth: Some(3),
            },
        );
        let q = fair_queue(1, fair);
        let now = Instant::now();
        let _running = now_permit(q.admit_claim(claim("a", 0), now, Duration::ZERO));
        let _a: Vec<Ticket> = (0..2)
            .map(|_| ticket(q.admit_claim(claim("a", 0), now, Duration::ZERO)))
            .collect();
        assert!(matches!(
            q.admit_claim(claim("a", 0), now, Duration::ZERO),
            Admit::Refused(Refusal::TenantFull { .. })
        ));
        assert!(matches!(q.check(0, "a"), Some(Refusal::TenantFull { .. })));
        let _big: Vec<Ticket> = (0..3)
            .map(|_| ticket(q.admit_claim(claim("big", 0), now, Duration::ZERO)))
            .collect();
        assert!(matches!(
            q.admit_claim(claim("big", 0), now, Duration::ZERO),
            Admit::Refused(Refusal::TenantFull { .. })
        ));
        assert!(matches!(
            q.admit_claim(claim("b", 0), now, Duration::ZERO),
            Admit::Wait(_)
        ));
    }

    #[test]
    fn the_reported_usage_corrects_the_tenant_s_service() {
        let q = fair_queue(1, FairParams::default());
        let now = Instant::now();
        let service = |q: &PoolQueue| q.tenants()[0][0].service;
        let mut p = now_permit(q.admit_claim(claim("a", 0), now, Duration::ZERO));
        // The prompt's estimate at dispatch: 100 × 0.5.
        assert_eq!(service(&q), 50.0);
        p.served();
        p.report_usage(120, 30);
        drop(p);
        assert_eq!(service(&q), 60.0 + 30.0);
        // Answered without a report: the output allowance.
        let mut p = now_permit(q.admit_claim(claim("a", 0), now, Duration::ZERO));
        p.served();
        drop(p);
        assert_eq!(service(&q), 90.0 + 50.0 + 200.0);
        // Never answered: the prompt is refunded.
        drop(now_permit(q.admit_claim(
            claim("a", 0),
            now,
            Duration::ZERO,
        )));
        assert_eq!(service(&q), 340.0);
    }
}

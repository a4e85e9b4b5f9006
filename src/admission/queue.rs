//! A pool's central queue: a counting gate over the pool's capacity with
//! strict priority between levels, FIFO within a level, aging so low levels
//! never starve, and admission control by estimated wait.
//!
//! - **Capacity** is the sum of the per-replica `max_inflight` limits of the
//!   replicas that may take work, read through a callback at each decision.
//!   Each dispatched request holds one [`Permit`]; dropping it (end of
//!   stream, error, client gone) frees the slot and grants the next waiter at
//!   once: event-driven, no polling.
//! - **Order**: each level's oldest waiter is considered with its *effective*
//!   level, `level − ⌊waited / promote_after⌋` (not below 0). The lowest
//!   effective level wins; ties go to the longest waiting.
//! - **Admission control** ([`super::estimate`]): a newcomer is refused
//!   (429) when its level is full, when its estimated wait (its position ÷
//!   the drain rate measured on requests a replica answered) exceeds the
//!   level's `max_wait`, or, on a level with a `ttft_objective`, when its
//!   predicted time to first token (a high-percentile queue wait plus the
//!   placement the caller predicts) exceeds the objective. `Retry-After` is
//!   the time to drain the whole backlog at the measured rate.
//!
//! Cost: O(levels) per grant under one short mutex; no `.await` inside it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::estimate::{Drain, Placement};
use super::refusal::{Standing, effective_level, lifted_ahead, refusal};

mod reload;

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
}

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Refusal {
    QueueFull {
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
    waiting: Vec<VecDeque<Waiter>>,
    active: usize,
    next_id: u64,
    /// When each permit held now was handed out, by permit id.
    started: HashMap<u64, Instant>,
    /// The measured service time and the levels' shares of the slots.
    drain: Drain,
    /// The queue that replaced this one on a reload that changed its shape:
    /// admissions, cancellations and releases go there.
    successor: Option<Arc<PoolQueue>>,
}

#[derive(Debug)]
struct Waiter {
    id: u64,
    since: Instant,
    tx: oneshot::Sender<Permit>,
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
}

impl Permit {
    /// Marks the request as answered by a replica (a success status), so
    /// the time it holds its slot teaches the queue its drain rate.
    pub fn served(&mut self) {
        self.served = true;
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let held = self.served.then(|| self.since.elapsed());
        self.queue.release(held, self.id);
    }
}

impl PoolQueue {
    pub fn new(params: QueueParams, capacity: Capacity) -> Arc<PoolQueue> {
        let levels = params.levels.len().max(1);
        Arc::new_cyclic(|me| PoolQueue {
            me: me.clone(),
            params,
            capacity: arc_swap::ArcSwap::from_pointee(capacity),
            inner: Mutex::new(Inner {
                waiting: (0..levels).map(|_| VecDeque::new()).collect(),
                ..Inner::default()
            }),
        })
    }

    pub fn levels(&self) -> &[Level] {
        &self.params.levels
    }

    /// Waiters allowed per level.
    pub fn max_depth(&self) -> usize {
        self.params.max_depth
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a request at `level` now, queues it, or refuses it.
    /// `placement` is its predicted time to first token once dispatched
    /// (read only on a level with a `ttft_objective`).
    pub fn admit(&self, level: usize, now: Instant, placement: impl Into<Placement>) -> Admit {
        let placement = placement.into();
        if let Some(next) = self.successor() {
            return next.admit(level, now, placement);
        }
        let level = level.min(self.params.levels.len().saturating_sub(1));
        let capacity = (self.capacity.load())();
        let mut inner = self.lock();
        let queued: usize = inner.waiting.iter().map(VecDeque::len).sum();
        let free = queued == 0 && inner.active < capacity;
        if let Some(refusal) = self.refusal(&inner, level, capacity, free, placement, now) {
            return Admit::Refused(refusal);
        }
        if free {
            return Admit::Now(self.permit(&mut inner, level, now));
        }
        let (tx, rx) = oneshot::channel();
        let id = inner.next_id;
        inner.next_id += 1;
        inner.waiting[level].push_back(Waiter { id, since: now, tx });
        Admit::Wait(Ticket {
            id,
            level,
            since: now,
            rx,
        })
    }

    /// What [`PoolQueue::admit`] would refuse a request at `level` with now,
    /// without queueing it (`None`: it would be admitted or queued), before
    /// its placement is known (counted as zero).
    pub fn check(&self, level: usize) -> Option<Refusal> {
        if let Some(next) = self.successor() {
            return next.check(level);
        }
        let level = level.min(self.params.levels.len().saturating_sub(1));
        let capacity = (self.capacity.load())();
        let inner = self.lock();
        let queued: usize = inner.waiting.iter().map(VecDeque::len).sum();
        let free = queued == 0 && inner.active < capacity;
        self.refusal(
            &inner,
            level,
            capacity,
            free,
            Placement::default(),
            Instant::now(),
        )
    }

    /// A full level, a wait estimated beyond the level's `max_wait`, or a
    /// time to first token predicted beyond its `ttft_objective`
    /// ([`super::refusal`]). `free`: a slot is free and nobody waits.
    fn refusal(
        &self,
        inner: &Inner,
        level: usize,
        capacity: usize,
        free: bool,
        placement: Placement,
        now: Instant,
    ) -> Option<Refusal> {
        let depths: Vec<usize> = inner.waiting.iter().map(VecDeque::len).collect();
        // Each level is oldest first, so its lifted waiters are a prefix.
        let promoted = inner
            .waiting
            .iter()
            .enumerate()
            .skip(level + 1)
            .map(|(l, q)| {
                q.iter()
                    .take_while(|w| {
                        let waited = now.saturating_duration_since(w.since).as_secs_f64();
                        lifted_ahead(&self.params.levels, level, l, waited)
                    })
                    .count()
            })
            .sum();
        let standing = Standing {
            level,
            depths: &depths,
            promoted,
            capacity,
            free,
            placement,
        };
        let ages = || {
            inner
                .started
                .values()
                .map(|s| now.saturating_duration_since(*s).as_secs_f64())
                .collect()
        };
        refusal(
            &self.params.levels,
            self.params.max_depth,
            &inner.drain,
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
            if let Some(i) = q.iter().position(|w| w.id == ticket_id) {
                q.remove(i);
                return true;
            }
        }
        false
    }

    /// Number of waiters per level.
    pub fn depths(&self) -> Vec<usize> {
        self.lock().waiting.iter().map(VecDeque::len).collect()
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
        let queued: usize = inner.waiting.iter().map(VecDeque::len).sum();
        inner.drain.backlog(queued.saturating_sub(1), capacity)
    }

    /// Takes a slot for a request at `level`, starting `now`.
    fn permit(&self, inner: &mut Inner, level: usize, now: Instant) -> Permit {
        inner.active += 1;
        inner.drain.granted(level);
        let id = inner.next_id;
        inner.next_id += 1;
        inner.started.insert(id, now);
        Permit {
            queue: self.me.upgrade().expect("a live queue hands out permits"),
            id,
            since: now,
            level,
            served: false,
        }
    }

    /// Frees permit `id`'s slot; `held` is the service time of a served
    /// request.
    fn release(&self, held: Option<Duration>, id: u64) {
        let granted = {
            let mut inner = self.lock();
            if let Some(next) = inner.successor.clone() {
                drop(inner);
                return next.release(held, id);
            }
            inner.active = inner.active.saturating_sub(1);
            inner.started.remove(&id);
            if let Some(held) = held {
                inner.drain.served(held.as_secs_f64());
            }
            self.grant(&mut inner)
        };
        // Sent outside the lock: a permit refused by a vanished waiter is
        // dropped here and releases its slot again.
        for (tx, permit) in granted {
            let _ = tx.send(permit);
        }
    }

    /// Wakes waiters while capacity allows (after capacity grew, e.g. a
    /// replica came back).
    pub fn poke(&self) {
        let granted = self.grant(&mut self.lock());
        for (tx, permit) in granted {
            let _ = tx.send(permit);
        }
    }

    fn grant(&self, inner: &mut Inner) -> Vec<(oneshot::Sender<Permit>, Permit)> {
        let mut out = Vec::new();
        let capacity = (self.capacity.load())();
        let now = Instant::now();
        while inner.active < capacity {
            let Some(level) = self.next_level(inner, now) else {
                break;
            };
            let w = inner.waiting[level].pop_front().expect("non-empty level");
            if w.tx.is_closed() {
                continue;
            }
            let permit = self.permit(inner, level, now);
            out.push((w.tx, permit));
        }
        out
    }

    /// The level whose oldest waiter goes next.
    fn next_level(&self, inner: &Inner, now: Instant) -> Option<usize> {
        let mut best: Option<(usize, Instant, usize)> = None;
        for (level, q) in inner.waiting.iter().enumerate() {
            let Some(front) = q.front() else { continue };
            let waited = now.saturating_duration_since(front.since).as_secs_f64();
            let effective = effective_level(level, waited, self.params.levels[level].promote_after);
            let better = match best {
                None => true,
                Some((e, since, _)) => effective < e || (effective == e && front.since < since),
            };
            if better {
                best = Some((effective, front.since, level));
            }
        }
        best.map(|(_, _, level)| level)
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
                levels: vec![level("high"), level("low")],
                max_depth: depth,
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
                levels: vec![level("high", Some(2)), level("low", None)],
                max_depth: 100,
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
                levels: vec![Level {
                    name: "only".into(),
                    max_wait: Duration::from_secs(3600),
                    promote_after: Duration::from_secs(3600),
                    ttft_objective: Some(Duration::from_secs(2)),
                }],
                max_depth: 1000,
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
                levels: vec![one()],
                max_depth: 4,
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
}

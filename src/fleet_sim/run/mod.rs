//! One policy over one workload: the discrete-event loop (this file: the
//! run and its arrivals; `dispatch`: sending to a replica and waiting for
//! a slot; `steps`: engine steps, delivery and scrapes; `outages`:
//! faults, timeouts and health).
//!
//! Events (see [`Event`]) come off one heap in time order:
//! - **arrival**: a pool with a queue admits or refuses it (429) as
//!   `serve`'s queue does, at its tier's priority level
//!   ([`super::pool_queue`]); the decision adapter routes and picks exactly
//!   as `serve` does, the request takes a real in-flight guard on the chosen
//!   [`Replica`](crate::replica::Replica) and enters that replica's engine
//!   half the network delay later (**enter**); an idle engine starts a step
//!   at once. A dead replica refuses the
//!   connection (the pool records the failure and the next attempt goes
//!   elsewhere, up to `retries`); a hung one swallows the request until the
//!   pool's first-byte timeout.
//! - **step end**: the step's tokens and finished requests are delivered at
//!   its end time (TTFT, inter-token gaps, end-to-end, each seen by the
//!   client half the network delay later; the guard shrinks with each token
//!   and is dropped when the proxy sees the end, half the delay after the
//!   last step: **release**), and the next step starts.
//! - **scrape**: when the pool scrapes, every live replica's metrics are
//!   stored as its `LoadSnapshot` at the scrape interval (all replicas in
//!   the same tick), so balancers see load as stale as in production.
//! - **fault**: see [`super::faults`]; health checks (when enabled) mark a
//!   dead or hung replica down `fall × interval` later.
//!
//! Per-event cost: a heap operation plus the work itself; an arrival is
//! O(replicas) (the router and balancer scan the pool, as in `serve`), a step
//! end is O(tokens in the step), a scrape O(replicas). Prompt ids are
//! generated into one reused buffer and moved into the engine.

mod dispatch;
mod outages;
mod steps;

use std::collections::VecDeque;
use std::time::Instant;

use crate::admission::estimate::Placement;
use crate::admission::refusal::Standing;
use crate::config::Config;
use crate::pool::{placement_ttft, queue_capacity};
use crate::replica::{InFlightGuard, ReplicaId};
use crate::replica_sim::config::SimConfig;
use crate::routing::{Decision, Expected, Prompt};

use super::SimulateError;
use super::clock::{Event, EventQueue, millis};
use super::decide::Decider;
use super::faults::Fault;
use super::fleet::{self, Slot};
use super::pool_queue::QueueModel;
use super::report::{Outcomes, RunResult};
use super::stats::LogHistogram;
use super::tier_report::{TierCounts, TierResult};
use super::tiers::{Tiers, default_level};
use super::workload::{SimWorkload, Source};

/// A request's progress.
#[derive(Debug, Default)]
struct Live {
    guard: Option<InFlightGuard>,
    /// `exact` mode: its prompt counts as held on its replica until the
    /// replica's events report it or the request ends.
    expected: Option<Expected>,
    replica: u32,
    first: Option<f64>,
    last: f64,
    open: bool,
    /// Its wait for a free slot has a deadline event already.
    slot_deadline: bool,
    /// When it was sent to its replica (seconds).
    dispatched_at: f64,
    /// Its prompt, on its way to the replica (see [`Event::Enter`]).
    prompt: Vec<u32>,
    /// Its last token is out; it stays open until the proxy sees the end.
    done: bool,
}

/// Everything one run needs.
pub struct RunSpec<'a> {
    pub workload: &'a SimWorkload,
    /// The config with the policy applied.
    pub config: &'a Config,
    pub model: &'a str,
    pub profile: &'a SimConfig,
    pub faults: &'a [Fault],
    /// Goodput counts requests whose TTFT is at most this (seconds).
    pub goodput_ttft: f64,
    pub seed: u64,
    /// Fixed time (seconds) the client waits on top of the engine for every
    /// response: the network, the proxy and the replica's HTTP front. Half
    /// of it is on the way in (a request reaches its engine that much after
    /// the proxy sent it, counted in flight meanwhile), half on the way out
    /// (every token reaches the client that much after its step ends, and
    /// the proxy drops the request's in-flight count then). TTFT and
    /// end-to-end grow by it, inter-token gaps do not. 0: none.
    pub network_delay: f64,
    /// When the second scrape comes (seconds; the first is at 0, before any
    /// arrival, as `serve` has scraped once before it is ready). 0: one
    /// scrape interval. A real proxy's scrapes fall at some fixed phase
    /// against its traffic, and balancers that read the scraped queue
    /// (`jsq`) decide differently at different phases.
    pub scrape_phase: f64,
    /// Each request's priority tier (`None`: every request at the level of
    /// a caller naming no tier).
    pub tiers: Option<&'a Tiers>,
}

struct Sim<'a> {
    spec: &'a RunSpec<'a>,
    decider: Decider,
    slots: Vec<Slot>,
    live: Vec<Live>,
    queue: EventQueue,
    out: Outcomes,
    itl: LogHistogram,
    ttft: Vec<f64>,
    e2e: Vec<f64>,
    open: usize,
    arrived: usize,
    prompt: Vec<u32>,
    /// Requests waiting for a free slot, oldest first.
    waiting: VecDeque<Waiter>,
    /// A slot was freed by the last event: the waiters try again.
    slot_freed: bool,
    /// The pool queue, when its replicas have a `max_inflight`.
    pool_queue: Option<QueueModel>,
    /// The level of a request without a tier.
    default_level: usize,
    /// Per tier of `spec.tiers`.
    tier_counts: Vec<TierCounts>,
}

/// A request waiting, as `serve`'s forwarder waits, for one of the replicas
/// it may use to end a request.
struct Waiter {
    index: usize,
    /// Its priority level.
    level: usize,
    /// When it arrived (seconds).
    since: f64,
    decision: Decision,
    tried: Vec<ReplicaId>,
}

/// Runs the workload through the fleet under `spec.config`.
pub fn run(spec: &RunSpec<'_>, policy: &str) -> Result<RunResult, SimulateError> {
    let started = Instant::now();
    let decider = Decider::new(spec.config, spec.model, spec.seed)?;
    let n = decider.pool().replicas.len();
    if let Some(f) = spec.faults.iter().find_map(|f| f.out_of_range(n)) {
        return Err(SimulateError::Invalid(format!(
            "--fault names replica {f}, but the fleet has {n} (0..{})",
            n.saturating_sub(1)
        )));
    }
    let requests = spec.workload.requests.len();
    let mut sim = Sim {
        spec,
        decider,
        slots: fleet::build(spec.profile, n),
        live: (0..requests).map(|_| Live::default()).collect(),
        queue: EventQueue::new(),
        out: Outcomes::default(),
        itl: LogHistogram::default(),
        ttft: Vec::with_capacity(requests),
        e2e: Vec::with_capacity(requests),
        open: 0,
        arrived: 0,
        prompt: Vec::new(),
        waiting: VecDeque::new(),
        slot_freed: false,
        pool_queue: None,
        default_level: default_level(spec.config),
        tier_counts: vec![TierCounts::default(); spec.tiers.map_or(0, |t| t.tiers.len())],
    };
    sim.pool_queue = QueueModel::of(sim.decider.pool());
    // `exact` mode: each replica's KV events feed the router's record.
    let pool = std::sync::Arc::clone(sim.decider.pool());
    for (id, _, held) in pool.router.kv_subscriptions() {
        if let Some(at) = pool.replicas.iter().position(|r| r.id == id) {
            sim.slots[at].publish_to(held);
        }
    }
    sim.queue
        .push(spec.workload.requests[0].at, Event::Arrival(0));
    if sim.decider.pool().scrape.is_some() {
        sim.queue.push(0.0, Event::Scrape);
    }
    for (i, f) in spec.faults.iter().enumerate() {
        sim.queue.push(f.at, Event::Fault(i as u32));
    }
    // The time of the last event that did something: a deadline or a
    // timeout left over from a request that ended does not stretch the run.
    let mut last = 0.0;
    while let Some((now, event)) = sim.queue.pop() {
        let acted = match event {
            Event::Arrival(i) => {
                sim.arrive(i as usize, now);
                true
            }
            Event::StepEnd { replica, epoch } => {
                sim.step_end(replica as usize, epoch, now);
                true
            }
            Event::Scrape => {
                sim.scrape(now);
                true
            }
            Event::Fault(i) => {
                sim.fault(i as usize, now);
                true
            }
            Event::Timeout(i) => sim.timeout(i as usize, now),
            Event::Down(r) => {
                sim.mark_down(r as usize);
                true
            }
            Event::SlotDeadline(i) => sim.slot_deadline(i as usize),
            Event::Enter(i) => {
                sim.enter(i as usize, now);
                true
            }
            Event::Release(i) => {
                sim.release(i as usize, now);
                true
            }
        };
        if acted {
            last = now;
        }
        if std::mem::take(&mut sim.slot_freed) && !sim.waiting.is_empty() {
            sim.retry_waiting(now);
        }
    }
    let events = sim.queue.handled();
    // The last token reaches its client half the network delay after its
    // step, when the proxy sees the end (the last event).
    let end = last;
    sim.out.unfinished = sim.open as u64;
    for slot in &sim.slots {
        sim.out.prefix_queries += slot.engine.stats().prefix_queries;
        sim.out.prefix_hits += slot.engine.stats().prefix_hits;
    }
    let tiers = match spec.tiers {
        Some(t) => t
            .tiers
            .iter()
            .zip(std::mem::take(&mut sim.tier_counts))
            .map(|(tier, counts)| TierResult::new(tier, counts, end))
            .collect(),
        None => Vec::new(),
    };
    let mut result = RunResult::new(
        policy,
        n,
        requests,
        sim.out,
        &mut sim.ttft,
        &mut sim.e2e,
        &sim.itl,
        sim.slots.iter().map(|s| s.dispatched).collect(),
        end,
        spec.goodput_ttft,
        events,
        started.elapsed().as_secs_f64(),
    );
    result.tiers = tiers;
    let half = spec.network_delay / 2.0;
    result.per_request = (sim.live.iter().zip(&spec.workload.requests))
        .map(|(l, r)| (l.first.map(|t| t + half - r.at), l.replica))
        .collect();
    Ok(result)
}

impl Sim<'_> {
    /// Half the network delay: the way in, or the way out.
    fn half_delay(&self) -> f64 {
        self.spec.network_delay / 2.0
    }

    fn work_left(&self) -> bool {
        self.arrived < self.live.len() || self.open > 0
    }

    fn arrive(&mut self, i: usize, now: f64) {
        let w = self.spec.workload;
        self.arrived += 1;
        if let Some(next) = w.requests.get(i + 1) {
            self.queue.push(next.at, Event::Arrival(i as u32 + 1));
        }
        let r = &w.requests[i];
        let now_ms = millis(now);
        let tier = self.spec.tiers.map(|t| usize::from(t.of_request[i]));
        if let Some(t) = tier {
            self.tier_counts[t].requests += 1;
        }
        if self.refused(i, now) {
            self.out.rejected_429 += 1;
            if let Some(t) = tier {
                self.tier_counts[t].rejected_429 += 1;
            }
            return;
        }
        w.fill_prompt(r, &mut self.prompt);
        let prompt = match &r.source {
            Source::Blocks { .. } => Prompt::Tokens(&self.prompt),
            Source::Text(p) => crate::routing::Prompt::Tokens(&p.1),
        };
        let route_tier = self.spec.tiers.and_then(|t| t.of(i).route_tier.as_deref());
        let decision = match self.decider.route(prompt, route_tier, now_ms) {
            Ok(d) => d,
            Err(_) => {
                self.out.bad_request += 1;
                return;
            }
        };
        self.dispatch(i, decision, Vec::new(), now);
    }

    /// The priority level of request `i`.
    fn level(&self, i: usize) -> usize {
        self.spec
            .tiers
            .map_or(self.default_level, |t| t.of(i).level)
    }

    /// The pool queue's admission test for arrival `i`, as `serve`'s queue
    /// makes it: refused (429) by a full level, a wait estimated beyond the
    /// level's `max_wait`, or a predicted TTFT beyond its `ttft_objective`.
    fn refused(&self, i: usize, now: f64) -> bool {
        let Some(q) = &self.pool_queue else {
            return false;
        };
        let level = self.level(i);
        let now_ms = millis(now);
        let pool = self.decider.pool();
        let capacity = queue_capacity(&pool.replicas, now_ms);
        let last = q.levels().saturating_sub(1);
        let mut depths = vec![0; last + 1];
        let mut promoted = 0;
        for w in &self.waiting {
            depths[w.level.min(last)] += 1;
            promoted += usize::from(q.lifted_ahead(level, w.level, now - w.since));
        }
        let placement = if q.has_deadline(level) {
            let prompt = u64::from(self.spec.workload.requests[i].input);
            placement_ttft(pool, prompt, now_ms)
        } else {
            Placement::default()
        };
        let standing = Standing {
            level,
            depths: &depths,
            promoted,
            capacity,
            free: self.waiting.is_empty() && self.open < capacity,
            placement,
        };
        q.refusal(standing, now).is_some()
    }
}

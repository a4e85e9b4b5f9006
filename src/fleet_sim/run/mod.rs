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
mod instances;
mod outages;
mod split;
mod steps;

use std::sync::Arc;
use std::time::Instant;

use crate::admission::estimate::Placement;
use crate::admission::fair::FairLevel;
use crate::admission::refusal::Standing;
use crate::config::Config;
use crate::pool::placement_ttft;
use crate::replica::{InFlightGuard, ReplicaId};
use crate::replica_sim::config::SimConfig;
use crate::routing::{Decision, Expected, Prompt};

use super::SimulateError;
use super::clock::{Event, EventQueue, millis};
use super::decide::Decider;
use super::faults::Fault;
use super::fleet::{self, Slot};
use super::instances::Instances;
use super::pool_queue::QueueModel;
use super::report::{Outcomes, RunResult};
use super::split_report::{RoleResult, SplitCounts, SplitResult};
use super::stats::LogHistogram;
use super::tenant_report::TenantResult;
use super::tenants::Tenants;
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
    /// The prompt tokens llmlb predicted its replica holds (prefix modes).
    predicted: Option<u64>,
    /// The time to first token the cost model expected there (`cache`,
    /// `exact`), in seconds.
    predicted_ttft: Option<f64>,
    /// The prompt tokens its replica found cached, once it finished.
    cached: Option<u32>,
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
    /// And whose mean inter-token gap (TPOT) is at most this (seconds; 0:
    /// TTFT alone).
    pub goodput_tpot: f64,
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
    /// Each request's tenant (`None`: no tenant named).
    pub tenants: Option<&'a Tenants>,
    /// How many llmlb instances send to the fleet, and whether they share
    /// a `[fleet]` store.
    pub instances: Instances,
}

struct Sim<'a> {
    spec: &'a RunSpec<'a>,
    /// The llmlb instance (the first, with `--instances`).
    decider: Decider,
    /// The other instances of `--instances`.
    others: Vec<Decider>,
    /// Per request, the instance it arrived at.
    instance_of: Vec<u16>,
    /// What the instances share, with a store.
    store: Option<instances::Store>,
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
    /// Requests waiting for a free slot, per priority level, by tenant.
    waiting: Vec<FairLevel<Waiter>>,
    /// A slot was freed by the last event: the waiters try again.
    slot_freed: bool,
    /// The pool queue, when its replicas have a `max_inflight`.
    pool_queue: Option<QueueModel>,
    /// The level of a request without a tier.
    default_level: usize,
    /// Per tier of `spec.tiers`.
    tier_counts: Vec<TierCounts>,
    /// Per tenant of `spec.tenants`, and its output tokens.
    tenant_counts: Vec<(TierCounts, u64)>,
    /// Per request, its tenant's index (closed loop: dealt as streams send).
    tenant_of: Vec<u16>,
    /// Per request, when it arrived (seconds).
    arrived_at: Vec<f64>,
    /// Closed loop: each request's end was seen by its stream.
    ended: Vec<bool>,
    /// Closed loop: the next request a stream sends.
    next_send: usize,
    /// A disaggregated pool: each request's prefill step (empty otherwise).
    split: Vec<split::SplitStep>,
    split_counts: SplitCounts,
    /// Requests waiting for a free prefill slot.
    prefill_waiting: Vec<usize>,
    /// A prefill slot was freed by the last event.
    prefill_freed: bool,
    /// Requests in their prefill step.
    prefilling: usize,
}

/// A request waiting, as `serve`'s forwarder waits, for one of the replicas
/// it may use to end a request.
struct Waiter {
    index: usize,
    decision: Decision,
    tried: Vec<ReplicaId>,
    /// It counts as waiting on these replicas (the demand a fleet store
    /// reads), as `serve`'s forwarder counts it.
    _waiting: Vec<crate::replica::state::WaitingGuard>,
}

/// Runs the workload through the fleet under `spec.config`.
pub fn run(spec: &RunSpec<'_>, policy: &str) -> Result<RunResult, SimulateError> {
    let started = Instant::now();
    let decider = Decider::new(spec.config, spec.model, spec.seed)?;
    let n = decider.fleet_size();
    let disaggregated = decider.prefill_pool().is_some();
    if let Some(f) = spec.faults.iter().find_map(|f| f.out_of_range(n)) {
        return Err(SimulateError::Invalid(format!(
            "--fault names replica {f}, but the fleet has {n} (0..{})",
            n.saturating_sub(1)
        )));
    }
    if spec.instances.several() && (disaggregated || !spec.faults.is_empty()) {
        return Err(SimulateError::Invalid(
            "--instances: not with --fault or a disaggregated pool (not modelled)".into(),
        ));
    }
    let requests = spec.workload.requests.len();
    let mut sim = Sim {
        spec,
        decider,
        others: instances::others(spec)?,
        instance_of: vec![0; requests],
        store: None,
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
        waiting: Vec::new(),
        slot_freed: false,
        pool_queue: None,
        default_level: default_level(spec.config),
        tier_counts: vec![TierCounts::default(); spec.tiers.map_or(0, |t| t.tiers.len())],
        tenant_counts: vec![Default::default(); spec.tenants.map_or(0, |t| t.tenants.len())],
        tenant_of: spec.tenants.map_or_else(Vec::new, |t| t.of_request.clone()),
        arrived_at: spec.workload.requests.iter().map(|r| r.at).collect(),
        ended: vec![false; requests],
        next_send: 0,
        split: if disaggregated {
            (0..requests).map(|_| Default::default()).collect()
        } else {
            Vec::new()
        },
        split_counts: SplitCounts::default(),
        prefill_waiting: Vec::new(),
        prefill_freed: false,
        prefilling: 0,
    };
    sim.pool_queue = QueueModel::of(sim.decider.pool());
    if let Some(q) = &mut sim.pool_queue {
        q.set_instances(1 + sim.others.len(), spec.instances.store);
    }
    let levels = sim.pool_queue.as_ref().map_or(1, |q| q.levels()).max(1);
    sim.waiting = (0..levels).map(|_| FairLevel::default()).collect();
    if let (Some(q), Some(t)) = (&mut sim.pool_queue, spec.tenants) {
        for tenant in &t.tenants {
            if let Some(w) = tenant.weight {
                q.set_weight(&tenant.name, w);
            }
        }
    }
    // `exact` mode: each replica's KV events feed every instance's record.
    let subscriptions: Vec<_> = (sim.instances())
        .flat_map(|d| {
            let pools = [Some(d.pool()), d.prefill_pool()];
            (pools.into_iter().flatten())
                .flat_map(|p| p.router.kv_subscriptions())
                .map(|(id, _, held)| (d.position(id), held))
                .collect::<Vec<_>>()
        })
        .collect();
    for (at, held) in subscriptions {
        sim.slots[at].publish_to(held);
    }
    sim.start_store();
    if sim.closed_loop() {
        let streams = spec.tenants.map_or(0, Tenants::total_streams).min(requests);
        for k in 0..streams {
            sim.arrived_at[k] = 0.0;
            sim.queue.push(0.0, Event::Arrival(k as u32));
        }
        sim.next_send = streams;
    } else {
        sim.queue
            .push(spec.workload.requests[0].at, Event::Arrival(0));
    }
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
            Event::PrefillEnter { index, attempt } => {
                sim.prefill_enter(index as usize, attempt, now);
                true
            }
            Event::PrefillAnswer { index, attempt } => {
                sim.prefill_answer(index as usize, attempt, now);
                true
            }
            Event::PrefillTimeout(i) => sim.prefill_timeout(i as usize, now),
            Event::Loaded(i) => {
                sim.load(i as usize, now);
                true
            }
            Event::HoldEnd => {
                sim.slot_freed = true;
                false
            }
            Event::Renew(k) => {
                sim.renew(k as usize, now, true);
                false
            }
            Event::Nudge(k) => {
                sim.renew(k as usize, now, false);
                false
            }
            Event::Records => {
                sim.read_records(now);
                false
            }
        };
        if acted {
            last = now;
        }
        if std::mem::take(&mut sim.prefill_freed) && !sim.prefill_waiting.is_empty() {
            sim.retry_prefills(now);
        }
        if std::mem::take(&mut sim.slot_freed) && sim.waiting.iter().any(|l| !l.is_empty()) {
            sim.retry_waiting(now);
        }
    }
    let events = sim.queue.handled();
    // The last token reaches its client half the network delay after its
    // step, when the proxy sees the end (the last event).
    let end = last;
    sim.out.unfinished = (sim.open + sim.prefilling) as u64;
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
    let label = match sim.decider.prefill_pool() {
        Some(p) => format!(
            "{policy} {}P{}D",
            p.replicas.len(),
            sim.decider.decode_replicas()
        ),
        None => format!("{policy}{}", spec.instances.label()),
    };
    let mut result = RunResult::new(
        &label,
        n,
        requests,
        sim.out,
        &mut sim.ttft,
        &mut sim.e2e,
        &sim.itl,
        // Load spread among the pool's own replicas.
        (sim.slots.iter().take(sim.decider.decode_replicas()))
            .map(|s| s.dispatched)
            .collect(),
        end,
        spec.goodput_ttft,
        events,
        started.elapsed().as_secs_f64(),
    );
    result.tiers = tiers;
    result.goodput_tpot_s = spec.goodput_tpot;
    result.instances = spec.instances.count;
    result.peak_per_replica = (sim.slots.iter().take(sim.decider.decode_replicas()))
        .map(|s| s.peak)
        .collect();
    result.max_inflight = sim
        .decider
        .pool()
        .replicas
        .iter()
        .filter_map(|r| r.max_inflight)
        .max();
    if disaggregated {
        let decode = sim.decider.decode_replicas();
        let role = |role: &'static str, slots: &[Slot]| RoleResult {
            role,
            replicas: slots.len(),
            dispatched: slots.iter().map(|s| s.dispatched).sum(),
            prefill_tokens: (slots.iter())
                .map(|s| s.engine.stats().request_prefill_computed.sum as u64)
                .sum(),
            sampled_tokens: slots.iter().map(|s| s.tokens).sum(),
            busy: slots.iter().map(|s| s.busy_s).sum::<f64>()
                / (slots.len().max(1) as f64 * end.max(1e-9)),
        };
        let roles = vec![
            role("prefill", &sim.slots[decode..]),
            role("decode", &sim.slots[..decode]),
        ];
        result.split = Some(SplitResult::new(
            std::mem::take(&mut sim.split_counts),
            roles,
        ));
    }
    if let Some(t) = spec.tenants {
        result.tenants = (t.tenants.iter())
            .zip(std::mem::take(&mut sim.tenant_counts))
            .map(|(tenant, (counts, tokens))| TenantResult::new(tenant, counts, tokens, end))
            .collect();
    }
    let half = spec.network_delay / 2.0;
    result.per_request = (sim.live.iter().zip(sim.arrived_at.iter().copied()))
        .map(|(l, at)| (l.first.map(|t| t + half - at), l.replica))
        .collect();
    result.per_request_cache = sim.live.iter().map(|l| (l.predicted, l.cached)).collect();
    result.per_request_predicted_ttft = sim.live.iter().map(|l| l.predicted_ttft).collect();
    Ok(result)
}

impl Sim<'_> {
    /// Half the network delay: the way in, or the way out.
    fn half_delay(&self) -> f64 {
        self.spec.network_delay / 2.0
    }

    fn work_left(&self) -> bool {
        self.arrived < self.live.len() || self.open > 0 || self.prefilling > 0
    }

    fn arrive(&mut self, i: usize, now: f64) {
        let w = self.spec.workload;
        self.arrived += 1;
        self.assign_instance(i);
        if let Some(next) = w.requests.get(i + 1).filter(|_| !self.closed_loop()) {
            self.queue.push(next.at, Event::Arrival(i as u32 + 1));
        }
        let r = &w.requests[i];
        let now_ms = millis(now);
        let tier = self.spec.tiers.map(|t| usize::from(t.of_request[i]));
        if let Some(t) = tier {
            self.tier_counts[t].requests += 1;
        }
        let tenant = self.spec.tenants.map(|_| usize::from(self.tenant_of[i]));
        if let Some(t) = tenant {
            self.tenant_counts[t].0.requests += 1;
        }
        if self.refused(i, now) {
            self.out.rejected_429 += 1;
            if let Some(t) = tier {
                self.tier_counts[t].rejected_429 += 1;
            }
            if let Some(t) = tenant {
                self.tenant_counts[t].0.rejected_429 += 1;
            }
            self.finished(i, now);
            return;
        }
        let level = self.level(i);
        let k = usize::from(self.instance_of[i]);
        if let Some(q) = &mut self.pool_queue {
            q.arrived(level, now, k);
        }
        w.fill_prompt(r, &mut self.prompt);
        let prompt = match &r.source {
            Source::Blocks { .. } => Prompt::Tokens(&self.prompt),
            Source::Text(p) => crate::routing::Prompt::Tokens(&p.1),
        };
        let route_tier = self.spec.tiers.and_then(|t| t.of(i).route_tier.as_deref());
        let decider = if k == 0 {
            &mut self.decider
        } else {
            &mut self.others[k - 1]
        };
        let mut decision = match decider.route(prompt, route_tier, r.output, now_ms) {
            Ok(d) => d,
            Err(_) => {
                self.out.bad_request += 1;
                self.finished(i, now);
                return;
            }
        };
        if self.disaggregated() {
            match self.split_or_local(i, decision, route_tier, now) {
                Some(d) => decision = d,
                None => return,
            }
        }
        if self.held_back(i, now) {
            let waiter = self.wait_for_slot(i, decision, Vec::new(), Vec::new(), now);
            self.park(waiter);
        } else if let Some(waiter) = self.dispatch(i, decision, Vec::new(), now) {
            self.park(waiter);
        }
    }

    /// The priority level of request `i`.
    fn level(&self, i: usize) -> usize {
        let level = self
            .spec
            .tiers
            .map_or(self.default_level, |t| t.of(i).level);
        level.min(self.waiting.len().saturating_sub(1))
    }

    /// The tenant of request `i` (empty: none).
    fn tenant(&self, i: usize) -> Arc<str> {
        self.spec.tenants.map_or_else(
            || Arc::from(""),
            |t| Arc::clone(&t.tenants[usize::from(self.tenant_of[i])].name),
        )
    }

    /// Whether tenants send in closed loops (`--tenants NAME=streams:N`).
    fn closed_loop(&self) -> bool {
        self.spec.tenants.is_some_and(|t| !t.streams.is_empty())
    }

    /// Request `i` ended as its client sees it (answered, failed or
    /// refused): in a closed loop its stream sends the next request now.
    fn finished(&mut self, i: usize, now: f64) {
        if !self.closed_loop() || std::mem::replace(&mut self.ended[i], true) {
            return;
        }
        let j = self.next_send;
        if j < self.live.len() {
            self.next_send += 1;
            self.tenant_of[j] = self.tenant_of[i];
            self.arrived_at[j] = now;
            self.queue.push(now, Event::Arrival(j as u32));
        }
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
        let capacity = self.capacity(now_ms);
        let depths: Vec<usize> = self.waiting.iter().map(FairLevel::len).collect();
        let promoted = (self.waiting.iter().enumerate())
            .skip(level + 1)
            .map(|(l, w)| w.count_prefix(|since| q.lifted_ahead(level, l, now - since)))
            .sum();
        let tenant = self.tenant(i);
        let fair = q.fairness();
        let at_level = &self.waiting[level];
        let held = self.held(now);
        let free = self.open < capacity
            && (at_level.holds_for(&tenant, now)
                || depths.iter().all(|&d| d == 0) && self.open + held < capacity);
        let placement = if q.has_deadline(level) {
            let prompt = u64::from(self.spec.workload.requests[i].input);
            placement_ttft(pool, prompt, now_ms)
        } else {
            Placement::default()
        };
        let standing = Standing {
            level,
            depths: &depths,
            level_ahead: at_level.ahead(fair.enabled, &tenant, fair.weight(&tenant)),
            tenant_depth: at_level.depth(&tenant),
            tenant_max_depth: fair.max_depth(&tenant),
            promoted,
            capacity,
            free,
            placement,
        };
        q.refusal(standing, now, usize::from(self.instance_of[i]))
            .is_some()
    }
}

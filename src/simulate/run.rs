//! One policy over one workload: the discrete-event loop.
//!
//! Events (see [`Event`]) come off one heap in time order:
//! - **arrival**: the decision adapter routes and picks exactly as `serve`
//!   does, the request takes a real in-flight guard on the chosen
//!   [`Replica`](crate::balancing::Replica) and enters that replica's engine;
//!   an idle engine starts a step at once. A dead replica refuses the
//!   connection (the pool records the failure and the next attempt goes
//!   elsewhere, up to `retries`); a hung one swallows the request until the
//!   pool's first-byte timeout.
//! - **step end**: the step's tokens and finished requests are delivered at
//!   its end time (TTFT, inter-token gaps, end-to-end; the guard shrinks with
//!   each token and is dropped at the end), and the next step starts.
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

use std::collections::VecDeque;
use std::time::Instant;

use crate::balancing::{InFlightGuard, ReplicaId};
use crate::config::Config;
use crate::routing::{Choice, Decision, Failure, Prompt, queue_capacity};
use crate::sim::config::SimConfig;
use crate::sim::engine::{NewRequest, StepOutcome};

use super::SimulateError;
use super::clock::{Event, EventQueue, millis};
use super::decide::Decider;
use super::faults::{Fault, FaultKind};
use super::fleet::{self, Slot, State};
use super::pool_queue::QueueModel;
use super::report::{Outcomes, RunResult};
use super::stats::LogHistogram;
use super::workload::{SimWorkload, Source};

/// A request's progress.
#[derive(Debug, Default)]
struct Live {
    guard: Option<InFlightGuard>,
    replica: u32,
    first: Option<f64>,
    last: f64,
    open: bool,
    /// Its wait for a free slot has a deadline event already.
    slot_deadline: bool,
    /// When it was sent to its replica (seconds).
    dispatched_at: f64,
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
    /// response: the network, the proxy and the replica's HTTP front. Every
    /// token reaches the client this much after its step ends (TTFT and
    /// end-to-end grow by it, inter-token gaps do not). 0: none.
    pub network_delay: f64,
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
}

/// A request waiting, as `serve`'s forwarder waits, for one of the replicas
/// it may use to end a request.
struct Waiter {
    index: usize,
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
    };
    sim.pool_queue = QueueModel::of(sim.decider.pool());
    sim.queue
        .push(spec.workload.requests[0].at, Event::Arrival(0));
    if sim.decider.pool().scrape.is_some() {
        sim.queue.push(0.0, Event::Scrape);
    }
    for (i, f) in spec.faults.iter().enumerate() {
        sim.queue.push(f.at, Event::Fault(i as u32));
    }
    while let Some((now, event)) = sim.queue.pop() {
        match event {
            Event::Arrival(i) => sim.arrive(i as usize, now),
            Event::StepEnd { replica, epoch } => sim.step_end(replica as usize, epoch, now),
            Event::Scrape => sim.scrape(now),
            Event::Fault(i) => sim.fault(i as usize, now),
            Event::Timeout(i) => sim.timeout(i as usize, now),
            Event::Down(r) => sim.mark_down(r as usize),
            Event::SlotDeadline(i) => sim.slot_deadline(i as usize),
        }
        if std::mem::take(&mut sim.slot_freed) && !sim.waiting.is_empty() {
            sim.retry_waiting(now);
        }
    }
    let events = sim.queue.handled();
    // The last token reaches its client `network_delay` after its step.
    let end = sim.queue.now() + spec.network_delay;
    sim.out.unfinished = sim.open as u64;
    for slot in &sim.slots {
        sim.out.prefix_queries += slot.engine.stats().prefix_queries;
        sim.out.prefix_hits += slot.engine.stats().prefix_hits;
    }
    Ok(RunResult::new(
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
    ))
}

impl Sim<'_> {
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
        w.fill_prompt(r, &mut self.prompt);
        let prompt = match &r.source {
            Source::Blocks { .. } => Prompt::Tokens(&self.prompt),
            Source::Text(p) => crate::routing::Prompt::Tokens(&p.1),
        };
        let decision = match self.decider.route(prompt, now_ms) {
            Ok(d) => d,
            Err(_) => {
                self.out.bad_request += 1;
                return;
            }
        };
        self.dispatch(i, decision, Vec::new(), now);
    }

    /// Sends request `i` (its prompt in `self.prompt`) to the replica the
    /// forwarder's choice names, retrying refused connections up to the
    /// pool's `retries`, or parks it until a slot frees.
    fn dispatch(&mut self, i: usize, decision: Decision, mut tried: Vec<ReplicaId>, now: f64) {
        let r = &self.spec.workload.requests[i];
        let now_ms = millis(now);
        let retries = self.decider.pool().retries as usize;
        loop {
            let info = self.decider.info(r.input, r.output);
            let replica = match self.decider.choose(&decision, &tried, &info, now_ms) {
                Choice::Pick(replica, _) => replica,
                Choice::Wait(_) => {
                    if !std::mem::replace(&mut self.live[i].slot_deadline, true) {
                        // A newcomer: the queue may refuse it (429).
                        let pool = self.decider.pool();
                        let capacity = queue_capacity(&pool.replicas, now_ms);
                        let timeout = match &self.pool_queue {
                            Some(q) if q.refuses(self.waiting.len(), capacity) => {
                                return self.out.rejected_429 += 1;
                            }
                            Some(q) => q.timeout,
                            None => pool.timeouts.first_byte.as_secs_f64(),
                        };
                        self.queue
                            .push(now + timeout, Event::SlotDeadline(i as u32));
                    }
                    self.waiting.push_back(Waiter {
                        index: i,
                        decision,
                        tried,
                    });
                    return;
                }
                Choice::NoReplica(_) if tried.is_empty() => return self.out.no_replica += 1,
                Choice::NoReplica(_) => return self.out.upstream += 1,
            };
            decision.dispatched(&replica);
            tried.push(replica.id);
            let at = self.decider.position(replica.id);
            let guard = replica.acquire_tokens(u64::from(r.input), u64::from(r.output));
            self.slots[at].dispatched += 1;
            match self.slots[at].state {
                State::Dead => {
                    drop(guard);
                    let pool = self.decider.pool();
                    pool.record_failure_at(
                        &replica,
                        Failure::Connect,
                        self.decider.metrics(),
                        now_ms,
                    );
                    if tried.len() > retries {
                        return self.out.upstream += 1;
                    }
                }
                State::Hung => {
                    self.open_request(i, at, guard, now);
                    let wait = self.decider.pool().timeouts.first_byte.as_secs_f64();
                    self.queue.push(now + wait, Event::Timeout(i as u32));
                    return;
                }
                State::Up => {
                    let req = NewRequest {
                        id: i as u64,
                        prompt: std::mem::take(&mut self.prompt),
                        max_tokens: r.output as usize,
                        priority: 0,
                    };
                    if self.slots[at].engine.add_request(req, now).is_err() {
                        // The replica answers 400 (context too long).
                        self.out.too_long += 1;
                        return;
                    }
                    self.open_request(i, at, guard, now);
                    if self.slots[at].pending.is_none() {
                        self.start_step(at, now);
                    }
                    return;
                }
            }
        }
    }

    fn open_request(&mut self, i: usize, at: usize, guard: InFlightGuard, now: f64) {
        self.live[i] = Live {
            guard: Some(guard),
            replica: at as u32,
            first: None,
            last: 0.0,
            open: true,
            slot_deadline: self.live[i].slot_deadline,
            dispatched_at: now,
        };
        self.open += 1;
    }

    fn close(&mut self, i: usize) {
        let l = &mut self.live[i];
        if l.open {
            l.open = false;
            l.guard = None;
            self.open -= 1;
            self.slot_freed = true;
        }
    }

    /// After a slot freed: every waiter, oldest first, tries again (those
    /// still without a slot keep their place).
    fn retry_waiting(&mut self, now: f64) {
        for _ in 0..self.waiting.len() {
            let Some(w) = self.waiting.pop_front() else {
                break;
            };
            let r = &self.spec.workload.requests[w.index];
            self.spec.workload.fill_prompt(r, &mut self.prompt);
            self.dispatch(w.index, w.decision, w.tried, now);
        }
    }

    /// A waiter's deadline: still without a slot, it gets `serve`'s 503.
    fn slot_deadline(&mut self, i: usize) {
        if let Some(pos) = self.waiting.iter().position(|w| w.index == i) {
            self.waiting.remove(pos);
            self.out.slot_timeout += 1;
        }
    }

    fn start_step(&mut self, at: usize, now: f64) {
        let slot = &mut self.slots[at];
        if slot.state != State::Up || !slot.engine.has_work() {
            return;
        }
        let out = slot.engine.step(now);
        if out.is_idle() {
            // Nothing can run (no cache room): wait for the next arrival.
            return;
        }
        self.queue.push(
            out.end,
            Event::StepEnd {
                replica: at as u32,
                epoch: slot.epoch,
            },
        );
        slot.pending = Some(out);
    }

    fn step_end(&mut self, at: usize, epoch: u32, now: f64) {
        if self.slots[at].epoch != epoch {
            return;
        }
        let Some(out) = self.slots[at].pending.take() else {
            return;
        };
        self.deliver(at, &out, now);
        self.start_step(at, now);
    }

    fn deliver(&mut self, at: usize, out: &StepOutcome, now: f64) {
        let arrivals = &self.spec.workload.requests;
        self.slots[at].tokens += out.tokens.len() as u64;
        self.out.output_tokens += out.tokens.len() as u64;
        for t in &out.tokens {
            let i = t.id as usize;
            let l = &mut self.live[i];
            match l.first {
                None => {
                    l.first = Some(now);
                    self.ttft
                        .push(now + self.spec.network_delay - arrivals[i].at);
                    if let Some(g) = &mut l.guard {
                        g.prefill_done();
                    }
                    let pool = self.decider.pool();
                    if let Some(g) = &l.guard {
                        g.replica().outlier.on_success(millis(now), &pool.outlier);
                    }
                }
                Some(_) => self.itl.observe(now - l.last),
            }
            l.last = now;
            if let Some(g) = &mut l.guard {
                g.produced(1);
            }
        }
        self.out.preemptions += out.preempted.len() as u64;
        for f in &out.finished {
            let i = f.id as usize;
            self.e2e
                .push(now + self.spec.network_delay - arrivals[i].at);
            self.out.completed += 1;
            self.out.prompt_tokens += f.prompt_tokens as u64;
            self.out.cached_tokens += f.cached_tokens as u64;
            if self.live[i].first.is_some_and(|t| {
                t + self.spec.network_delay - arrivals[i].at <= self.spec.goodput_ttft
            }) {
                self.out.within_objective += 1;
            }
            if let Some(q) = &mut self.pool_queue {
                q.served(now - self.live[i].dispatched_at);
            }
            self.close(i);
        }
    }

    fn scrape(&mut self, now: f64) {
        let now_ms = millis(now);
        let pool = std::sync::Arc::clone(self.decider.pool());
        for (slot, replica) in self.slots.iter().zip(&pool.replicas) {
            if slot.state == State::Up {
                replica.store_load(slot.snapshot(now_ms));
            }
        }
        if self.work_left()
            && let Some(s) = &pool.scrape
        {
            self.queue
                .push(now + s.interval.as_secs_f64().max(1e-3), Event::Scrape);
        }
    }

    fn fault(&mut self, i: usize, now: f64) {
        let fault = &self.spec.faults[i];
        for &r in &fault.replicas {
            match fault.kind {
                FaultKind::Slow(f) => self.slots[r].engine.set_slowdown(f),
                FaultKind::Kill => self.stop(r, State::Dead, now),
                FaultKind::Hang => self.stop(r, State::Hung, now),
            }
        }
    }

    /// A replica dies or hangs: its step never ends; health checks notice.
    fn stop(&mut self, r: usize, state: State, now: f64) {
        let slot = &mut self.slots[r];
        if slot.state != State::Up {
            return;
        }
        slot.state = state;
        slot.epoch += 1;
        slot.pending = None;
        let open: Vec<usize> = (0..self.live.len())
            .filter(|&i| self.live[i].open && self.live[i].replica as usize == r)
            .collect();
        let timeouts = self.decider.pool().timeouts.clone();
        for i in open {
            match state {
                // The connection breaks: the client sees an error at once.
                State::Dead => {
                    self.out.upstream += 1;
                    self.close(i);
                }
                // The stream stalls until the proxy's idle (or first-byte) timeout.
                _ => {
                    let wait = if self.live[i].first.is_some() {
                        timeouts.idle
                    } else {
                        timeouts.first_byte
                    };
                    self.queue
                        .push(now + wait.as_secs_f64(), Event::Timeout(i as u32));
                }
            }
        }
        let health = &self.decider.pool().health;
        if health.enabled {
            let after = health.interval.as_secs_f64() * f64::from(health.fall.max(1));
            self.queue.push(now + after, Event::Down(r as u32));
        }
    }

    fn timeout(&mut self, i: usize, now: f64) {
        if !self.live[i].open {
            return;
        }
        let r = self.live[i].replica as usize;
        let pool = std::sync::Arc::clone(self.decider.pool());
        pool.record_failure_at(
            &pool.replicas[r],
            Failure::Timeout,
            self.decider.metrics(),
            millis(now),
        );
        self.out.timeout += 1;
        self.close(i);
    }

    fn mark_down(&mut self, r: usize) {
        let pool = self.decider.pool();
        let h = &pool.health;
        for _ in 0..h.fall.max(1) {
            pool.replicas[r].health.record(false, h.fall, h.rise);
        }
    }
}

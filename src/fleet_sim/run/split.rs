//! The prefill step of a disaggregated pool's request on the virtual clock,
//! as `serve` runs it (`server::disaggregate`, `forwarding::prefill`): the
//! pool's own decision ([`crate::pool::Disaggregation::decide`]) on the
//! routing decision within the decode pool; for a disaggregated request,
//! a route within the prefill pool and the forwarder's choice of a prefill
//! replica, whose engine prefills the prompt and samples one token
//! (`max_tokens = 1`); its answer, back at the proxy, sends the request to
//! a decode replica chosen then. The decode replica waits for the prompt's
//! KV cache (the transfer time of the prompt tokens its own prefix cache
//! lacks, [`RoleConfig::transfer_time`](crate::replica_sim::role::RoleConfig::transfer_time),
//! as `llmlb replica-sim --role decode` waits) and enters it with the
//! prompt computed: its first step samples the first token as one more
//! decoding sequence, so its batches hold no prefill of that prompt.
//!
//! Failures follow `serve`: a prefill replica that refuses the connection
//! or dies mid-prefill moves the prefill to another one, up to
//! `prefill_attempts`; a hung one, or a wait for a free prefill slot, ends
//! at `prefill_timeout` after the first attempt. Then the decode replica
//! prefills itself (`fallback`, branch `fallback`) or the client gets the
//! error. A pool whose prefill pool has no replica to take the request
//! decides `no_prefill_replica`. Every request is counted once, under the
//! branch it ended in.
//!
//! Each phase of a disaggregated request's time to first token is recorded
//! ([`SplitCounts`](crate::fleet_sim::split_report::SplitCounts)), and the
//! time from sending it to its decode replica to its first byte teaches the
//! pool the hop's cost, as `serve` learns it.

use crate::fleet_sim::clock::{Event, millis};
use crate::fleet_sim::fleet::State;
use crate::pool::{Choice, Failure, SplitBranch};
use crate::replica::{InFlightGuard, ReplicaId};
use crate::replica_sim::engine::NewRequest;
use crate::routing::{Decision, Expected, Prompt};

use super::Sim;

/// Where a request of a disaggregated pool stands.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Prefilled by its decode replica (or not in a disaggregated pool).
    #[default]
    Local,
    /// On the prefill pool.
    Prefill,
    /// Prefilled elsewhere: its decode replica loads the KV cache.
    Loaded,
}

/// One request's prefill step.
#[derive(Debug, Default)]
pub(super) struct SplitStep {
    pub phase: Phase,
    branch: Option<SplitBranch>,
    /// The routing decision within the decode pool, kept for the decode.
    decision: Option<Decision>,
    /// The routing decision within the prefill pool.
    route: Option<Decision>,
    tried: Vec<ReplicaId>,
    /// The prefill replica's in-flight guard, while an attempt is under way.
    guard: Option<InFlightGuard>,
    /// In `exact` mode, the prompt counted as sent to the prefill replica
    /// while the attempt lives.
    expected: Option<Expected>,
    /// The prefill replica of the attempt under way.
    at: u32,
    /// Numbers the attempts: an event of an earlier one is stale.
    attempt: u32,
    /// The first attempt.
    started: f64,
    /// When the KV cache reached the decode engine.
    pub kv_at: f64,
}

impl Sim<'_> {
    /// Whether the pool is disaggregated.
    pub(super) fn disaggregated(&self) -> bool {
        !self.split.is_empty()
    }

    /// Request `i` has its KV cache from a prefill replica.
    pub(super) fn loaded(&self, i: usize) -> bool {
        self.split.get(i).is_some_and(|s| s.phase == Phase::Loaded)
    }

    /// An arrival routed within a disaggregated pool (its prompt in
    /// `self.prompt`): the decision back when the decode replica prefills,
    /// `None` when the prefill step took the request (or it failed).
    pub(super) fn split_or_local(
        &mut self,
        i: usize,
        decision: Decision,
        route_tier: Option<&str>,
        now: f64,
    ) -> Option<Decision> {
        let r = &self.spec.workload.requests[i];
        let now_ms = millis(now);
        let info = self.decider.info(r.input, r.output);
        let branch = self.decider.split(&decision, &info, now_ms)?;
        if !branch.disaggregates() {
            self.split_counts.decided(branch);
            return Some(decision);
        }
        let route =
            self.decider
                .route_prefill(Prompt::Tokens(&self.prompt), route_tier, r.output, now_ms);
        let s = &mut self.split[i];
        s.decision = Some(decision);
        s.branch = Some(branch);
        let Some(route) = route else {
            s.phase = Phase::Prefill;
            self.prefilling += 1;
            self.resume_local(i, SplitBranch::NoPrefillReplica, now);
            return None;
        };
        s.phase = Phase::Prefill;
        s.route = Some(route);
        s.started = now;
        self.prefilling += 1;
        let timeout = self.disaggregation_config().prefill_timeout.as_secs_f64();
        self.queue
            .push(now + timeout, Event::PrefillTimeout(i as u32));
        self.try_prefill(i, now);
        None
    }

    fn disaggregation_config(&self) -> &crate::config::DisaggregationConfig {
        &(self.decider.pool().disaggregation.as_ref())
            .expect("a disaggregated pool")
            .config
    }

    /// The next prefill attempt of request `i`.
    fn try_prefill(&mut self, i: usize, now: f64) {
        let now_ms = millis(now);
        let attempts = self.disaggregation_config().prefill_attempts as usize;
        let input = self.spec.workload.requests[i].input;
        loop {
            let s = &self.split[i];
            if s.tried.len() >= attempts {
                self.resume_local(i, SplitBranch::Fallback, now);
                return;
            }
            let route = s.route.as_ref().expect("a routed prefill");
            let choice = (self.decider)
                .choose_prefill(route, &s.tried, input, now_ms)
                .expect("a disaggregated pool has a prefill pool");
            let replica = match choice {
                Choice::Pick(replica, _) => replica,
                Choice::Wait(_) => {
                    // Until a prefill slot frees, or the prefill timeout.
                    self.prefill_waiting.push(i);
                    return;
                }
                Choice::NoReplica(_) => {
                    let branch = if s.tried.is_empty() {
                        SplitBranch::NoPrefillReplica
                    } else {
                        SplitBranch::Fallback
                    };
                    self.resume_local(i, branch, now);
                    return;
                }
            };
            let mut guard = replica.acquire_tokens(u64::from(input), 1);
            let expected = route.dispatched_with(&mut guard).sent;
            if let Some(a) = &route.adapter {
                guard.run_adapter(a);
            }
            let at = self.decider.position(replica.id);
            self.slots[at].dispatched += 1;
            let s = &mut self.split[i];
            s.tried.push(replica.id);
            match self.slots[at].state {
                State::Dead => {
                    drop(guard);
                    self.prefill_failed(at, Failure::Connect, now);
                }
                State::Hung => {
                    // Swallowed until the prefill timeout.
                    s.guard = Some(guard);
                    s.expected = expected;
                    s.at = at as u32;
                    return;
                }
                State::Up => {
                    s.guard = Some(guard);
                    s.expected = expected;
                    s.at = at as u32;
                    s.attempt += 1;
                    let event = Event::PrefillEnter {
                        index: i as u32,
                        attempt: s.attempt,
                    };
                    self.queue.push(now + self.half_delay(), event);
                    return;
                }
            }
        }
    }

    /// A prefill attempt on replica `at` failed.
    fn prefill_failed(&mut self, at: usize, failure: Failure, now: f64) {
        self.split_counts.prefill_failures += 1;
        let pool = self.decider.pool_at(at);
        let replica = self.decider.replica(at);
        pool.record_failure_at(replica, failure, self.decider.metrics(), millis(now));
    }

    /// The prefill request reaches its replica's engine.
    pub(super) fn prefill_enter(&mut self, i: usize, attempt: u32, now: f64) {
        let s = &self.split[i];
        if s.phase != Phase::Prefill || s.attempt != attempt || s.guard.is_none() {
            return;
        }
        let at = s.at as usize;
        if self.slots[at].state != State::Up {
            return;
        }
        let r = &self.spec.workload.requests[i];
        let mut prompt = Vec::new();
        self.spec.workload.fill_prompt(r, &mut prompt);
        let req = NewRequest {
            id: i as u64,
            prompt,
            max_tokens: 1,
            priority: 0,
            external_tokens: 0,
        };
        if self.slots[at].engine.add_request(req, now).is_err() {
            // Answered 400 (too long for the replica): the next attempt,
            // the replica not blamed (`serve` counts only 5xx against it).
            self.split[i].guard = None;
            self.split[i].expected = None;
            self.prefill_freed = true;
            self.split_counts.prefill_failures += 1;
            self.try_prefill(i, now);
            return;
        }
        if self.slots[at].pending.is_none() {
            self.start_step(at, now);
        }
    }

    /// A prefill replica's step ended: its finished prefills answer the
    /// proxy half the network delay later.
    pub(super) fn prefill_delivered(
        &mut self,
        at: usize,
        out: &crate::replica_sim::engine::StepOutcome,
    ) {
        self.slots[at].tokens += out.tokens.len() as u64;
        self.out.preemptions += out.preempted.len() as u64;
        let now = self.queue.now();
        for f in &out.finished {
            let i = f.id as usize;
            let s = &self.split[i];
            if s.phase != Phase::Prefill || s.at as usize != at {
                continue;
            }
            let event = Event::PrefillAnswer {
                index: i as u32,
                attempt: s.attempt,
            };
            self.queue.push(now + self.half_delay(), event);
        }
    }

    /// The prefill answer is at the proxy: the request goes to a decode
    /// replica.
    pub(super) fn prefill_answer(&mut self, i: usize, attempt: u32, now: f64) {
        let s = &mut self.split[i];
        if s.phase != Phase::Prefill || s.attempt != attempt || s.guard.is_none() {
            return;
        }
        let at = s.at as usize;
        s.guard = None;
        s.expected = None;
        s.phase = Phase::Loaded;
        let branch = s.branch.expect("a disaggregated request has its branch");
        let decision = s.decision.take().expect("the decode decision is kept");
        let prefill = now - s.started;
        self.prefill_freed = true;
        self.prefilling -= 1;
        self.split_counts.decided(branch);
        self.split_counts.prefill_s.push(prefill);
        self.decider
            .pool_at(at)
            .record_success(self.decider.replica(at));
        self.decode(i, decision, now);
    }

    /// Request `i` goes to its decode pool.
    fn decode(&mut self, i: usize, decision: Decision, now: f64) {
        let r = &self.spec.workload.requests[i];
        self.spec.workload.fill_prompt(r, &mut self.prompt);
        if let Some(waiter) = self.dispatch(i, decision, Vec::new(), now) {
            self.park(waiter);
        }
    }

    /// The prefill step of request `i` ends without a prefill: its decode
    /// replica prefills it (`fallback`), or the client gets the error.
    fn resume_local(&mut self, i: usize, branch: SplitBranch, now: f64) {
        let s = &mut self.split[i];
        s.phase = Phase::Local;
        s.guard = None;
        s.expected = None;
        s.route = None;
        let decision = s.decision.take().expect("the decode decision is kept");
        self.prefilling -= 1;
        self.prefill_freed = true;
        self.split_counts.decided(branch);
        if self.disaggregation_config().fallback {
            self.decode(i, decision, now);
        } else {
            if branch == SplitBranch::NoPrefillReplica {
                self.out.no_replica += 1;
            } else {
                self.out.upstream += 1;
            }
            self.finished(i, now);
        }
    }

    /// `prefill_timeout` after the first attempt: a prefill still under way
    /// (or waiting for a slot) is given up.
    pub(super) fn prefill_timeout(&mut self, i: usize, now: f64) -> bool {
        if self.split[i].phase != Phase::Prefill {
            return false;
        }
        self.prefill_waiting.retain(|&w| w != i);
        self.split[i].expected = None;
        if self.split[i].guard.take().is_some() {
            let at = self.split[i].at as usize;
            self.prefill_failed(at, Failure::Timeout, now);
            // The proxy drops the connection: the replica aborts it.
            if self.slots[at].state == State::Up {
                self.slots[at].engine.abort(i as u64);
            }
        }
        self.resume_local(i, SplitBranch::Fallback, now);
        true
    }

    /// A prefill slot freed: the requests waiting for one try again.
    pub(super) fn retry_prefills(&mut self, now: f64) {
        for i in std::mem::take(&mut self.prefill_waiting) {
            if self.split[i].phase == Phase::Prefill && self.split[i].guard.is_none() {
                self.try_prefill(i, now);
            }
        }
    }

    /// Prefill replica `at` died: its prefills under way move on.
    pub(super) fn prefill_replica_died(&mut self, at: usize, now: f64) {
        let broken: Vec<usize> = (0..self.split.len())
            .filter(|&i| {
                let s = &self.split[i];
                s.phase == Phase::Prefill && s.guard.is_some() && s.at as usize == at
            })
            .collect();
        for i in broken {
            self.split[i].guard = None;
            self.split[i].expected = None;
            self.prefill_failed(at, Failure::Reset, now);
            self.try_prefill(i, now);
        }
    }

    /// A loaded request reached its decode engine: the transfer first.
    /// Returns its transfer time (the request enters at once when 0).
    pub(super) fn transfer_time(&self, at: usize, prompt: &[u32]) -> f64 {
        let cached = self.slots[at].engine.cached_prefix_tokens(prompt);
        let sent = prompt.len().saturating_sub(cached);
        self.spec.profile.disaggregation.transfer_time(sent)
    }
}

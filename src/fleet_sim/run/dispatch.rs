//! Sending a request to a replica: the forwarder's choice, refused
//! connections and retries, hung replicas, and the wait for a free slot
//! (`max_inflight`) with its deadline, waiters served by priority level
//! (with aging) and within one by the pool queue's fair share among
//! tenants ([`crate::admission::fair`], the structure `serve`'s queue
//! keeps), charged with each request's prompt at dispatch and its output
//! when the proxy sees its end.

use std::sync::Arc;

use crate::admission::Level;
use crate::admission::fair::{Entry, FairLevel, anticipate};
use crate::admission::refusal::next_level;
use crate::fleet_sim::clock::{Event, millis};
use crate::fleet_sim::fleet::State;
use crate::pool::{Choice, Failure};
use crate::replica::state::WaitingGuard;
use crate::replica::{InFlightGuard, ReplicaId};
use crate::replica_sim::engine::NewRequest;
use crate::routing::Decision;

use super::{Live, Sim, Waiter};

impl Sim<'_> {
    /// Sends request `i` (its prompt in `self.prompt`) to the replica the
    /// forwarder's choice names, retrying refused connections up to the
    /// pool's `retries`; or returns it, to wait until a slot frees.
    #[must_use]
    pub(super) fn dispatch(
        &mut self,
        i: usize,
        decision: Decision,
        mut tried: Vec<ReplicaId>,
        now: f64,
    ) -> Option<Waiter> {
        let r = &self.spec.workload.requests[i];
        let now_ms = millis(now);
        let retries = self.decider.pool().retries as usize;
        loop {
            let instance = self.instance(i);
            let info = instance.info(r.input, r.output);
            let replica = match instance.choose(&decision, &tried, &info, now_ms) {
                Choice::Pick(replica, _) => replica,
                Choice::Wait(candidates) => {
                    let waiting = candidates.iter().map(|c| c.wait_here()).collect();
                    self.nudge(usize::from(self.instance_of[i]), now);
                    return Some(self.wait_for_slot(i, decision, tried, waiting, now));
                }
                Choice::NoReplica(_) if tried.is_empty() => {
                    self.out.no_replica += 1;
                    self.finished(i, now);
                    return None;
                }
                Choice::NoReplica(_) => {
                    self.out.upstream += 1;
                    self.finished(i, now);
                    return None;
                }
            };
            let mut guard = replica.acquire_tokens(u64::from(r.input), u64::from(r.output));
            let expected = decision.dispatched_with(&mut guard).sent;
            if let Some(a) = &decision.adapter {
                guard.run_adapter(a);
            }
            tried.push(replica.id);
            let at = self.instance(i).position(replica.id);
            self.slots[at].dispatched += 1;
            match self.slots[at].state {
                State::Dead => {
                    drop(guard);
                    let instance = self.instance(i);
                    instance.pool().record_failure_at(
                        &replica,
                        Failure::Connect,
                        instance.metrics(),
                        now_ms,
                    );
                    if tried.len() > retries {
                        self.out.upstream += 1;
                        self.finished(i, now);
                        return None;
                    }
                }
                State::Hung => {
                    self.open_request(i, at, guard, now);
                    self.live[i].expected = expected;
                    let wait = self.decider.pool().timeouts.first_byte.as_secs_f64();
                    self.queue.push(now + wait, Event::Timeout(i as u32));
                    return None;
                }
                State::Up => {
                    self.open_request(i, at, guard, now);
                    self.live[i].expected = expected;
                    self.live[i].predicted = decision.predicted_for(replica.id);
                    self.live[i].predicted_ttft = decision.predicted_ttft_for(replica.id);
                    self.live[i].prompt = std::mem::take(&mut self.prompt);
                    let half = self.half_delay();
                    if half > 0.0 {
                        self.queue.push(now + half, Event::Enter(i as u32));
                    } else {
                        self.enter(i, now);
                    }
                    return None;
                }
            }
        }
    }

    /// Request `i` waits for a free slot; a newcomer (admitted on arrival)
    /// may wait until the queue's timeout.
    pub(super) fn wait_for_slot(
        &mut self,
        i: usize,
        decision: Decision,
        tried: Vec<ReplicaId>,
        waiting: Vec<WaitingGuard>,
        now: f64,
    ) -> Waiter {
        if !std::mem::replace(&mut self.live[i].slot_deadline, true) {
            let timeout = match &self.pool_queue {
                Some(q) => q.timeout,
                None => self.decider.pool().timeouts.first_byte.as_secs_f64(),
            };
            self.queue
                .push(now + timeout, Event::SlotDeadline(i as u32));
        }
        Waiter {
            index: i,
            decision,
            tried,
            _waiting: waiting,
        }
    }

    /// Slots held for a tenant's next request at `now`.
    pub(super) fn held(&self, now: f64) -> usize {
        self.waiting.iter().map(|l| l.held(now)).sum()
    }

    /// Whether newcomer `i` must wait although a replica may have room:
    /// the free slots are held for other tenants' next requests. A slot
    /// held for its own tenant is taken.
    pub(super) fn held_back(&mut self, i: usize, now: f64) -> bool {
        if self.pool_queue.is_none() {
            return false;
        }
        if self.goes_first_elsewhere(i, now, now, &[]) {
            return true;
        }
        let (level, tenant) = (self.level(i), self.tenant(i));
        if self.waiting[level].take_hold(&tenant, now) {
            return false;
        }
        let held = self.held(now);
        let capacity = self.capacity(millis(now));
        held > 0 && self.open + held >= capacity
    }

    /// Request `i`, sent to its replica, reaches the replica's engine. A
    /// replica that died meanwhile broke the connection (the request was
    /// closed then); one that hung swallows it until the timeout it set.
    pub(super) fn enter(&mut self, i: usize, now: f64) {
        let l = &mut self.live[i];
        if !l.open {
            return;
        }
        let at = l.replica as usize;
        if self.slots[at].state != State::Up {
            return;
        }
        if self.loaded(i) {
            // The prompt's KV cache comes from its prefill replica first.
            let wait = self.transfer_time(at, &self.live[i].prompt);
            self.split[i].kv_at = now + wait;
            self.split_counts.transfer_s.push(wait);
            if wait > 0.0 {
                self.queue.push(now + wait, Event::Loaded(i as u32));
                return;
            }
        }
        self.load(i, now);
    }

    /// Request `i` enters its replica's engine (a disaggregated one with
    /// its KV cache arrived).
    pub(super) fn load(&mut self, i: usize, now: f64) {
        let l = &mut self.live[i];
        if !l.open {
            return;
        }
        let at = l.replica as usize;
        if self.slots[at].state != State::Up {
            return;
        }
        let prompt = std::mem::take(&mut l.prompt);
        let external_tokens = if self.loaded(i) { prompt.len() } else { 0 };
        let req = NewRequest {
            id: i as u64,
            prompt,
            max_tokens: self.spec.workload.requests[i].output as usize,
            priority: 0,
            external_tokens,
        };
        if self.slots[at].engine.add_request(req, now).is_err() {
            // The replica answers 400 (context too long).
            self.out.too_long += 1;
            self.close(i);
            return;
        }
        self.slots[at].note_peak();
        if self.slots[at].pending.is_none() {
            self.start_step(at, now);
        }
    }

    /// The proxy sees the end of request `i`'s answer.
    pub(super) fn release(&mut self, i: usize, now: f64) {
        if self.live[i].open {
            if let Some(q) = &mut self.pool_queue {
                let k = usize::from(self.instance_of[i]);
                q.served(now - self.live[i].dispatched_at, k);
            }
            self.close_as(i, true);
        }
    }

    /// Parks request `i`, a newcomer, until a slot frees (its tenant
    /// starts waiting, or waits for one more).
    pub(super) fn park(&mut self, waiter: Waiter) {
        let i = waiter.index;
        let (level, tenant) = (self.level(i), self.tenant(i));
        let weight = self.weight(&tenant);
        let since = self.arrived_at[i];
        self.waiting[level].push(&tenant, weight, since, waiter);
    }

    /// Tenant `tenant`'s fair-share weight.
    fn weight(&self, tenant: &str) -> f64 {
        self.pool_queue
            .as_ref()
            .map_or(1.0, |q| q.fairness().weight(tenant))
    }

    pub(super) fn open_request(&mut self, i: usize, at: usize, guard: InFlightGuard, now: f64) {
        self.live[i] = Live {
            guard: Some(guard),
            expected: None,
            replica: at as u32,
            first: None,
            last: 0.0,
            open: true,
            slot_deadline: self.live[i].slot_deadline,
            dispatched_at: now,
            prompt: Vec::new(),
            done: false,
            predicted: None,
            predicted_ttft: None,
            cached: None,
        };
        self.open += 1;
        let (level, tenant) = (self.level(i), self.tenant(i));
        let weight = self.weight(&tenant);
        if let Some(q) = &mut self.pool_queue {
            q.granted(i, now);
            let prompt =
                q.fairness().prompt_weight * f64::from(self.spec.workload.requests[i].input);
            self.waiting[level].started(&tenant, weight, prompt);
        }
    }

    /// Request `i` ended without an answer (failed, timed out, refused by
    /// its replica).
    pub(super) fn close(&mut self, i: usize) {
        self.close_as(i, false);
    }

    /// Request `i` frees its slot; its tenant is charged its output when a
    /// replica answered it, else refunded its prompt.
    fn close_as(&mut self, i: usize, served: bool) {
        let l = &mut self.live[i];
        if l.open {
            l.open = false;
            l.guard = None;
            l.expected = None;
            self.open -= 1;
            self.slot_freed = true;
            let (level, tenant) = (self.level(i), self.tenant(i));
            let weight = self.weight(&tenant);
            let r = &self.spec.workload.requests[i];
            let now = self.queue.now();
            if let Some(q) = &mut self.pool_queue {
                q.released(i);
                let charge = if served {
                    f64::from(r.output)
                } else {
                    -q.fairness().prompt_weight * f64::from(r.input)
                };
                self.waiting[level].ended(&tenant, weight, charge);
                let fair = q.fairness();
                let window = fair.anticipate.as_secs_f64();
                let total = (fair.prompt_weight * f64::from(r.input) + charge).max(0.0);
                let ended = (level, &tenant, total);
                if fair.enabled
                    && anticipate(q.level_settings(), &mut self.waiting, ended, now, window)
                {
                    self.queue.push(now + window, Event::HoldEnd);
                }
            }
            self.finished(i, now);
        }
    }

    /// The waiter of `level` that tries next: the next in the queue's
    /// order, or with the prefix handoff a younger one whose prompt a free
    /// replica caches (as the routing decision it waits with predicted).
    fn next_waiter(
        &mut self,
        level: usize,
        fair: bool,
        now: f64,
    ) -> Option<(Arc<str>, f64, Entry<Waiter>)> {
        let handoff = self.pool_queue.as_ref().map_or(0.0, |q| q.prefix_handoff);
        if handoff <= 0.0 {
            return self.waiting[level].pop(fair);
        }
        let now_ms = millis(now);
        let free: Vec<Vec<ReplicaId>> = (self.instances())
            .map(|d| {
                let replicas = d.pool().replicas.iter();
                let open = replicas.filter(|r| r.is_eligible_at(now_ms) && r.has_free_slot());
                open.map(|r| r.id).collect()
            })
            .collect();
        let instance_of = &self.instance_of;
        let score = |w: &Waiter| {
            let ids = &free[usize::from(instance_of[w.index])];
            let cached = ids.iter().filter_map(|id| w.decision.predicted_for(*id));
            cached.max().unwrap_or(0)
        };
        self.waiting[level].pop_preferring(fair, now - handoff, score)
    }

    /// After a slot freed: every waiter tries again in the order `serve`'s
    /// queue grants slots (the level whose oldest waiter has the highest
    /// effective level after aging, then the level's fair share among
    /// tenants); those still without a slot keep their place.
    pub(super) fn retry_waiting(&mut self, now: f64) {
        let fair = self
            .pool_queue
            .as_ref()
            .is_some_and(|q| q.fairness().enabled);
        let levels: Vec<Level> = self
            .pool_queue
            .as_ref()
            .map_or_else(Vec::new, |q| q.level_settings().to_vec());
        let mut kept = Vec::new();
        let capacity = self.capacity(millis(now));
        loop {
            let held = self.held(now);
            if held > 0 && self.open + held >= capacity {
                break;
            }
            let fronts = self.waiting.iter().map(FairLevel::oldest);
            let Some(level) = next_level(&levels, fronts, now) else {
                break;
            };
            let Some((tenant, weight, entry)) = self.next_waiter(level, fair, now) else {
                break;
            };
            let Entry {
                seq,
                since,
                item: mut w,
            } = entry;
            let unsent =
                if self.store.is_some() && self.held_back_by_fleet(w.index, since, now, &kept) {
                    // Held back: no slot, and no demand for the lease.
                    w._waiting.clear();
                    let k = usize::from(self.instance_of[w.index]);
                    self.held_back_on(k, now);
                    Some(w)
                } else {
                    let r = &self.spec.workload.requests[w.index];
                    self.spec.workload.fill_prompt(r, &mut self.prompt);
                    self.dispatch(w.index, w.decision, w.tried, now)
                };
            if let Some(item) = unsent {
                kept.push((level, tenant, weight, Entry { seq, since, item }));
            }
        }
        for (level, tenant, weight, entry) in kept {
            self.waiting[level].restore(&tenant, weight, entry);
        }
    }

    /// A waiter's deadline: still without a slot, it gets `serve`'s 503
    /// (false: it got one before).
    pub(super) fn slot_deadline(&mut self, i: usize) -> bool {
        let gone = (self.waiting.iter_mut()).any(|l| l.remove(|w| w.index == i).is_some());
        if gone {
            self.out.slot_timeout += 1;
            let now = self.queue.now();
            self.finished(i, now);
        }
        gone
    }
}

//! Sending a request to a replica: the forwarder's choice, refused
//! connections and retries, hung replicas, and the wait for a free slot
//! (`max_inflight`) with its deadline, waiters served by priority level
//! (with aging) and oldest first within one.

use crate::fleet_sim::clock::{Event, millis};
use crate::fleet_sim::fleet::State;
use crate::pool::{Choice, Failure};
use crate::replica::{InFlightGuard, ReplicaId};
use crate::replica_sim::engine::NewRequest;
use crate::routing::Decision;

use super::{Live, Sim, Waiter};

impl Sim<'_> {
    /// Sends request `i` (its prompt in `self.prompt`) to the replica the
    /// forwarder's choice names, retrying refused connections up to the
    /// pool's `retries`, or parks it until a slot frees.
    pub(super) fn dispatch(
        &mut self,
        i: usize,
        decision: Decision,
        mut tried: Vec<ReplicaId>,
        now: f64,
    ) {
        let r = &self.spec.workload.requests[i];
        let now_ms = millis(now);
        let retries = self.decider.pool().retries as usize;
        loop {
            let info = self.decider.info(r.input, r.output);
            let replica = match self.decider.choose(&decision, &tried, &info, now_ms) {
                Choice::Pick(replica, _) => replica,
                Choice::Wait(_) => {
                    if !std::mem::replace(&mut self.live[i].slot_deadline, true) {
                        // A newcomer (admitted on arrival): it may wait
                        // until the queue's timeout.
                        let timeout = match &self.pool_queue {
                            Some(q) => q.timeout,
                            None => self.decider.pool().timeouts.first_byte.as_secs_f64(),
                        };
                        self.queue
                            .push(now + timeout, Event::SlotDeadline(i as u32));
                    }
                    self.waiting.push_back(Waiter {
                        index: i,
                        level: self.level(i),
                        since: r.at,
                        decision,
                        tried,
                    });
                    return;
                }
                Choice::NoReplica(_) if tried.is_empty() => return self.out.no_replica += 1,
                Choice::NoReplica(_) => return self.out.upstream += 1,
            };
            let guard = replica.acquire_tokens(u64::from(r.input), u64::from(r.output));
            let expected = decision.dispatched(&replica);
            tried.push(replica.id);
            let at = self.decider.position(replica.id);
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
                    self.live[i].expected = expected;
                    let wait = self.decider.pool().timeouts.first_byte.as_secs_f64();
                    self.queue.push(now + wait, Event::Timeout(i as u32));
                    return;
                }
                State::Up => {
                    self.open_request(i, at, guard, now);
                    self.live[i].expected = expected;
                    self.live[i].prompt = std::mem::take(&mut self.prompt);
                    let half = self.half_delay();
                    if half > 0.0 {
                        self.queue.push(now + half, Event::Enter(i as u32));
                    } else {
                        self.enter(i, now);
                    }
                    return;
                }
            }
        }
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
        let req = NewRequest {
            id: i as u64,
            prompt: std::mem::take(&mut l.prompt),
            max_tokens: self.spec.workload.requests[i].output as usize,
            priority: 0,
        };
        if self.slots[at].engine.add_request(req, now).is_err() {
            // The replica answers 400 (context too long).
            self.out.too_long += 1;
            self.close(i);
            return;
        }
        if self.slots[at].pending.is_none() {
            self.start_step(at, now);
        }
    }

    /// The proxy sees the end of request `i`'s answer.
    pub(super) fn release(&mut self, i: usize, now: f64) {
        if self.live[i].open {
            if let Some(q) = &mut self.pool_queue {
                q.served(now - self.live[i].dispatched_at);
            }
            self.close(i);
        }
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
        };
        self.open += 1;
        let level = self.level(i);
        if let Some(q) = &mut self.pool_queue {
            q.granted(i, level, now);
        }
    }

    pub(super) fn close(&mut self, i: usize) {
        let l = &mut self.live[i];
        if l.open {
            l.open = false;
            l.guard = None;
            l.expected = None;
            self.open -= 1;
            self.slot_freed = true;
            if let Some(q) = &mut self.pool_queue {
                q.released(i);
            }
        }
    }

    /// After a slot freed: every waiter tries again in the order `serve`'s
    /// queue grants slots (highest effective level first, after aging, then
    /// oldest first); those still without a slot keep their place.
    pub(super) fn retry_waiting(&mut self, now: f64) {
        if let (Some(q), Some(_)) = (&self.pool_queue, self.spec.tiers) {
            let mut order: Vec<Waiter> = self.waiting.drain(..).collect();
            order.sort_by(|a, b| {
                let rank = |w: &Waiter| q.effective_level(w.level, now - w.since);
                rank(a)
                    .cmp(&rank(b))
                    .then(a.since.total_cmp(&b.since))
                    .then(a.index.cmp(&b.index))
            });
            self.waiting.extend(order);
        }
        for _ in 0..self.waiting.len() {
            let Some(w) = self.waiting.pop_front() else {
                break;
            };
            let r = &self.spec.workload.requests[w.index];
            self.spec.workload.fill_prompt(r, &mut self.prompt);
            self.dispatch(w.index, w.decision, w.tried, now);
        }
    }

    /// A waiter's deadline: still without a slot, it gets `serve`'s 503
    /// (false: it got one before).
    pub(super) fn slot_deadline(&mut self, i: usize) -> bool {
        let Some(pos) = self.waiting.iter().position(|w| w.index == i) else {
            return false;
        };
        self.waiting.remove(pos);
        self.out.slot_timeout += 1;
        true
    }
}

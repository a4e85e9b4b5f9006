//! The engines' side of the loop: starting a step, delivering its tokens
//! and finished requests at its end, once the replica's API server has
//! streamed them (TTFT, inter-token gaps, end-to-end,
//! the in-flight guard shrinking), and the scrape tick that stores each
//! replica's load as `serve`'s scrape loop would.

use crate::fleet_sim::clock::{Event, millis};
use crate::fleet_sim::fleet::State;
use crate::replica_sim::engine::StepOutcome;

use super::Sim;

impl Sim<'_> {
    pub(super) fn start_step(&mut self, at: usize, now: f64) {
        let slot = &mut self.slots[at];
        if slot.state != State::Up || !slot.engine.has_work() {
            return;
        }
        let out = slot.engine.step(now);
        slot.note_kv_events();
        if out.is_idle() {
            // Nothing can run (no cache room): wait for the next arrival.
            return;
        }
        slot.busy_s += out.end - now;
        self.queue.push(
            out.end,
            Event::StepEnd {
                replica: at as u32,
                epoch: slot.epoch,
            },
        );
        slot.pending = Some(out);
    }

    pub(super) fn step_end(&mut self, at: usize, epoch: u32, now: f64) {
        if self.slots[at].epoch != epoch {
            return;
        }
        let Some(out) = self.slots[at].pending.take() else {
            return;
        };
        self.slots[at].publish_kv_events(now);
        // The replica's API server streams the step's tokens out behind the
        // work it took up before (`replica_sim::engine::front_end`).
        let streamed = self.slots[at].engine.stream_out(now, out.tokens.len());
        self.deliver(at, &out, now, streamed - now);
        self.start_step(at, now);
    }

    pub(super) fn deliver(&mut self, at: usize, out: &StepOutcome, now: f64, streaming: f64) {
        if at >= self.decider.decode_replicas() {
            self.prefill_delivered(at, out);
            return;
        }
        // Tokens reach the client, and the proxy sees the end, this long
        // after the step: the API server's streaming, then the network.
        let out_delay = streaming + self.half_delay();
        self.slots[at].tokens += out.tokens.len() as u64;
        self.out.output_tokens += out.tokens.len() as u64;
        let mut prefill_freed = false;
        for t in &out.tokens {
            let i = t.id as usize;
            let loaded = self.loaded(i).then(|| self.split[i].kv_at);
            let disaggregated = self.disaggregated();
            let l = &mut self.live[i];
            match l.first {
                None => {
                    l.first = Some(now);
                    let ttft = now + out_delay - self.arrived_at[i];
                    self.ttft.push(ttft);
                    if let Some(kv_at) = loaded {
                        let sent = l.dispatched_at;
                        self.split_counts.first_step_s.push(now + out_delay - kv_at);
                        self.split_counts.ttft_split_s.push(ttft);
                        // What `serve` learns of the hop: sending to the
                        // decode replica to its first byte.
                        if let Some(d) = &self.decider.pool().disaggregation {
                            d.observe_hop(now + out_delay - sent);
                        }
                    } else if disaggregated {
                        self.split_counts.ttft_local_s.push(ttft);
                    }
                    if let Some(tiers) = self.spec.tiers {
                        self.tier_counts[usize::from(tiers.of_request[i])]
                            .ttft
                            .push(ttft);
                    }
                    if self.spec.tenants.is_some() {
                        self.tenant_counts[usize::from(self.tenant_of[i])]
                            .0
                            .ttft
                            .push(ttft);
                    }
                    if let Some(g) = &mut l.guard {
                        g.prefill_done();
                        // Under `max_prefilling` a prefill slot freed.
                        prefill_freed |= g.replica().max_prefilling.is_some();
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
        self.slot_freed |= prefill_freed;
        self.out.preemptions += out.preempted.len() as u64;
        for f in &out.finished {
            let i = f.id as usize;
            self.e2e.push(now + out_delay - self.arrived_at[i]);
            self.out.completed += 1;
            self.out.prompt_tokens += f.prompt_tokens as u64;
            self.out.cached_tokens += f.cached_tokens as u64;
            self.live[i].cached = Some(f.cached_tokens as u32);
            let tpot = self.spec.goodput_tpot;
            let within = self.live[i].first.is_some_and(|t| {
                let gaps = f.completion_tokens.saturating_sub(1).max(1) as f64;
                t + out_delay - self.arrived_at[i] <= self.spec.goodput_ttft
                    && (tpot <= 0.0 || (now - t) / gaps <= tpot)
            });
            if within {
                self.out.within_objective += 1;
            }
            if let Some(tiers) = self.spec.tiers {
                let counts = &mut self.tier_counts[usize::from(tiers.of_request[i])];
                counts.completed += 1;
                counts.within_objective += u64::from(within);
            }
            if self.spec.tenants.is_some() {
                let (counts, tokens) = &mut self.tenant_counts[usize::from(self.tenant_of[i])];
                counts.completed += 1;
                counts.within_objective += u64::from(within);
                *tokens += f.completion_tokens as u64;
            }
            self.live[i].done = true;
            if out_delay > 0.0 {
                self.queue.push(now + out_delay, Event::Release(i as u32));
            } else {
                self.release(i, now);
            }
        }
    }

    pub(super) fn scrape(&mut self, now: f64) {
        let now_ms = millis(now);
        let pool = std::sync::Arc::clone(self.decider.pool());
        for (at, slot) in self.slots.iter().enumerate() {
            if slot.state == State::Up {
                let snapshot = slot.snapshot(now_ms);
                for d in std::iter::once(&self.decider).chain(&self.others) {
                    d.replica(at).store_load(snapshot);
                }
            }
        }
        if self.work_left()
            && let Some(s) = &pool.scrape
        {
            let gap = if now == 0.0 && self.spec.scrape_phase > 0.0 {
                self.spec.scrape_phase
            } else {
                s.interval.as_secs_f64()
            };
            self.queue.push(now + gap.max(1e-3), Event::Scrape);
        }
    }
}

//! Faults on the virtual clock: a replica slowed, killed or hung, what
//! happens to the requests it holds, the proxy's timeouts, and health
//! checks marking it down.

use crate::fleet_sim::clock::{Event, millis};
use crate::fleet_sim::faults::FaultKind;
use crate::fleet_sim::fleet::State;
use crate::pool::Failure;

use super::Sim;

impl Sim<'_> {
    pub(super) fn fault(&mut self, i: usize, now: f64) {
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
    pub(super) fn stop(&mut self, r: usize, state: State, now: f64) {
        let slot = &mut self.slots[r];
        if slot.state != State::Up {
            return;
        }
        slot.state = state;
        slot.epoch += 1;
        slot.pending = None;
        if r >= self.decider.decode_replicas() {
            // A prefill replica: its prefills move on (a hung one holds
            // them until the prefill timeout).
            if state == State::Dead {
                self.prefill_replica_died(r, now);
            }
            self.health_checks(r, now);
            return;
        }
        let open: Vec<usize> = (0..self.live.len())
            // An answer that is out already, on its way back, is not lost.
            .filter(|&i| {
                let l = &self.live[i];
                l.open && !l.done && l.replica as usize == r
            })
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
        self.health_checks(r, now);
    }

    /// Health checks (when enabled) mark stopped replica `r` down.
    fn health_checks(&mut self, r: usize, now: f64) {
        let health = &self.decider.pool_at(r).health;
        if health.enabled {
            let after = health.interval.as_secs_f64() * f64::from(health.fall.max(1));
            self.queue.push(now + after, Event::Down(r as u32));
        }
    }

    /// A request still open on a replica that does not answer gives up
    /// (false: it had ended already).
    pub(super) fn timeout(&mut self, i: usize, now: f64) -> bool {
        if !self.live[i].open || self.live[i].done {
            return false;
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
        true
    }

    pub(super) fn mark_down(&mut self, r: usize) {
        let h = &self.decider.pool_at(r).health;
        for _ in 0..h.fall.max(1) {
            self.decider.replica(r).health.record(false, h.fall, h.rise);
        }
    }
}

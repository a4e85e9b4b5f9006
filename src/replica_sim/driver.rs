//! Drives one [`Engine`] in scaled real time: the only owner of the engine,
//! fed by a channel of commands, on its own tokio task.
//!
//! Loop: take commands (add, abort) as they come; when no step is in flight
//! and there is work, run [`Engine::step`] at the current simulated time and
//! sleep until its end; then hand each produced token to its request's
//! channel, once the API server has streamed it ([`Engine::stream_out`]:
//! at the step's end unless the API server is still busy with earlier
//! work). A request whose channel is closed (the client went away) is
//! aborted in the engine at that point, if its response body had not already
//! sent the abort on drop.
//!
//! Simulated time is `elapsed real time × time_scale`, with one refinement:
//! while the engine stays busy, each step starts exactly when the previous
//! one ended in simulated time, even if the driver woke a little late (it
//! waits through [`Wake`], to a fraction of a millisecond on a running
//! clock). Lateness therefore delays a delivery but never accumulates:
//! throughput and mean inter-token latency follow the cost model exactly. A request arriving while a step is in flight is
//! stamped no later than that step's end, the earliest it could be scheduled.
//!
//! A disaggregated request (its prompt computed by a prefill replica,
//! [`NewRequest::external_tokens`]) enters the engine only once its KV
//! cache has arrived: the transfer time of the prompt tokens the engine's
//! prefix cache does not hold ([`RoleConfig::transfer_time`]) after it came.
//!
//! The command channel is unbounded because aborts are sent from `Drop`,
//! which cannot wait; what it carries is bounded by the open connections
//! (one add and at most one abort each).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;

use super::engine::{AddError, Engine, EngineStats, Finished, NewRequest, StepOutcome};
use super::faults::Faults;
use super::role::RoleConfig;
use super::wake::Wake;
use crate::kv_events::KvEvent;
use crate::kv_events::publisher::Publisher;

/// What a request's response receives, in order: one event per output token;
/// the last one carries the request's completion.
#[derive(Debug, Clone)]
pub struct TokenOut {
    pub text: &'static str,
    pub finished: Option<Finished>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refused {
    #[error("the replica's queue is full ({waiting} requests waiting)")]
    QueueFull { waiting: usize },
    #[error(transparent)]
    Invalid(#[from] AddError),
}

pub enum Command {
    Add {
        req: NewRequest,
        events: mpsc::UnboundedSender<TokenOut>,
        reply: oneshot::Sender<Result<(), Refused>>,
    },
    Abort {
        id: u64,
    },
}

/// Maps simulated seconds to tokio instants and back.
#[derive(Debug, Clone, Copy)]
pub struct SimClock {
    pub origin: Instant,
    pub scale: f64,
}

impl SimClock {
    pub fn now(&self) -> f64 {
        self.origin.elapsed().as_secs_f64() * self.scale
    }

    pub fn instant_at(&self, t: f64) -> Instant {
        self.origin + std::time::Duration::from_secs_f64((t / self.scale).max(0.0))
    }
}

pub struct Driver {
    pub engine: Engine,
    pub clock: SimClock,
    pub faults: Arc<Faults>,
    pub stats: Arc<ArcSwap<EngineStats>>,
    pub commands: mpsc::UnboundedReceiver<Command>,
    pub shutdown: watch::Receiver<bool>,
    /// Where the engine's KV-cache events go (`--kv-events-port`).
    pub kv_events: Option<Publisher>,
    /// How fast a prefill replica's KV cache arrives.
    pub transfer: RoleConfig,
    /// Requests whose KV cache is on its way, with the simulated time it
    /// arrives.
    pub arriving: Vec<(f64, Arriving)>,
    /// How the loop waits for a step's end (to a fraction of a millisecond
    /// on a running clock).
    pub wake: Wake,
}

/// An add waiting for its request's KV cache.
pub struct Arriving {
    req: NewRequest,
    events: mpsc::UnboundedSender<TokenOut>,
    reply: oneshot::Sender<Result<(), Refused>>,
}

impl Driver {
    pub async fn run(mut self) {
        let mut subscribers: HashMap<u64, mpsc::UnboundedSender<TokenOut>> = HashMap::new();
        let mut in_flight: Option<StepOutcome> = None;
        // Ended steps whose tokens the API server is still streaming, with
        // when it is done, in that order.
        let mut streaming: VecDeque<(f64, StepOutcome)> = VecDeque::new();
        // The KV events of the step in flight, published when it ends.
        let mut step_events: Vec<KvEvent> = Vec::new();
        let mut last_end = 0.0_f64;
        loop {
            let deadline = in_flight.as_ref().map(|o| self.clock.instant_at(o.end));
            let arrival_due = self
                .arriving
                .iter()
                .map(|a| a.0)
                .min_by(f64::total_cmp)
                .map(|t| self.clock.instant_at(t));
            let streamed_due = streaming.front().map(|(t, _)| self.clock.instant_at(*t));
            let mut resume_at = None;
            tokio::select! {
                biased;
                _ = self.shutdown.changed() => break,
                cmd = self.commands.recv() => match cmd {
                    Some(cmd) => {
                        let now = self.clock.now();
                        let arrival = in_flight.as_ref().map_or(now, |o| now.min(o.end));
                        self.handle(cmd, arrival, &mut subscribers);
                    }
                    None => break,
                },
                _ = self.wake.until(arrival_due), if arrival_due.is_some() => {
                    let now = self.clock.now();
                    let arrival = in_flight.as_ref().map_or(now, |o| now.min(o.end));
                    let (due, later) = std::mem::take(&mut self.arriving)
                        .into_iter()
                        .partition(|a| a.0 <= now);
                    self.arriving = later;
                    let due: Vec<(f64, Arriving)> = due;
                    for (_, a) in due {
                        self.add(a, arrival, &mut subscribers);
                    }
                }
                _ = self.wake.until(deadline), if deadline.is_some() => {
                    let out = in_flight.take().expect("a step is in flight");
                    last_end = out.end;
                    resume_at = Some(out.end);
                    if let Some(p) = &self.kv_events {
                        p.publish(std::mem::take(&mut step_events));
                    }
                    let at = self.engine.stream_out(out.end, out.tokens.len());
                    if at > out.end || !streaming.is_empty() {
                        streaming.push_back((at, out));
                    } else {
                        self.deliver(out, &mut subscribers);
                    }
                }
                _ = self.wake.until(streamed_due), if streamed_due.is_some() => {
                    let now = self.clock.now();
                    while let Some((at, _)) = streaming.front() {
                        if *at > now + 1e-6 {
                            break;
                        }
                        let (_, out) = streaming.pop_front().expect("checked front");
                        self.deliver(out, &mut subscribers);
                    }
                }
            }
            if in_flight.is_none() && self.engine.has_work() {
                self.engine.set_slowdown(self.faults.slowdown());
                let now = resume_at.unwrap_or_else(|| self.clock.now().max(last_end));
                let out = self.engine.step(now);
                step_events.extend(self.engine.take_kv_events());
                if !out.is_idle() {
                    in_flight = Some(out);
                }
            }
            self.publish();
        }
        // Dropping the subscribers ends every open response.
    }

    fn handle(
        &mut self,
        cmd: Command,
        arrival: f64,
        subscribers: &mut HashMap<u64, mpsc::UnboundedSender<TokenOut>>,
    ) {
        match cmd {
            Command::Add { req, events, reply } => {
                let a = Arriving { req, events, reply };
                let external = a.req.external_tokens;
                if external > 0 {
                    let cached = self.engine.cached_prefix_tokens(&a.req.prompt);
                    let sent = a.req.prompt.len().saturating_sub(cached).min(external);
                    let delay = self.transfer.transfer_time(sent);
                    if delay > 0.0 {
                        self.arriving.push((arrival + delay, a));
                        return;
                    }
                }
                self.add(a, arrival, subscribers);
            }
            Command::Abort { id } => {
                // A request still waiting for its KV cache leaves quietly.
                self.arriving.retain(|(_, a)| a.req.id != id);
                self.abort(id, subscribers);
            }
        }
    }

    fn add(
        &mut self,
        a: Arriving,
        arrival: f64,
        subscribers: &mut HashMap<u64, mpsc::UnboundedSender<TokenOut>>,
    ) {
        let Arriving { req, events, reply } = a;
        let id = req.id;
        let waiting = self.engine.num_waiting();
        let result = match self.faults.max_waiting() {
            Some(limit) if waiting >= limit => {
                self.faults.record_refusal();
                Err(Refused::QueueFull { waiting })
            }
            _ => self.engine.add_request(req, arrival).map_err(Refused::from),
        };
        if result.is_ok() {
            subscribers.insert(id, events);
        }
        if reply.send(result.clone()).is_err() && result.is_ok() {
            // The client left before hearing back.
            self.abort(id, subscribers);
        }
    }

    fn abort(&mut self, id: u64, subscribers: &mut HashMap<u64, mpsc::UnboundedSender<TokenOut>>) {
        if subscribers.remove(&id).is_some() {
            self.engine.abort(id);
        }
    }

    fn deliver(
        &mut self,
        out: StepOutcome,
        subscribers: &mut HashMap<u64, mpsc::UnboundedSender<TokenOut>>,
    ) {
        let mut finished: HashMap<u64, Finished> =
            out.finished.into_iter().map(|f| (f.id, f)).collect();
        for t in out.tokens {
            let done = finished.remove(&t.id);
            let last = done.is_some();
            let Some(tx) = subscribers.get(&t.id) else {
                continue;
            };
            let sent = tx.send(TokenOut {
                text: t.text,
                finished: done,
            });
            if last {
                subscribers.remove(&t.id);
            } else if sent.is_err() {
                self.abort(t.id, subscribers);
            }
        }
    }

    fn publish(&self) {
        self.stats.store(Arc::new(self.engine.stats().clone()));
    }
}

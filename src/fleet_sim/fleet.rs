//! The simulated replicas: one [`Engine`] per replica on the shared virtual
//! clock, with what a fault did to it, and the `/metrics` scrape a replica
//! would answer, as the [`LoadSnapshot`] llmlb's scrape loop would store
//! (gauges, prefix-cache counters and the timing histograms' sums and
//! counts, so learned rates are learned as in `serve`).

use std::sync::Arc;

use crate::kv_events::subscriber::EventSink;
use crate::kv_events::{EventBatch, KvEvent};
use crate::replica::{EngineTiming, LoadSnapshot};
use crate::replica_sim::engine::{Engine, StepOutcome};
use crate::routing::prefix::held::HeldBlocks;

use super::SimulateError;
use crate::replica_sim::config::SimConfig;

/// Whether a replica serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Up,
    /// Process gone: connections refused.
    Dead,
    /// Accepts connections, never answers.
    Hung,
}

#[derive(Debug)]
pub struct Slot {
    pub engine: Engine,
    pub state: State,
    /// Bumped when a fault stops the replica: step ends of an older epoch
    /// are dropped.
    pub epoch: u32,
    /// A step is under way; its outcome is due at `pending.end`.
    pub pending: Option<StepOutcome>,
    /// Requests dispatched to it (completed or not).
    pub dispatched: u64,
    /// Output tokens it produced.
    pub tokens: u64,
    /// Seconds its engine spent in steps.
    pub busy_s: f64,
    /// In `exact` mode, the router's record of what this replica reports
    /// holding, and the KV events of the step under way, applied to it when
    /// the step ends (as `llmlb replica-sim` publishes them then).
    pub kv: Option<KvFeed>,
    /// The most requests it held at once (running + waiting, as its
    /// `/metrics` would show them).
    pub peak: u32,
}

/// What `serve`'s KV-event subscriber does for one replica, without the
/// socket: the engine's events go straight into the router's record (of
/// every simulated llmlb instance: each subscribes).
#[derive(Debug)]
pub struct KvFeed {
    held: Vec<Arc<HeldBlocks>>,
    step: Vec<KvEvent>,
}

impl Slot {
    /// Feeds this replica's KV events into `held` from now on; the record
    /// starts known and empty, as for a fresh replica whose first event
    /// has sequence 0.
    pub fn publish_to(&mut self, held: Arc<HeldBlocks>) {
        self.engine.record_kv_events();
        held.restarted();
        let feed = self.kv.get_or_insert_with(|| KvFeed {
            held: Vec::new(),
            step: Vec::new(),
        });
        feed.held.push(held);
    }

    /// Notes the events of the step just started (or of a step that could
    /// not run: they go out with the next one, as in `llmlb replica-sim`).
    pub fn note_kv_events(&mut self) {
        if let Some(feed) = &mut self.kv {
            feed.step.extend(self.engine.take_kv_events());
        }
    }

    /// The step ended at `now`: its events reach the router.
    pub fn publish_kv_events(&mut self, now: f64) {
        if let Some(feed) = &mut self.kv
            && !feed.step.is_empty()
        {
            let batch = EventBatch {
                ts: now,
                events: std::mem::take(&mut feed.step),
                dp_rank: None,
            };
            for held in &feed.held {
                held.apply(&batch);
            }
        }
    }
}

/// The engine settings of a named profile.
pub fn profile(name: &str) -> Result<SimConfig, SimulateError> {
    SimConfig::named_or_file(name).map_err(|e| SimulateError::Invalid(format!("--profile: {e}")))
}

/// `n` idle replicas of `profile`, each engine seeded by its position.
pub fn build(profile: &SimConfig, n: usize) -> Vec<Slot> {
    (0..n)
        .map(|i| Slot {
            engine: Engine::new(
                profile.engine.clone(),
                profile.cost.clone(),
                profile.seed.wrapping_add(i as u64),
            ),
            state: State::Up,
            epoch: 0,
            pending: None,
            dispatched: 0,
            tokens: 0,
            busy_s: 0.0,
            kv: None,
            peak: 0,
        })
        .collect()
}

impl Slot {
    /// Notes how many requests the engine holds now (after one entered).
    pub fn note_peak(&mut self) {
        let held = self.engine.num_running() + self.engine.num_waiting();
        self.peak = self.peak.max(held as u32);
    }

    /// What a scrape of this replica returns at `now_ms`.
    pub fn snapshot(&self, now_ms: u64) -> LoadSnapshot {
        let s = self.engine.stats();
        let p = self.engine.params();
        LoadSnapshot {
            running: Some(s.num_running as u64),
            waiting: Some(s.num_waiting as u64),
            kv_usage: Some(s.kv_usage),
            kv_capacity_tokens: Some((p.usable_blocks() * p.block_size) as u64),
            prefix_cache_queries: Some(s.prefix_queries as f64),
            prefix_cache_hits: Some(s.prefix_hits as f64),
            prefix_cache_hit_gauge: None,
            // The sums and counts of the histograms a replica's `/metrics`
            // exports and llmlb learns its rates from (`LearnedRates`).
            timing: EngineTiming {
                prefill_seconds: Some(s.prefill_time.sum),
                prefill_requests: Some(s.prefill_time.count as f64),
                prefill_tokens: Some(s.request_prefill_computed.sum),
                inter_token_seconds: Some(s.itl.sum),
                inter_tokens: Some(s.itl.count as f64),
                output_tokens: Some(s.request_generation_tokens.sum),
                finished_requests: Some(s.request_generation_tokens.count as f64),
            },
            taken_at_ms: now_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet_sim::clock::millis;
    use crate::replica::LearnedRates;
    use crate::replica_sim::engine::NewRequest;

    #[test]
    fn two_scrapes_teach_the_rates_serve_would_learn() {
        let profile = SimConfig::profile("fast").unwrap();
        let mut slot = build(&profile, 1).remove(0);
        let before = slot.snapshot(0);
        let req = NewRequest {
            id: 0,
            prompt: (0..200).collect(),
            max_tokens: 10,
            priority: 0,
            external_tokens: 0,
        };
        slot.engine.add_request(req, 0.0).unwrap();
        let mut now = 0.0;
        while slot.engine.has_work() {
            now = slot.engine.step(now).end;
        }
        let learned = LearnedRates::default();
        learned.observe(&before, &slot.snapshot(millis(now)));
        let rates = learned.rates();
        assert!(rates.prefill_tokens_per_second.is_some_and(|r| r > 0.0));
        let step = rates.decode_step_seconds.unwrap();
        assert!(step >= profile.cost.step_overhead, "{step}");
    }
}

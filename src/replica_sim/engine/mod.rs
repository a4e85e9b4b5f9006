//! The simulated inference engine: a pure, clock-injected state machine.
//!
//! The engine knows nothing of tokio, sockets or wall time. A driver adds
//! requests, calls [`Engine::step`] with the current time, and the returned
//! [`StepOutcome`] says how long the step takes (per the [`cost`] model), which
//! tokens it produced and which requests it finished or preempted; the
//! results are due at [`StepOutcome::end`], when the driver calls `step` again.
//! The HTTP server drives it in (scaled) real time; a discrete-event simulator
//! can drive the same code in virtual time.
//!
//! What one step does, following vLLM's v1 scheduler (`vllm/v1/core/sched/scheduler.py`):
//! 1. running requests first, in order: each gets the tokens it still needs
//!    (one for a decoding request, a chunk for a partly prefilled prompt)
//!    within the `max_num_batched_tokens` budget; when the KV cache has no
//!    block for it, the newest running request (lowest priority under
//!    priority scheduling) is **preempted**: its blocks are freed, it returns
//!    to the head of the queue and will be recomputed, possibly from cache;
//! 2. if nothing was preempted, waiting requests are admitted in FCFS (or
//!    priority) order while `max_num_seqs` and the budget allow: the longest
//!    run of leading blocks found in the prefix cache is reused, the rest is
//!    prefilled, in chunks if the budget is short (chunked prefill); the
//!    blocks each scheduled request will fill are committed to the prefix
//!    cache as it is scheduled ([`kv_cache`] describes the eviction order);
//! 3. every request whose computed tokens caught up with its known tokens
//!    samples one output token; a request that reached `max_tokens`
//!    finishes and frees its blocks (last block first, so a shared prefix
//!    outlives the private tail in the LRU);
//! 4. with `api_per_request` set, every request first spends that long in
//!    the API server, which works beside the engine, one piece of work at a
//!    time ([`front_end`]); a request it is done with joins the waiting
//!    queue at the next step. The same server streams each step's tokens
//!    out after the work it took up before ([`Engine::stream_out`], called
//!    by the driver when the step ends): `api_per_output_token` each.

pub mod cost;
mod front_end;
mod io;
pub mod kv_cache;
mod params;
mod request;
mod scheduler;
pub mod stats;

use std::collections::{HashMap, VecDeque};

pub use cost::{CostModel, StepShape};
pub use io::{AddError, Finished, NewRequest, StepOutcome, TokenEvent};
pub use kv_cache::BlockPool;
pub use params::EngineParams;
pub use stats::{EngineStats, FinishReason, Histogram};

use front_end::FrontEnd;
use request::Seq;

#[derive(Debug)]
pub struct Engine {
    params: EngineParams,
    cost: CostModel,
    seed: u64,
    slowdown: f64,
    pool: BlockPool,
    seqs: HashMap<u64, Seq>,
    waiting: VecDeque<u64>,
    running: Vec<u64>,
    /// Requests still in the API server ([`front_end`]).
    front_end: FrontEnd,
    next_order: u64,
    stats: EngineStats,
}

impl Engine {
    /// An idle engine. `params` must have passed [`EngineParams::validate`].
    pub fn new(params: EngineParams, cost: CostModel, seed: u64) -> Engine {
        let pool = BlockPool::new(params.usable_blocks());
        let stats = EngineStats::new(params.usable_blocks(), params.max_model_len);
        Engine {
            params,
            cost,
            seed,
            slowdown: 1.0,
            pool,
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            front_end: FrontEnd::default(),
            next_order: 0,
            stats,
        }
    }

    pub fn params(&self) -> &EngineParams {
        &self.params
    }

    /// Multiplies every later step time by `factor` (a slow replica).
    pub fn set_slowdown(&mut self, factor: f64) {
        self.slowdown = if factor.is_finite() && factor > 0.0 {
            factor
        } else {
            1.0
        };
    }

    /// Queues a request that arrived at `now`.
    pub fn add_request(&mut self, req: NewRequest, now: f64) -> Result<(), AddError> {
        if req.prompt.is_empty() {
            return Err(AddError::EmptyPrompt);
        }
        if req.max_tokens == 0 {
            return Err(AddError::NoOutput);
        }
        let requested = req.prompt.len() + req.max_tokens;
        if requested > self.params.max_model_len {
            return Err(AddError::TooLong {
                max_model_len: self.params.max_model_len,
                requested,
                prompt: req.prompt.len(),
                output: req.max_tokens,
            });
        }
        if self.seqs.contains_key(&req.id) {
            return Err(AddError::DuplicateId(req.id));
        }
        let mut seq = Seq {
            id: req.id,
            prompt_hash: crate::replica_sim::text::prompt_hash(&req.prompt),
            prompt: req.prompt,
            output: Vec::new(),
            max_tokens: req.max_tokens,
            priority: req.priority,
            external_tokens: req.external_tokens,
            order: self.next_order,
            arrival: now,
            hashes: Vec::new(),
            blocks: Vec::new(),
            num_computed: 0,
            num_committed: 0,
            cached_tokens: None,
            first_scheduled: None,
            num_preemptions: 0,
            first_token: None,
            last_token: now,
        };
        seq.update_hashes(self.params.block_size);
        self.next_order += 1;
        let id = seq.id;
        self.seqs.insert(id, seq);
        // The API server parses and tokenizes every request before the
        // scheduler sees it, whether or not the engine is busy.
        if self.cost.api_per_request > 0.0 {
            self.front_end.push(id, now, self.cost.api_per_request);
        } else {
            self.enqueue(id, false);
        }
        Ok(())
    }

    /// Removes a request wherever it is and frees its blocks. Returns the
    /// number of blocks freed, or `None` when the engine does not hold `id`.
    pub fn abort(&mut self, id: u64) -> Option<usize> {
        let seq = self.seqs.remove(&id)?;
        self.waiting.retain(|&w| w != id);
        self.running.retain(|&r| r != id);
        self.front_end.remove(id);
        let freed = seq.blocks.len();
        self.pool.free_blocks(seq.blocks.iter().rev().copied());
        self.stats.finished[FinishReason::Abort as usize] += 1;
        self.stats.aborted_blocks_freed += freed as u64;
        self.refresh_gauges();
        Some(freed)
    }

    /// Hands the API server the outputs of a step that ended at `end`
    /// (`tokens` of them), once every request that arrived by then has been
    /// added; returns when its tokens reach the clients ([`front_end`]):
    /// `end` itself when the API server is idle and `api_per_output_token`
    /// is 0.
    pub fn stream_out(&mut self, end: f64, tokens: usize) -> f64 {
        let work = self.cost.api_per_output_token * tokens as f64;
        if self.cost.api_per_request == 0.0 && work == 0.0 {
            return end;
        }
        self.front_end.stream_out(end, work)
    }

    /// Whether a step would do anything.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty() || !self.front_end.is_empty()
    }

    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// The counters and gauges as of the last change.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// The KV block pool, read-only.
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// Starts noting KV-cache events (`llmlb replica-sim --kv-events-port`).
    pub fn record_kv_events(&mut self) {
        self.pool.record_events();
    }

    /// KV-cache events since the last call, in the order they happened.
    pub fn take_kv_events(&mut self) -> Vec<crate::kv_events::KvEvent> {
        self.pool.take_events()
    }

    /// Leading tokens of `prompt` this engine's prefix cache holds now (whole
    /// blocks), as a request's admission would find them: what a decode
    /// replica need not receive from a prefill replica.
    pub fn cached_prefix_tokens(&self, prompt: &[u32]) -> usize {
        if !self.params.enable_prefix_caching {
            return 0;
        }
        let bs = self.params.block_size;
        let mut parent = None;
        let mut n = 0;
        for block in prompt.chunks_exact(bs) {
            let h = kv_cache::block_hash(parent, block);
            if self.pool.lookup(h).is_none() {
                break;
            }
            parent = Some(h);
            n += bs;
        }
        n
    }

    /// Blocks held by request `id` (for tests and diagnostics).
    pub fn blocks_of(&self, id: u64) -> Option<&[kv_cache::BlockId]> {
        self.seqs.get(&id).map(|s| s.blocks.as_slice())
    }

    /// Runs one step starting at `now`. See the module docs for what it does.
    pub fn step(&mut self, now: f64) -> StepOutcome {
        let ready = self.front_end.ready(now);
        let front_end_done = ready.len();
        for id in ready {
            self.enqueue(id, false);
        }
        let plan = self.schedule(now);
        let mut out = StepOutcome {
            start: now,
            end: now,
            preempted: plan.preempted,
            ..StepOutcome::default()
        };
        for &(id, n) in &plan.scheduled {
            let seq = &self.seqs[&id];
            if seq.is_decode(n) {
                out.shape.decode_seqs += 1;
            } else {
                out.shape.prefill_tokens += n;
                out.shape.prefill_pairs += cost::attention_pairs(seq.num_computed, n);
            }
            if seq.num_computed + n >= seq.num_tokens() {
                out.shape.output_tokens += 1;
            }
            out.shape.context_tokens += seq.num_computed + n;
            out.num_tokens += n;
        }
        out.num_seqs = plan.scheduled.len();
        let engine_time = self.cost.step_time(&out.shape) * self.slowdown;
        // Nothing to run but a request still in the API server: wait for it.
        let waited = match self.front_end.next_done() {
            Some(done) if out.num_seqs == 0 && out.preempted.is_empty() => (done - now).max(0.0),
            _ => 0.0,
        };
        let duration = engine_time + waited;
        out.end = now + duration;
        out.front_end_time = waited;
        out.front_end_done = front_end_done;
        for &(id, n) in &plan.scheduled {
            self.advance(id, n, out.end, &mut out);
        }
        if out.num_seqs > 0 {
            self.stats.iteration_tokens.observe(out.num_tokens as f64);
            self.stats.steps += 1;
            self.stats.busy_time += duration;
        }
        self.refresh_gauges();
        out
    }

    /// Applies `n` computed tokens to `id`, samples a token when it caught up.
    fn advance(&mut self, id: u64, n: usize, end: f64, out: &mut StepOutcome) {
        let bs = self.params.block_size;
        let seq = self.seqs.get_mut(&id).expect("scheduled request exists");
        seq.num_computed += n;
        if seq.num_computed < seq.num_tokens() {
            return;
        }
        let index = seq.output.len();
        let text = crate::replica_sim::text::filler_word(self.seed, seq.prompt_hash, index as u32);
        let token = crate::replica_sim::text::filler_token(text);
        seq.output.push(token);
        seq.update_hashes(bs);
        self.stats.generation_tokens += 1;
        match seq.first_token {
            None => {
                seq.first_token = Some(end);
                self.stats.prompt_tokens += seq.prompt.len() as u64;
                self.stats.prompt_tokens_cached += seq.cached_tokens.unwrap_or(0) as u64;
                self.stats.ttft.observe(end - seq.arrival);
            }
            Some(_) => self.stats.itl.observe(end - seq.last_token),
        }
        seq.last_token = end;
        out.tokens.push(TokenEvent {
            id,
            index,
            token,
            text,
        });
        if seq.output.len() >= seq.max_tokens {
            self.finish(id, FinishReason::Length, end, out);
        }
    }

    fn finish(&mut self, id: u64, reason: FinishReason, end: f64, out: &mut StepOutcome) {
        let seq = self.seqs.remove(&id).expect("finishing request exists");
        self.running.retain(|&r| r != id);
        self.pool.free_blocks(seq.blocks.iter().rev().copied());
        self.stats.finished[reason as usize] += 1;
        self.observe_finished(&seq, end);
        out.finished.push(Finished {
            id,
            reason,
            prompt_tokens: seq.prompt.len(),
            completion_tokens: seq.output.len(),
            cached_tokens: seq.cached_tokens.unwrap_or(0),
        });
    }

    /// The per-request histograms of a request that ran to its end.
    fn observe_finished(&mut self, seq: &Seq, end: f64) {
        let s = &mut self.stats;
        let scheduled = seq.first_scheduled.unwrap_or(seq.arrival);
        let first = seq.first_token.unwrap_or(end);
        let out = seq.output.len();
        s.e2e.observe(end - seq.arrival);
        s.queue_time.observe(scheduled - seq.arrival);
        s.inference_time.observe(end - scheduled);
        s.prefill_time.observe(first - scheduled);
        s.decode_time.observe(end - first);
        if out > 1 {
            s.time_per_output_token
                .observe((end - first) / (out - 1) as f64);
        }
        s.request_prompt_tokens.observe(seq.prompt.len() as f64);
        s.request_generation_tokens.observe(out as f64);
        s.request_max_tokens.observe(seq.max_tokens as f64);
        s.request_n.observe(1.0);
        s.request_preemptions
            .observe(f64::from(seq.num_preemptions));
        let cached = seq.cached_tokens.unwrap_or(0);
        s.request_prefill_computed
            .observe(seq.prompt.len().saturating_sub(cached) as f64);
    }

    fn refresh_gauges(&mut self) {
        self.stats.num_running = self.running.len();
        self.stats.num_waiting = self.waiting.len();
        self.stats.kv_usage = self.pool.usage();
        self.stats.free_blocks = self.pool.num_free();
        self.stats.evictions = self.pool.evictions();
    }
}

/// Commits the blocks of `seq` that are full once its first `upto` tokens
/// are computed, as vLLM does when it schedules them (before the step runs,
/// so a request admitted later in the same step can already hit them), and
/// notes them as one `BlockStored` event.
fn commit_full_blocks(pool: &mut BlockPool, seq: &mut Seq, upto: usize, block_size: usize) {
    let full = (upto / block_size).min(seq.hashes.len());
    if seq.num_committed >= full {
        return;
    }
    let first = seq.num_committed;
    let parent = first.checked_sub(1).map(|p| seq.hashes[p]);
    let mut stored = Vec::new();
    for i in first..full {
        if pool.commit(seq.blocks[i], seq.hashes[i]) {
            stored.push(seq.hashes[i]);
        }
    }
    seq.num_committed = full;
    if pool.is_recording() {
        let tokens = (first..full)
            .flat_map(|i| seq.block_tokens(i, block_size))
            .collect();
        pool.note_stored(stored, parent, tokens, block_size);
    }
}

#[cfg(test)]
mod step_cost_tests;
#[cfg(test)]
mod tests;

//! Which requests run in the next step, and with how many tokens each:
//! continuous batching under `max_num_seqs` and `max_num_batched_tokens`,
//! chunked prefill, prefix-cache lookup at admission, and preemption by
//! recompute when the KV cache runs out of blocks.
//!
//! The blocks a step will fill are committed to the prefix cache as the
//! request is scheduled, right after its blocks are allocated, as vLLM's
//! `allocate_slots` does: so the KV events of one step interleave each
//! request's evictions and stores in batch order.
//!
//! Cost per step: O(running + admitted) plus one hash probe per cached block
//! looked up; a preemption is O(blocks of the victim).

use super::Engine;
use super::request::Seq;

/// The decisions of one step.
pub(super) struct Plan {
    /// `(request, tokens to compute)` in batch order.
    pub scheduled: Vec<(u64, usize)>,
    pub preempted: Vec<u64>,
}

impl Engine {
    pub(super) fn schedule(&mut self, now: f64) -> Plan {
        let mut budget = self.params.max_num_batched_tokens;
        let mut plan = Plan {
            scheduled: Vec::new(),
            preempted: Vec::new(),
        };

        // 1. Running requests keep their place; preempt to make room.
        let mut i = 0;
        'running: while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let seq = &self.seqs[&id];
            let n = (seq.num_tokens() - seq.num_computed).min(budget);
            if n == 0 {
                i += 1;
                continue;
            }
            loop {
                if self.try_grow(id, n) {
                    plan.scheduled.push((id, n));
                    budget -= n;
                    i += 1;
                    break;
                }
                let victim_pos = self.victim();
                let victim = self.running[victim_pos];
                if let Some(k) = plan.scheduled.iter().position(|&(s, _)| s == victim) {
                    budget += plan.scheduled.remove(k).1;
                }
                self.preempt(victim_pos);
                plan.preempted.push(victim);
                if victim == id {
                    // Nothing left to preempt for it: as in vLLM, the
                    // running requests after it wait for the next step too.
                    break 'running;
                }
                if victim_pos < i {
                    i -= 1;
                }
            }
        }

        // 2. Admit waiting requests, unless this step already had to preempt.
        if plan.preempted.is_empty() {
            while budget > 0 && self.running.len() < self.params.max_num_seqs {
                let Some(&id) = self.waiting.front() else {
                    break;
                };
                let Some(n) = self.admit(id, budget, now) else {
                    break;
                };
                self.waiting.pop_front();
                self.running.push(id);
                plan.scheduled.push((id, n));
                budget -= n;
            }
        }
        plan
    }

    /// Puts `id` in the queue: FCFS appends new requests and puts preempted
    /// ones back at the head; priority scheduling keeps (priority, arrival) order.
    pub(super) fn enqueue(&mut self, id: u64, preempted: bool) {
        if self.params.priority_scheduling {
            let key = |s: &Seq| (s.priority, s.order);
            let k = key(&self.seqs[&id]);
            let pos = self
                .waiting
                .iter()
                .position(|w| key(&self.seqs[w]) > k)
                .unwrap_or(self.waiting.len());
            self.waiting.insert(pos, id);
        } else if preempted {
            self.waiting.push_front(id);
        } else {
            self.waiting.push_back(id);
        }
    }

    /// Index in `running` of the request to preempt: the newest, or under
    /// priority scheduling the lowest priority (newest among equals).
    fn victim(&self) -> usize {
        if !self.params.priority_scheduling {
            return self.running.len() - 1;
        }
        let key = |id: &u64| {
            let s = &self.seqs[id];
            (s.priority, s.order)
        };
        (0..self.running.len())
            .max_by_key(|&i| key(&self.running[i]))
            .expect("preempting needs a running request")
    }

    fn preempt(&mut self, pos: usize) {
        let id = self.running.remove(pos);
        let seq = self.seqs.get_mut(&id).expect("running request exists");
        self.pool.free_blocks(seq.blocks.iter().rev().copied());
        seq.blocks.clear();
        seq.num_computed = 0;
        seq.num_committed = 0;
        seq.num_preemptions += 1;
        self.stats.preemptions += 1;
        self.enqueue(id, true);
    }

    /// Gives a running request the blocks for `n` more tokens, if there are any.
    fn try_grow(&mut self, id: u64, n: usize) -> bool {
        let bs = self.params.block_size;
        let seq = self.seqs.get_mut(&id).expect("running request exists");
        let need = Seq::blocks_for(seq.num_computed + n, bs).saturating_sub(seq.blocks.len());
        if need > self.pool.num_free() {
            return false;
        }
        for _ in 0..need {
            let b = self.pool.allocate().expect("checked free blocks");
            seq.blocks.push(b);
        }
        if self.params.enable_prefix_caching {
            let upto = seq.num_computed + n;
            super::commit_full_blocks(&mut self.pool, seq, upto, bs);
        }
        true
    }

    /// Starts (or restarts, after preemption) the head of the queue: looks up
    /// its prefix in the cache and allocates the blocks for its first chunk.
    /// Returns the tokens to compute, or `None` when the cache has no room.
    fn admit(&mut self, id: u64, budget: usize, now: f64) -> Option<usize> {
        let bs = self.params.block_size;
        let caching = self.params.enable_prefix_caching;
        let seq = self.seqs.get_mut(&id).expect("waiting request exists");
        debug_assert_eq!(seq.num_computed, 0);
        let total = seq.num_tokens();
        // At least one token must be computed to sample the next one.
        let max_hit_blocks = (total - 1) / bs;
        let hits: Vec<_> = if caching {
            seq.hashes
                .iter()
                .take(max_hit_blocks)
                .map_while(|&h| self.pool.lookup(h))
                .collect()
        } else {
            Vec::new()
        };
        // A disaggregated request's prompt arrives computed from its
        // prefill replica (first admission only: after a preemption it is
        // recomputed here, as vLLM does).
        let external = if seq.cached_tokens.is_none() {
            seq.external_tokens.min(total - 1)
        } else {
            0
        };
        let computed = (hits.len() * bs).max(external);
        let n = (total - computed).min(budget);
        let fresh = Seq::blocks_for(computed + n, bs) - hits.len();
        let revived = hits.iter().filter(|&&b| self.pool.is_free(b)).count();
        if fresh + revived > self.pool.num_free() {
            return None;
        }
        for &b in &hits {
            self.pool.acquire(b);
        }
        let num_hits = hits.len();
        seq.blocks = hits;
        for _ in 0..fresh {
            let b = self.pool.allocate().expect("checked free blocks");
            seq.blocks.push(b);
        }
        seq.num_computed = computed;
        // The cache's own blocks are committed already; the rest (loaded
        // from a prefill replica, or computed in this step) commit as they
        // are scheduled.
        seq.num_committed = num_hits;
        if caching {
            super::commit_full_blocks(&mut self.pool, seq, computed + n, bs);
        }
        // As in vLLM, a request re-admitted after preemption is not counted
        // again: the prefix-cache counters describe first admissions only.
        if caching && seq.cached_tokens.is_none() {
            self.stats.prefix_queries += total as u64;
            self.stats.prefix_hits += computed as u64;
        }
        if seq.cached_tokens.is_none() {
            seq.cached_tokens = Some(computed.min(seq.prompt.len()));
            seq.first_scheduled = Some(now);
        }
        Some(n)
    }
}

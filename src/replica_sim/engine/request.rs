//! One request inside the engine: its tokens, its blocks and its progress.

use super::kv_cache::{BlockId, block_hash};

#[derive(Debug)]
pub(super) struct Seq {
    pub id: u64,
    pub prompt: Vec<u32>,
    pub output: Vec<u32>,
    pub max_tokens: usize,
    pub priority: i64,
    /// Leading prompt tokens loaded from a prefill replica (see
    /// [`super::NewRequest::external_tokens`]).
    pub external_tokens: usize,
    /// Arrival order, the FCFS tie-breaker.
    pub order: u64,
    pub arrival: f64,
    pub prompt_hash: u64,
    /// Chained hashes of every full block of `prompt ++ output`.
    pub hashes: Vec<u64>,
    pub blocks: Vec<BlockId>,
    /// Tokens whose KV entries are in `blocks`.
    pub num_computed: usize,
    /// Leading blocks already committed to the prefix cache.
    pub num_committed: usize,
    /// Prompt tokens found in the prefix cache when first scheduled.
    pub cached_tokens: Option<usize>,
    pub first_scheduled: Option<f64>,
    pub num_preemptions: u32,
    pub first_token: Option<f64>,
    pub last_token: f64,
}

impl Seq {
    pub fn num_tokens(&self) -> usize {
        self.prompt.len() + self.output.len()
    }

    fn token(&self, i: usize) -> u32 {
        if i < self.prompt.len() {
            self.prompt[i]
        } else {
            self.output[i - self.prompt.len()]
        }
    }

    /// Extends `hashes` to cover every full block of the known tokens.
    pub fn update_hashes(&mut self, block_size: usize) {
        while (self.hashes.len() + 1) * block_size <= self.num_tokens() {
            let start = self.hashes.len() * block_size;
            let tokens: Vec<u32> = (start..start + block_size).map(|i| self.token(i)).collect();
            let parent = self.hashes.last().copied();
            self.hashes.push(block_hash(parent, &tokens));
        }
    }

    /// The tokens of full block `i`.
    pub fn block_tokens(&self, i: usize, block_size: usize) -> Vec<u32> {
        (i * block_size..(i + 1) * block_size)
            .map(|t| self.token(t))
            .collect()
    }

    /// Blocks needed to hold `tokens` tokens.
    pub fn blocks_for(tokens: usize, block_size: usize) -> usize {
        tokens.div_ceil(block_size)
    }

    /// Whether a step that computes `n` more tokens is a decode step for this
    /// sequence (one token past the prompt) rather than prefill or recompute.
    pub fn is_decode(&self, n: usize) -> bool {
        // A prompt loaded from a prefill replica computes its last token in
        // the decode batch, as one more decoding sequence.
        let loaded = self.external_tokens > 0 && self.num_computed + 1 >= self.prompt.len();
        n == 1 && (self.num_computed >= self.prompt.len() || loaded)
    }
}

//! The scheduler and KV cache shape an engine runs with.

use serde::{Deserialize, Serialize};

/// The scheduler and KV cache shape (the `[engine]` table of a profile).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineParams {
    /// Tokens per KV block (16 on GPUs, 128 on vLLM's CPU backend).
    pub block_size: usize,
    /// KV blocks in the cache, as vLLM reports them (`num_gpu_blocks`). One
    /// is vLLM's reserved null block, so `num_blocks - 1` hold tokens.
    pub num_blocks: usize,
    /// Most requests in the running batch.
    pub max_num_seqs: usize,
    /// Most tokens computed in one step (prefill chunks plus decodes).
    pub max_num_batched_tokens: usize,
    /// Longest prompt plus output a request may ask for.
    pub max_model_len: usize,
    pub enable_prefix_caching: bool,
    /// Order the queue by the requests' `priority` (lower first), then arrival.
    pub priority_scheduling: bool,
}

impl EngineParams {
    /// Blocks that can hold tokens: all but vLLM's null block.
    pub fn usable_blocks(&self) -> usize {
        self.num_blocks.saturating_sub(1)
    }

    pub fn validate(&self) -> Result<(), String> {
        let positive = [
            ("block_size", self.block_size),
            ("num_blocks", self.num_blocks),
            ("max_num_seqs", self.max_num_seqs),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("max_model_len", self.max_model_len),
        ];
        for (name, v) in positive {
            if v == 0 {
                return Err(format!("engine.{name} must be at least 1"));
            }
        }
        if self.num_blocks >= u32::MAX as usize {
            return Err(format!(
                "engine.num_blocks is too large: {}",
                self.num_blocks
            ));
        }
        if self.num_blocks < 2 {
            return Err("engine.num_blocks must be at least 2 (one is reserved)".into());
        }
        let capacity = self.usable_blocks() * self.block_size;
        if self.max_model_len > capacity {
            return Err(format!(
                "engine.max_model_len ({}) exceeds the KV cache ({} usable blocks x {} tokens = {capacity}): a long request could never run",
                self.max_model_len,
                self.usable_blocks(),
                self.block_size
            ));
        }
        Ok(())
    }
}

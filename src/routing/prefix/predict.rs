//! The cached prompt tokens llmlb predicts a replica will report
//! (`usage.prompt_tokens_details.cached_tokens`), for the closed-loop
//! metrics (`telemetry::prefix_loop`).
//!
//! `cache` and `exact` modes predict what they score with (held or sent
//! blocks); `hash` mode, which scores nothing, predicts from the blocks
//! llmlb sent each replica ([`from_sent`]), as `cache` mode would. Either
//! way the count is capped as vLLM caps it: the prompt's last token is always
//! computed, so a fully cached prompt reports all its full blocks but the
//! one holding that token ([`cap`]). Cost: one index lookup per candidate.

use std::collections::HashMap;
use std::sync::Arc;

use super::cache_index::BlockIndex;
use crate::replica::{Replica, ReplicaId};

/// `cached` tokens of a `prompt_len`-token prompt in blocks of
/// `block_size`, as the replica will report them.
pub fn cap(cached: u64, prompt_len: usize, block_size: usize) -> u64 {
    let bs = block_size.max(1);
    cached.min((prompt_len.saturating_sub(1) / bs * bs) as u64)
}

/// Each candidate's prediction from the blocks llmlb sent it.
pub fn from_sent(
    indexes: &HashMap<ReplicaId, Arc<BlockIndex>>,
    cands: &[Arc<Replica>],
    blocks: &[u64],
    prompt_len: usize,
    block_size: usize,
) -> Vec<(ReplicaId, u64)> {
    cands
        .iter()
        .map(|r| {
            let matched = indexes.get(&r.id).map_or(0, |i| i.matched(blocks));
            (
                r.id,
                cap((matched * block_size) as u64, prompt_len, block_size),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::cap;

    #[test]
    fn the_last_token_is_never_cached() {
        assert_eq!(cap(64, 64, 16), 48);
        assert_eq!(cap(64, 65, 16), 64);
        assert_eq!(cap(32, 100, 16), 32);
        assert_eq!(cap(0, 0, 16), 0);
    }
}

//! The best fleet prefix-cache hit rate any router could reach on a
//! workload: every request finds cached every full block it shares with any
//! earlier request (as if the fleet's caches were unbounded and every
//! request went where its longest earlier match lives), at most all but the
//! last token of its prompt, as vLLM counts hits. Real placement can only
//! lose to it (a bounded cache evicts, a busy replica is passed over).
//!
//! Cost: one tokenization and one hash-set probe per block of every prompt.

use std::collections::HashSet;

use crate::bench::BenchError;
use crate::bench::workload::{Prompt, WorkloadSpec};
use crate::routing::prefix::blocks::{chained_hashes, exact_seed};
use crate::tokenize::stand_in::{render_chat, tokenize};

/// Upper bound of `hits / prompt tokens` over the first `requests` requests
/// (all turns) of `spec` with `seed`, for replicas with `block_size`.
pub fn hit_rate_upper_bound(
    spec: &WorkloadSpec,
    seed: u64,
    requests: u64,
    block_size: usize,
) -> Result<f64, BenchError> {
    let mut workload = spec.build(seed)?;
    let mut seen: HashSet<u64> = HashSet::new();
    let (mut hits, mut queries) = (0usize, 0usize);
    let mut sent = 0;
    while sent < requests {
        let Some(conversation) = workload.next_conversation() else {
            break;
        };
        for turn in conversation.turns {
            let tokens = match &turn.prompt {
                Prompt::Text(t) => tokenize(t),
                Prompt::Chat(m) => tokenize(&render_chat(
                    m.iter().map(|(r, c)| (r.as_str(), c.as_str())),
                )),
                Prompt::Tokens(ids) => ids.clone(),
            };
            let blocks = chained_hashes(exact_seed(), &tokens, block_size);
            let most = tokens.len().saturating_sub(1) / block_size.max(1);
            let shared = blocks.iter().take_while(|h| seen.contains(h)).count();
            hits += shared.min(most) * block_size;
            queries += tokens.len();
            seen.extend(blocks);
            sent += 1;
        }
    }
    Ok(if queries == 0 {
        0.0
    } else {
        hits as f64 / queries as f64
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::workload::SharedPrefixOptions;

    #[test]
    fn shared_prefix_bound_counts_each_groups_first_request_as_a_miss() {
        let opts = SharedPrefixOptions {
            groups: 2,
            prompts_per_group: 4,
            system_len: 160,
            question_len: 16,
            output_len: 1,
        };
        let spec = WorkloadSpec::SharedPrefix(opts);
        let b = hit_rate_upper_bound(&spec, 3, 8, 16).unwrap();
        // 6 of 8 requests can reuse the 10 full blocks of their system
        // prompt out of about 176 tokens each: about 6 × 160 / (8 × 176).
        assert!((0.6..0.72).contains(&b), "{b}");
        assert_eq!(hit_rate_upper_bound(&spec, 3, 0, 16).unwrap(), 0.0);
    }
}

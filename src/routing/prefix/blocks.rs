//! The prompt as replicas cache it: rendered with the chat template and
//! tokenized with the pool's tokenizer ([`prompt_token_ids`], the one place
//! a request's prompt becomes token ids), cut into full blocks of
//! `block_size` tokens, each block identified by a hash chained from its
//! parent's, as vLLM's prefix cache does. Two prompts share their first `k`
//! block hashes exactly when they share their first `k` blocks of tokens.
//!
//! The model name seeds the chain, so equal text sent to two models never
//! looks shared. A partial last block is left out (replicas cache only full
//! blocks).
//!
//! Cost: tokenizing (one pass over the prompt's bytes with the stand-in; see
//! `benches/tokenize.rs` for a model tokenizer) plus one 64-bit mix per token.

use super::rendezvous::{hash64, mix};
use crate::tokenize::{ChatMessage, PromptTokenizer};

/// What a request's prompt is made of.
#[derive(Debug, Clone, Copy)]
pub enum Prompt<'a> {
    /// Chat messages, rendered with the chat template.
    Chat(&'a [ChatMessage]),
    /// A completion prompt, used as is.
    Text(&'a str),
    /// A prompt already in token ids (`llmlb fleet-sim`, which feeds the
    /// replicas and the router the same ids without rendering text).
    Tokens(&'a [u32]),
}

impl Prompt<'_> {
    /// The leading system messages' text, when the prompt starts with any.
    pub fn system(&self) -> Option<String> {
        let Prompt::Chat(messages) = self else {
            return None;
        };
        let system: Vec<String> = messages
            .iter()
            .take_while(|m| m.role == "system" || m.role == "developer")
            .map(|m| m.joined(""))
            .collect();
        (!system.is_empty()).then(|| system.join("\n"))
    }
}

/// The token ids a pool's replicas compute for `prompt`: chat messages
/// rendered with the pool's chat template and encoded without added special
/// tokens, a completion prompt encoded with them (vLLM's defaults).
///
/// This is the one seam between a request and token-level routing: `hash`
/// and `cache` prefix modes, `least_tokens` and token rate limits all start
/// from what it returns, and any mode that matches a replica's real cache
/// blocks must start here too, so llmlb and the replicas agree token for
/// token.
///
/// A chat template that refuses the messages (vLLM answers such a request
/// 400) or a tokenizer error leaves routing with the stand-in's tokens of
/// the same prompt, so the request is still placed and the replica gives the
/// client its own error.
pub fn prompt_token_ids(tokenizer: &PromptTokenizer, prompt: Prompt<'_>) -> Vec<u32> {
    let ids = match prompt {
        Prompt::Chat(messages) => tokenizer.encode_chat(messages),
        Prompt::Text(text) => tokenizer.encode_text(text),
        Prompt::Tokens(ids) => Ok(ids.to_vec()),
    };
    ids.unwrap_or_else(|e| {
        tracing::debug!(error = %e, "prompt not tokenizable with the pool's tokenizer; using the stand-in");
        prompt_token_ids(&PromptTokenizer::StandIn, prompt)
    })
}

/// The hash of one block given its parent's (or the chain's seed).
pub fn chain(parent: u64, block: &[u32]) -> u64 {
    let mut h = parent;
    for &t in block {
        h = mix(h ^ u64::from(t));
    }
    mix(h ^ 0x9e37_79b9_7f4a_7c15)
}

/// Chained hashes of the full blocks of `tokens`, from `seed`.
pub fn chained_hashes(seed: u64, tokens: &[u32], block_size: usize) -> Vec<u64> {
    let mut parent = seed;
    tokens
        .chunks_exact(block_size.max(1))
        .map(|block| {
            parent = chain(parent, block);
            parent
        })
        .collect()
}

/// Chained hashes of the full blocks of `tokens`, seeded by the model name.
pub fn block_hashes(model: &str, tokens: &[u32], block_size: usize) -> Vec<u64> {
    chained_hashes(hash64(model.as_bytes()), tokens, block_size)
}

/// The seed of `exact` mode's chains: the same on both sides (the blocks a
/// replica reports and the prompt being routed), whatever the model is
/// called, since a replica's cache does not depend on the name it serves.
pub fn exact_seed() -> u64 {
    hash64(b"llmlb exact prefix")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(system: &str, user: &str) -> Vec<ChatMessage> {
        vec![
            ChatMessage::new("system", system),
            ChatMessage::new("user", user),
        ]
    }

    fn prompt_blocks(prompt: Prompt<'_>) -> Vec<u64> {
        let tokens = prompt_token_ids(&PromptTokenizer::StandIn, prompt);
        block_hashes("m", &tokens, 16)
    }

    #[test]
    fn shared_system_prompt_shares_leading_blocks() {
        let system = "You are a careful assistant for a shipping company. ".repeat(20);
        let a = chat(&system, "Where is parcel 1?");
        let b = chat(&system, "Cancel order 7.");
        let ha = prompt_blocks(Prompt::Chat(&a));
        let hb = prompt_blocks(Prompt::Chat(&b));
        let shared = ha.iter().zip(&hb).take_while(|(x, y)| x == y).count();
        assert!(shared >= 10, "{shared}");
        assert!(shared < ha.len().min(hb.len()) || ha.len() != hb.len());
        // Chaining: once blocks differ, they never agree again.
        assert!(ha[shared..].iter().all(|h| !hb.contains(h)));
    }

    #[test]
    fn model_seeds_the_chain_and_partial_blocks_are_dropped() {
        let tokens: Vec<u32> = (0..40).collect();
        let a = block_hashes("a", &tokens, 16);
        let b = block_hashes("b", &tokens, 16);
        assert_eq!(a.len(), 2);
        assert!(a.iter().all(|h| !b.contains(h)));
    }

    #[test]
    fn system_text_of_chat_only() {
        let m = chat("Be terse.", "hi");
        assert_eq!(Prompt::Chat(&m).system().as_deref(), Some("Be terse."));
        assert_eq!(Prompt::Text("Be terse.").system(), None);
        let no_sys = vec![ChatMessage::new("user", "hi")];
        assert_eq!(Prompt::Chat(&no_sys).system(), None);
    }
}

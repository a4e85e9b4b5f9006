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
//! **What else keys a block**, as in vLLM's prefix cache ([`CacheKey`]): the
//! LoRA adapter enters every block's hash and the request's `cache_salt`
//! the first block's (so every later block through the chain). Requests
//! that vLLM keeps apart (another adapter, another salt, or a salt against
//! none) therefore never share a hash here either, and requests vLLM lets
//! share blocks share them here.
//!
//! **Exactness.** [`prompt_ids`] says when the ids are not what the
//! replica will compute ([`Unpredictable`]): the caller routes such a
//! request by load and counts it rather than guess.
//!
//! Cost: tokenizing (one pass over the prompt's bytes with the stand-in; see
//! `benches/tokenize.rs` for a model tokenizer) plus one 64-bit mix per token.

use super::rendezvous::{hash64, mix};
use crate::tokenize::{ChatMessage, ChatOptions, PromptTokenizer, TokenizeError, Unpredictable};

/// What a request's prompt is made of.
#[derive(Debug, Clone, Copy)]
pub enum Prompt<'a> {
    /// Chat messages, rendered with the chat template (a plain request:
    /// vLLM's defaults).
    Chat(&'a [ChatMessage]),
    /// Chat messages with the request's template arguments (tools,
    /// `chat_template_kwargs`, documents, ...).
    ChatWith(&'a [ChatMessage], &'a ChatOptions),
    /// A completion prompt, used as is.
    Text(&'a str),
    /// A prompt already in token ids (`llmlb fleet-sim`, which feeds the
    /// replicas and the router the same ids without rendering text).
    Tokens(&'a [u32]),
}

impl Prompt<'_> {
    /// The leading system messages' text, when the prompt starts with any.
    pub fn system(&self) -> Option<String> {
        let (Prompt::Chat(messages) | Prompt::ChatWith(messages, _)) = self else {
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
    prompt_ids(tokenizer, prompt).0
}

/// Like [`prompt_token_ids`], also saying when the ids are the stand-in's
/// fallback rather than what the replicas compute.
pub fn prompt_ids(
    tokenizer: &PromptTokenizer,
    prompt: Prompt<'_>,
) -> (Vec<u32>, Option<Unpredictable>) {
    let ids = match prompt {
        Prompt::Chat(messages) => tokenizer.encode_chat(messages),
        Prompt::ChatWith(messages, options) => tokenizer.encode_chat_with(messages, options),
        Prompt::Text(text) => tokenizer.encode_text(text),
        Prompt::Tokens(ids) => Ok(ids.to_vec()),
    };
    match ids {
        Ok(ids) => (ids, None),
        Err(e) => {
            tracing::debug!(error = %e, "prompt not tokenizable with the pool's tokenizer; using the stand-in");
            let reason = match e {
                TokenizeError::Template(_) => Unpredictable::TemplateError,
                TokenizeError::Encode(_) => Unpredictable::EncodeError,
            };
            (
                prompt_token_ids(&PromptTokenizer::StandIn, prompt),
                Some(reason),
            )
        }
    }
}

/// What keys a prompt's cached blocks besides their tokens, as vLLM's
/// prefix cache keys them: the LoRA adapter (every block) and the
/// request's `cache_salt` (the first block).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CacheKey {
    pub adapter: Option<String>,
    pub salt: Option<String>,
}

impl CacheKey {
    /// Whether nothing but tokens keys the blocks.
    pub fn is_plain(&self) -> bool {
        self.adapter.is_none() && self.salt.is_none()
    }

    /// The extra key of the block starting at token `start` (0: none).
    pub fn extra(&self, first: bool) -> u64 {
        let mut e = 0;
        if let Some(a) = &self.adapter {
            e = mix(hash64(b"lora") ^ hash64(a.as_bytes()));
        }
        if first && let Some(s) = &self.salt {
            e = mix(e ^ mix(hash64(b"cache_salt") ^ hash64(s.as_bytes())));
        }
        e
    }
}

/// The hash of one block given its parent's (or the chain's seed).
pub fn chain(parent: u64, block: &[u32]) -> u64 {
    let mut h = parent;
    for &t in block {
        h = mix(h ^ u64::from(t));
    }
    mix(h ^ 0x9e37_79b9_7f4a_7c15)
}

/// The hash of one block given its parent's and its extra key (0: none,
/// which is [`chain`]).
pub fn chain_keyed(parent: u64, block: &[u32], extra: u64) -> u64 {
    let h = chain(parent, block);
    if extra == 0 { h } else { mix(h ^ extra) }
}

/// Chained hashes of the full blocks of `tokens`, from `seed`.
pub fn chained_hashes(seed: u64, tokens: &[u32], block_size: usize) -> Vec<u64> {
    keyed_hashes(seed, tokens, block_size, &CacheKey::default())
}

/// Chained hashes of the full blocks of `tokens`, from `seed`, each keyed
/// by `key` as vLLM keys it.
pub fn keyed_hashes(seed: u64, tokens: &[u32], block_size: usize, key: &CacheKey) -> Vec<u64> {
    let mut parent = seed;
    tokens
        .chunks_exact(block_size.max(1))
        .enumerate()
        .map(|(i, block)| {
            parent = chain_keyed(parent, block, key.extra(i == 0));
            parent
        })
        .collect()
}

/// Chained hashes of the full blocks of `tokens`, seeded by the model name.
pub fn block_hashes(model: &str, tokens: &[u32], block_size: usize) -> Vec<u64> {
    chained_hashes(hash64(model.as_bytes()), tokens, block_size)
}

/// [`block_hashes`] keyed by `key`.
pub fn block_hashes_keyed(
    model: &str,
    tokens: &[u32],
    block_size: usize,
    key: &CacheKey,
) -> Vec<u64> {
    keyed_hashes(hash64(model.as_bytes()), tokens, block_size, key)
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
    fn adapters_and_salts_key_blocks_as_in_vllm() {
        let tokens: Vec<u32> = (0..48).collect();
        let key = |adapter: Option<&str>, salt: Option<&str>| CacheKey {
            adapter: adapter.map(String::from),
            salt: salt.map(String::from),
        };
        let plain = keyed_hashes(1, &tokens, 16, &CacheKey::default());
        assert_eq!(plain, chained_hashes(1, &tokens, 16));
        let salted = keyed_hashes(1, &tokens, 16, &key(None, Some("a")));
        let other_salt = keyed_hashes(1, &tokens, 16, &key(None, Some("b")));
        let sql = keyed_hashes(1, &tokens, 16, &key(Some("sql"), None));
        let sql_salted = keyed_hashes(1, &tokens, 16, &key(Some("sql"), Some("a")));
        let all = [&plain, &salted, &other_salt, &sql, &sql_salted];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert!(a.iter().all(|h| !b.contains(h)), "no block shared");
            }
        }
        assert_eq!(salted, keyed_hashes(1, &tokens, 16, &key(None, Some("a"))));
        // The salt keys the first block only: a salted prompt's later
        // blocks differ through the chain, not by the salt itself.
        let mut parent = salted[0];
        for (i, block) in tokens.chunks_exact(16).enumerate().skip(1) {
            parent = chain(parent, block);
            assert_eq!(parent, salted[i]);
        }
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

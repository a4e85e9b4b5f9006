//! `hash` mode's key for a prompt: the model name and either the system
//! prompt (`key = "system"`, when the request has one) or the first
//! `prefix.tokens` token ids, hashed to 64 bits.
//!
//! Requests that share the key share a rendezvous order and so land on the
//! same replica while it has room ([`super::affinity`]). A prompt with no
//! tokens has no key (branch `prefix_none`).
//!
//! Cost: one SHA-256 over the model name and the key's bytes; the prompt is
//! tokenized only when the token form is used (and the caller has no tokens).

use std::borrow::Cow;

use super::prefix::blocks::Prompt;
use super::prefix::rendezvous::hash64;
use crate::config::{HashKey, PrefixConfig};

/// The key of `prompt` for `model`; `tokens` yields its token ids when needed.
pub fn hash_key<'t>(
    prefix: &PrefixConfig,
    model: &str,
    prompt: Prompt<'_>,
    tokens: impl FnOnce() -> Cow<'t, [u32]>,
) -> Option<u64> {
    let mut bytes = model.as_bytes().to_vec();
    bytes.push(0);
    match (prefix.key, prompt.system()) {
        (HashKey::System, Some(system)) => bytes.extend_from_slice(system.as_bytes()),
        _ => {
            let tokens = tokens();
            if tokens.is_empty() {
                return None;
            }
            for t in tokens.iter().take(prefix.tokens) {
                bytes.extend_from_slice(&t.to_le_bytes());
            }
        }
    }
    Some(hash64(&bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::ChatMessage;

    fn prefix(key: &str, tokens: usize) -> PrefixConfig {
        toml::from_str(&format!(
            "mode = \"hash\"\nkey = \"{key}\"\ntokens = {tokens}"
        ))
        .unwrap()
    }

    #[test]
    fn same_lead_tokens_same_key_and_the_model_seeds_it() {
        let p = prefix("tokens", 4);
        let key = |model: &str, ids: &[u32]| {
            let owned = ids.to_vec();
            hash_key(&p, model, Prompt::Text("x"), || Cow::Owned(owned))
        };
        assert_eq!(key("m", &[1, 2, 3, 4, 5]), key("m", &[1, 2, 3, 4, 9]));
        assert_ne!(key("m", &[1, 2, 3, 4]), key("m", &[1, 2, 3, 5]));
        assert_ne!(key("m", &[1, 2, 3, 4]), key("n", &[1, 2, 3, 4]));
        assert_eq!(key("m", &[]), None);
    }

    #[test]
    fn system_key_reads_the_system_prompt_only() {
        let p = prefix("system", 4);
        let chat = |user: &str| {
            vec![
                ChatMessage::new("system", "Be brief."),
                ChatMessage::new("user", user),
            ]
        };
        let (a, b) = (chat("hello"), chat("bye"));
        let key = |c: &[ChatMessage]| {
            hash_key(&p, "m", Prompt::Chat(c), || -> Cow<'static, [u32]> {
                unreachable!("the system prompt is the key")
            })
        };
        assert_eq!(key(&a), key(&b));
        assert!(key(&a).is_some());
    }
}

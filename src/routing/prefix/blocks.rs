//! The prompt as replicas cache it: rendered with the chat template,
//! tokenized with llmlb's prefix-stable tokenizer, cut into full blocks of
//! `block_size` tokens, each block identified by a hash chained from its
//! parent's, as vLLM's prefix cache does. Two prompts share their first `k`
//! block hashes exactly when they share their first `k` blocks of tokens.
//!
//! The model name seeds the chain, so equal text sent to two models never
//! looks shared. A partial last block is left out (replicas cache only full
//! blocks).
//!
//! Cost: one pass over the prompt's bytes plus one 64-bit mix per token.

use super::rendezvous::{hash64, mix};
use crate::tokenizer::{render_chat, tokenize};

/// What a request's prompt is made of.
#[derive(Debug, Clone, Copy)]
pub enum Prompt<'a> {
    /// Chat messages `(role, text)`, rendered with the chat template.
    Chat(&'a [(String, String)]),
    /// A completion prompt, used as is.
    Text(&'a str),
    /// A prompt already in token ids (`llmlb simulate`, which feeds the
    /// replicas and the router the same ids without rendering text).
    Tokens(&'a [u32]),
}

impl Prompt<'_> {
    /// The text a replica would tokenize.
    pub fn render(&self) -> String {
        match self {
            Prompt::Chat(messages) => {
                render_chat(messages.iter().map(|(r, c)| (r.as_str(), c.as_str())))
            }
            Prompt::Text(t) => (*t).to_string(),
            Prompt::Tokens(_) => String::new(),
        }
    }

    /// The prompt's tokens: tokenized from the rendered text, or as given.
    pub fn tokens(&self) -> std::borrow::Cow<'_, [u32]> {
        match self {
            Prompt::Tokens(t) => std::borrow::Cow::Borrowed(t),
            _ => std::borrow::Cow::Owned(tokenize(&self.render())),
        }
    }

    /// The leading system messages' text, when the prompt starts with any.
    pub fn system(&self) -> Option<String> {
        let Prompt::Chat(messages) = self else {
            return None;
        };
        let system: Vec<&str> = messages
            .iter()
            .take_while(|(role, _)| role == "system" || role == "developer")
            .map(|(_, c)| c.as_str())
            .collect();
        (!system.is_empty()).then(|| system.join("\n"))
    }
}

/// Chained hashes of the full blocks of `tokens`.
pub fn block_hashes(model: &str, tokens: &[u32], block_size: usize) -> Vec<u64> {
    let block_size = block_size.max(1);
    let mut parent = hash64(model.as_bytes());
    tokens
        .chunks_exact(block_size)
        .map(|block| {
            let mut h = parent;
            for &t in block {
                h = mix(h ^ u64::from(t));
            }
            parent = mix(h ^ 0x9e37_79b9_7f4a_7c15);
            parent
        })
        .collect()
}

/// Chained block hashes of a prompt, with its token count.
pub fn prompt_blocks(model: &str, prompt: Prompt<'_>, block_size: usize) -> (Vec<u64>, usize) {
    let tokens = prompt.tokens();
    (block_hashes(model, &tokens, block_size), tokens.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(system: &str, user: &str) -> Vec<(String, String)> {
        vec![
            ("system".into(), system.into()),
            ("user".into(), user.into()),
        ]
    }

    #[test]
    fn shared_system_prompt_shares_leading_blocks() {
        let system = "You are a careful assistant for a shipping company. ".repeat(20);
        let a = chat(&system, "Where is parcel 1?");
        let b = chat(&system, "Cancel order 7.");
        let (ha, _) = prompt_blocks("m", Prompt::Chat(&a), 16);
        let (hb, _) = prompt_blocks("m", Prompt::Chat(&b), 16);
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
        let no_sys = vec![("user".to_string(), "hi".to_string())];
        assert_eq!(Prompt::Chat(&no_sys).system(), None);
    }
}

//! Turning a request's prompt into the token ids a replica will compute on,
//! shared by the router (prefix routing, `least_tokens`, token rate limits)
//! and the simulator (`usage.prompt_tokens`, prefix caching).
//!
//! [`PromptTokenizer`] is the one type every caller uses:
//! - [`PromptTokenizer::Model`]: the model's own files ([`ModelTokenizer`]):
//!   `tokenizer.json` and the chat template, rendered and encoded as vLLM
//!   does, so counts equal vLLM's `usage.prompt_tokens`;
//! - [`PromptTokenizer::StandIn`]: llmlb's prefix-stable stand-in
//!   ([`stand_in`]) with a generic role template, for pools and
//!   simulators given no model directory.
//!
//! This module depends on nothing in the proxy, so `replica_sim/` and `bench/` can
//! use it. Cost: see [`ModelTokenizer`] and [`stand_in`]; the
//! criterion bench `benches/tokenize.rs` measures render plus encode.

mod chat;
mod clock;
mod message;
mod model;
mod registry;
pub mod stand_in;
mod template;

use std::path::Path;
use std::sync::Arc;

pub use chat::{ChatFields, ChatOptions, Unpredictable};
pub use message::{ChatMessage, MessageContent};
pub use model::{LoadError, ModelTokenizer};
pub use registry::load_shared;

/// Why a prompt could not be tokenized with a model's files.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenizeError {
    /// The chat template raised or failed (vLLM answers such requests 400).
    #[error("the chat template failed: {0}")]
    Template(String),
    #[error("the tokenizer failed: {0}")]
    Encode(String),
}

/// A pool's or a simulator's tokenizer.
#[derive(Debug, Clone, Default)]
pub enum PromptTokenizer {
    /// llmlb's stand-in tokenizer and generic chat layout.
    #[default]
    StandIn,
    /// A model's own tokenizer and chat template.
    Model(Arc<ModelTokenizer>),
}

impl PromptTokenizer {
    /// The tokenizer of the model directory `dir` (shared with earlier loads
    /// of the same unchanged files).
    pub fn load(dir: &Path) -> Result<PromptTokenizer, LoadError> {
        load_shared(dir).map(PromptTokenizer::Model)
    }

    /// Whether this is the stand-in.
    pub fn is_stand_in(&self) -> bool {
        matches!(self, PromptTokenizer::StandIn)
    }

    /// The model directory, for a model tokenizer.
    pub fn dir(&self) -> Option<&Path> {
        match self {
            PromptTokenizer::StandIn => None,
            PromptTokenizer::Model(m) => Some(m.dir()),
        }
    }

    /// Whether both are the stand-in or the same loaded files.
    pub fn same_as(&self, other: &PromptTokenizer) -> bool {
        match (self, other) {
            (PromptTokenizer::StandIn, PromptTokenizer::StandIn) => true,
            (PromptTokenizer::Model(a), PromptTokenizer::Model(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// The chat prompt as text, ending with the generation prompt.
    pub fn render_chat(&self, messages: &[ChatMessage]) -> Result<String, TokenizeError> {
        self.render_chat_with(messages, &ChatOptions::plain())
    }

    /// The chat prompt as text, with a request's template arguments (the
    /// stand-in's generic layout ignores them).
    pub fn render_chat_with(
        &self,
        messages: &[ChatMessage],
        options: &ChatOptions,
    ) -> Result<String, TokenizeError> {
        match self {
            PromptTokenizer::StandIn => {
                let joined: Vec<(&str, String)> = messages
                    .iter()
                    .map(|m| (m.role.as_str(), m.joined("")))
                    .collect();
                Ok(stand_in::render_chat(
                    joined.iter().map(|(r, t)| (*r, t.as_str())),
                ))
            }
            PromptTokenizer::Model(m) => m.render_chat(messages, options),
        }
    }

    /// Token ids of a chat prompt: rendered, then encoded without adding
    /// special tokens (vLLM's chat default: the template wrote them).
    pub fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, TokenizeError> {
        self.encode_chat_with(messages, &ChatOptions::plain())
    }

    /// Token ids of a chat prompt rendered with a request's template
    /// arguments, encoded with its `add_special_tokens`.
    pub fn encode_chat_with(
        &self,
        messages: &[ChatMessage],
        options: &ChatOptions,
    ) -> Result<Vec<u32>, TokenizeError> {
        let text = self.render_chat_with(messages, options)?;
        match self {
            PromptTokenizer::StandIn => Ok(stand_in::tokenize(&text)),
            PromptTokenizer::Model(m) => m.encode(&text, options.add_special_tokens),
        }
    }

    /// Token ids of a completion prompt, with the tokenizer's special tokens
    /// added (vLLM's completions default).
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>, TokenizeError> {
        match self {
            PromptTokenizer::StandIn => Ok(stand_in::tokenize(text)),
            PromptTokenizer::Model(m) => m.encode(text, true),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stand_in_matches_the_legacy_functions() {
        let t = PromptTokenizer::StandIn;
        let msgs = [
            ChatMessage::new("system", "Be terse."),
            ChatMessage::from_json(
                "user",
                Some(&serde_json::json!([{"type": "text", "text": "h"}, {"type": "text", "text": "i"}])),
            )
            .unwrap(),
        ];
        let legacy = stand_in::render_chat([("system", "Be terse."), ("user", "hi")]);
        assert_eq!(t.render_chat(&msgs).unwrap(), legacy);
        assert_eq!(t.encode_chat(&msgs).unwrap(), stand_in::tokenize(&legacy));
        assert_eq!(t.encode_text("abc").unwrap(), stand_in::tokenize("abc"));
        assert!(t.is_stand_in() && t.dir().is_none());
    }
}

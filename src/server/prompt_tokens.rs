//! Counting a request's prompt tokens with its pool's model tokenizer, once
//! per request, before rate limits, routing and balancing use the count.
//!
//! Pools on the stand-in tokenizer skip this: their rate limits and
//! `least_tokens` keep the cheap estimate of four bytes per token, and the
//! router tokenizes only when a prefix mode needs ids. A prompt larger than
//! [`BLOCKING_BYTES`] is tokenized on tokio's blocking pool: encoding costs
//! about a millisecond per thousand tokens and more (`docs/BENCHMARKS.md`,
//! "Tokenizer"), far more than the few microseconds a hand-off to the
//! blocking pool costs, and an async worker must never be held that long.

use crate::pool::Pool;
use crate::routing::Prompt;
use crate::tokenize::PromptTokenizer;

use super::request::RequestMeta;

/// Prompts at least this large (in text bytes) are tokenized on the
/// blocking pool (below it, encoding takes a few hundred microseconds at
/// most).
pub const BLOCKING_BYTES: usize = 1024;

/// A prompt's token ids from one pool's tokenizer.
#[derive(Debug)]
pub struct PromptTokens {
    tokenizer: PromptTokenizer,
    pub ids: Vec<u32>,
}

impl PromptTokens {
    /// Tokenizes `meta`'s prompt for `pool`; `None` when the pool uses the
    /// stand-in tokenizer.
    pub async fn count(pool: &Pool, meta: &RequestMeta) -> Option<PromptTokens> {
        let tokenizer = pool.router.tokenizer().clone();
        if tokenizer.is_stand_in() {
            return None;
        }
        let ids = if meta.prompt_bytes < BLOCKING_BYTES {
            pool.router.prompt_tokens(prompt(meta))
        } else {
            let (router_tokenizer, owned) = (tokenizer.clone(), meta.clone());
            let job = tokio::task::spawn_blocking(move || {
                crate::routing::prefix::blocks::prompt_token_ids(&router_tokenizer, prompt(&owned))
            });
            match job.await {
                Ok(ids) => ids,
                Err(_) => pool.router.prompt_tokens(prompt(meta)),
            }
        };
        Some(PromptTokens { tokenizer, ids })
    }

    /// The ids, when they came from `pool`'s tokenizer.
    pub fn for_pool(&self, pool: &Pool) -> Option<&[u32]> {
        self.tokenizer
            .same_as(pool.router.tokenizer())
            .then_some(self.ids.as_slice())
    }

    /// The token count, saturated to `u32`.
    pub fn count_u32(&self) -> u32 {
        self.ids.len().min(u32::MAX as usize) as u32
    }
}

/// The request's prompt as routing reads it.
pub fn prompt(meta: &RequestMeta) -> Prompt<'_> {
    match &meta.messages {
        Some(m) => Prompt::Chat(m),
        None => Prompt::Text(&meta.prompt_text),
    }
}

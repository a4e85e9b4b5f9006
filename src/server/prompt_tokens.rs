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
use crate::tokenize::{PromptTokenizer, Unpredictable};

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
    /// Set when the ids are the stand-in's fallback (the template or the
    /// tokenizer failed on the prompt).
    pub unpredictable: Option<Unpredictable>,
}

impl PromptTokens {
    /// Tokenizes `meta`'s prompt for `pool`; `None` when the pool uses the
    /// stand-in tokenizer.
    pub async fn count(pool: &Pool, meta: &RequestMeta) -> Option<PromptTokens> {
        let tokenizer = pool.router.tokenizer().clone();
        if tokenizer.is_stand_in() {
            return None;
        }
        use crate::routing::prefix::blocks::prompt_ids;
        let (ids, unpredictable) = if meta.prompt_bytes < BLOCKING_BYTES {
            prompt_ids(&tokenizer, prompt(meta))
        } else {
            let (router_tokenizer, owned) = (tokenizer.clone(), meta.clone());
            let job =
                tokio::task::spawn_blocking(move || prompt_ids(&router_tokenizer, prompt(&owned)));
            match job.await {
                Ok(ids) => ids,
                Err(_) => prompt_ids(&tokenizer, prompt(meta)),
            }
        };
        Some(PromptTokens {
            tokenizer,
            ids,
            unpredictable,
        })
    }

    /// The ids, when they came from `pool`'s tokenizer, with why they
    /// cannot be predicted from, if they cannot.
    pub fn for_pool(&self, pool: &Pool) -> Option<(&[u32], Option<Unpredictable>)> {
        self.tokenizer
            .same_as(pool.router.tokenizer())
            .then_some((self.ids.as_slice(), self.unpredictable))
    }

    /// The token count, saturated to `u32`.
    pub fn count_u32(&self) -> u32 {
        self.ids.len().min(u32::MAX as usize) as u32
    }
}

/// The request's prompt as routing reads it.
pub fn prompt(meta: &RequestMeta) -> Prompt<'_> {
    match (&meta.messages, &meta.prompt_ids) {
        (Some(m), _) => Prompt::ChatWith(m, &meta.chat),
        (None, Some(ids)) => Prompt::Tokens(ids),
        (None, None) => Prompt::Text(&meta.prompt_text),
    }
}

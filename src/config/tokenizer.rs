//! `[pools.tokenizer]`: the model directory whose `tokenizer.json` and chat
//! template the pool's replicas use, so llmlb counts and hashes the same
//! tokens they compute on. Unset, the stand-in tokenizer is used.

use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizerConfig {
    /// A Hugging Face model directory (or a copy of its tokenizer files):
    /// `tokenizer.json`, `tokenizer_config.json`, and `chat_template.jinja`
    /// unless the config holds the template.
    pub dir: PathBuf,
}

//! A model's own tokenizer, loaded from its directory: `tokenizer.json`
//! (Hugging Face `tokenizers`), the chat template (`chat_template.jinja`, or
//! the `chat_template` field of `tokenizer_config.json`) and the special
//! tokens of `tokenizer_config.json`.
//!
//! Special tokens when encoding follow vLLM's defaults: a rendered chat
//! prompt is encoded without adding any (the template already wrote the BOS),
//! a completion prompt with them (the post-processor adds the BOS).
//!
//! Cost: loading parses the tokenizer once (tens of milliseconds for a
//! 100k-token vocabulary); encoding is linear in the text.

use std::path::{Path, PathBuf};

use serde_json::Value;
use tokenizers::Tokenizer;

use super::TokenizeError;
use super::chat::ChatOptions;
use super::message::ChatMessage;
use super::template::{ChatTemplate, SpecialTokens};

/// Why a model directory cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: not a directory")]
    NotADirectory { path: PathBuf },
    #[error("{path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path}: not a tokenizer the `tokenizers` library can load: {reason}")]
    Tokenizer { path: PathBuf, reason: String },
    #[error("{path}: {reason}")]
    Config { path: PathBuf, reason: String },
    #[error("{path}: the chat template does not parse: {reason}")]
    Template { path: PathBuf, reason: String },
    #[error(
        "{dir}: no chat template (neither chat_template.jinja nor a `chat_template` in tokenizer_config.json)"
    )]
    NoTemplate { dir: PathBuf },
}

/// A loaded model tokenizer with its chat template.
pub struct ModelTokenizer {
    dir: PathBuf,
    tokenizer: Tokenizer,
    template: ChatTemplate,
}

impl std::fmt::Debug for ModelTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTokenizer")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl ModelTokenizer {
    /// Loads the model directory `dir`.
    pub fn load(dir: &Path) -> Result<ModelTokenizer, LoadError> {
        if !dir.is_dir() {
            return Err(LoadError::NotADirectory {
                path: dir.to_path_buf(),
            });
        }
        let path = dir.join("tokenizer.json");
        let bytes = read(&path)?;
        let tokenizer = Tokenizer::from_bytes(&bytes).map_err(|e| LoadError::Tokenizer {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let config_path = dir.join("tokenizer_config.json");
        let config: Value = if config_path.exists() {
            let text = read(&config_path)?;
            serde_json::from_slice(&text).map_err(|e| LoadError::Config {
                path: config_path.clone(),
                reason: format!("not valid JSON: {e}"),
            })?
        } else {
            Value::Null
        };
        let jinja = dir.join("chat_template.jinja");
        let (source, source_path) = if jinja.exists() {
            let bytes = read(&jinja)?;
            let text = String::from_utf8(bytes).map_err(|_| LoadError::Read {
                path: jinja.clone(),
                reason: "not UTF-8 text".into(),
            })?;
            (text, jinja)
        } else {
            match config_template(&config) {
                Some(t) => (t, config_path.clone()),
                None => return Err(LoadError::NoTemplate { dir: dir.into() }),
            }
        };
        let specials = SpecialTokens {
            bos: special(&config, "bos_token"),
            eos: special(&config, "eos_token"),
            unk: special(&config, "unk_token"),
            pad: special(&config, "pad_token"),
        };
        let template = ChatTemplate::parse(&source, specials).map_err(|e| LoadError::Template {
            path: source_path,
            reason: e.to_string(),
        })?;
        Ok(ModelTokenizer {
            dir: dir.to_path_buf(),
            tokenizer,
            template,
        })
    }

    /// The directory the files came from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The chat prompt as the model's template writes it.
    pub fn render_chat(
        &self,
        messages: &[ChatMessage],
        options: &ChatOptions,
    ) -> Result<String, TokenizeError> {
        self.template
            .render(messages, options)
            .map_err(|e| TokenizeError::Template(e.to_string()))
    }

    /// Token ids of `text`; `add_special` adds what the post-processor adds
    /// (BOS for Llama-style tokenizers).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, TokenizeError> {
        self.tokenizer
            .encode_fast(text, add_special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizeError::Encode(e.to_string()))
    }
}

fn read(path: &Path) -> Result<Vec<u8>, LoadError> {
    std::fs::read(path).map_err(|e| LoadError::Read {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// A special token in either form: `"<s>"` or `{"content": "<s>", ...}`.
fn special(config: &Value, key: &str) -> Option<String> {
    match config.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(String::from),
        _ => None,
    }
}

/// `chat_template` as a string, or the `default` of a list of named ones.
fn config_template(config: &Value) -> Option<String> {
    match config.get("chat_template")? {
        Value::String(s) => Some(s.clone()),
        Value::Array(named) => named
            .iter()
            .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
            .and_then(|t| t.get("template")?.as_str().map(String::from)),
        _ => None,
    }
}

//! Reading `/v1/completions` and `/v1/chat/completions` requests the way
//! vLLM's OpenAI server reads them, into prompt tokens and options.
//!
//! Responses are written by [`super::responses`].
//!
//! Prompts are tokenized with the replica's [`PromptTokenizer`]: a model's
//! own tokenizer and chat template (`--tokenizer DIR`), encoded as vLLM
//! encodes them (chat without added special tokens, completions with), or
//! the stand-in with its generic role template. Either way a shared system
//! prompt is a shared token prefix. Sampling
//! parameters (temperature, top_p, stop, ...) are accepted and ignored: the
//! output is deterministic filler whose length is `max_tokens`.

use serde::Deserialize;
use serde_json::Value;

use crate::tokenize::{ChatMessage, PromptTokenizer};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Completions,
    Chat,
}

/// What the simulator needs from a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    pub prompt: Vec<u32>,
    pub max_tokens: Option<usize>,
    pub stream: bool,
    pub include_usage: bool,
    pub priority: i64,
    /// What `kv_transfer_params` asks of the replica.
    pub kv: KvAsk,
}

/// What a request's `kv_transfer_params` ask (vLLM's P/D protocol).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvAsk {
    /// Nothing: prefill and decode here.
    #[default]
    Local,
    /// `do_remote_decode`: prefill here, keep the KV cache for a decode
    /// replica and say where it is.
    RemoteDecode,
    /// `do_remote_prefill`: the prompt's KV cache comes from a prefill
    /// replica (`remote_num_tokens` of it, when said).
    RemotePrefill { tokens: Option<usize> },
}

impl KvAsk {
    fn of(params: Option<&Value>) -> KvAsk {
        let Some(p) = params.filter(|p| p.is_object()) else {
            return KvAsk::Local;
        };
        let flag = |k: &str| p.get(k).and_then(Value::as_bool).unwrap_or(false);
        if flag("do_remote_prefill") {
            KvAsk::RemotePrefill {
                tokens: p
                    .get("remote_num_tokens")
                    .and_then(Value::as_u64)
                    .and_then(|n| usize::try_from(n).ok()),
            }
        } else if flag("do_remote_decode") {
            KvAsk::RemoteDecode
        } else {
            KvAsk::Local
        }
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParseError {
    #[error("{0}")]
    Bad(String),
    #[error("The model `{0}` does not exist.")]
    UnknownModel(String),
}

#[derive(Deserialize)]
struct Wire {
    model: Option<String>,
    prompt: Option<Value>,
    messages: Option<Vec<Message>>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
    priority: Option<i64>,
    n: Option<u64>,
    kv_transfer_params: Option<Value>,
}

#[derive(Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    #[serde(default)]
    content: Option<Value>,
}

/// Parses a request body for `api`, served as `model`, counting prompt
/// tokens with `tokenizer`.
pub fn parse(
    api: Api,
    body: &[u8],
    model: &str,
    tokenizer: &PromptTokenizer,
) -> Result<Parsed, ParseError> {
    let w: Wire = serde_json::from_slice(body)
        .map_err(|e| ParseError::Bad(format!("invalid JSON body: {e}")))?;
    if let Some(m) = &w.model
        && m != model
    {
        return Err(ParseError::UnknownModel(m.clone()));
    }
    if w.n.is_some_and(|n| n != 1) {
        return Err(ParseError::Bad(
            "only n = 1 is supported by llmlb replica-sim".into(),
        ));
    }
    let prompt = match api {
        Api::Completions => completion_prompt(w.prompt.as_ref(), tokenizer)?,
        Api::Chat => chat_prompt(w.messages.as_deref(), tokenizer)?,
    };
    if prompt.is_empty() {
        return Err(ParseError::Bad("the prompt is empty".into()));
    }
    let max_tokens = match w.max_completion_tokens.or(w.max_tokens) {
        Some(0) => return Err(ParseError::Bad("max_tokens must be at least 1".into())),
        Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
        None => None,
    };
    Ok(Parsed {
        prompt,
        max_tokens,
        stream: w.stream,
        include_usage: w.stream && w.stream_options.is_some_and(|o| o.include_usage),
        priority: w.priority.unwrap_or(0),
        kv: KvAsk::of(w.kv_transfer_params.as_ref()),
    })
}

fn completion_prompt(
    p: Option<&Value>,
    tokenizer: &PromptTokenizer,
) -> Result<Vec<u32>, ParseError> {
    let bad = || {
        ParseError::Bad(
            "`prompt` must be a string, a list of token ids, or a list holding one of those".into(),
        )
    };
    match p {
        Some(Value::String(s)) => tokenizer
            .encode_text(s)
            .map_err(|e| ParseError::Bad(e.to_string())),
        Some(Value::Array(items)) if items.iter().all(Value::is_u64) => items
            .iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(bad)
            })
            .collect(),
        Some(Value::Array(items)) if items.len() == 1 => {
            completion_prompt(items.first(), tokenizer)
        }
        Some(Value::Array(_)) => Err(ParseError::Bad(
            "several prompts in one request are not supported by llmlb replica-sim".into(),
        )),
        _ => Err(bad()),
    }
}

fn chat_prompt(
    messages: Option<&[Message]>,
    tokenizer: &PromptTokenizer,
) -> Result<Vec<u32>, ParseError> {
    let messages = messages.ok_or_else(|| ParseError::Bad("`messages` is required".into()))?;
    let mut chat = Vec::with_capacity(messages.len());
    for m in messages {
        let message = ChatMessage::from_json(&m.role, m.content.as_ref()).ok_or_else(|| {
            ParseError::Bad("message `content` must be a string or a list of text parts".into())
        })?;
        chat.push(message);
    }
    tokenizer
        .encode_chat(&chat)
        .map_err(|e| ParseError::Bad(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::stand_in::{render_chat, tokenize};

    fn parse(api: Api, body: &[u8], model: &str) -> Result<Parsed, ParseError> {
        super::parse(api, body, model, &PromptTokenizer::StandIn)
    }

    #[test]
    fn completions_accept_text_ids_and_single_lists() {
        let p = parse(
            Api::Completions,
            br#"{"prompt":"Hello world","max_tokens":3}"#,
            "m",
        )
        .unwrap();
        assert_eq!(p.prompt, tokenize("Hello world"));
        assert_eq!(p.max_tokens, Some(3));
        let p = parse(Api::Completions, br#"{"model":"m","prompt":[5,6,7]}"#, "m").unwrap();
        assert_eq!((p.prompt, p.max_tokens), (vec![5, 6, 7], None));
        let p = parse(Api::Completions, br#"{"prompt":["hi"]}"#, "m").unwrap();
        assert_eq!(p.prompt, tokenize("hi"));
        assert!(parse(Api::Completions, br#"{"prompt":["a","b"]}"#, "m").is_err());
        assert!(parse(Api::Completions, br#"{"prompt":""}"#, "m").is_err());
    }

    #[test]
    fn chat_renders_the_template_and_reads_options() {
        let body = br#"{"messages":[{"role":"system","content":"Be brief."},
            {"role":"user","content":[{"type":"text","text":"hi"}]}],
            "max_completion_tokens":9,"max_tokens":2,"stream":true,
            "stream_options":{"include_usage":true},"priority":-3,"temperature":0.7}"#;
        let p = parse(Api::Chat, body, "m").unwrap();
        assert_eq!(
            p.prompt,
            tokenize(&render_chat([("system", "Be brief."), ("user", "hi")]))
        );
        assert_eq!(p.max_tokens, Some(9), "max_completion_tokens wins");
        assert!(p.stream && p.include_usage);
        assert_eq!(p.priority, -3);
    }

    #[test]
    fn kv_transfer_params_say_which_side_the_replica_plays() {
        let ask = |params: &str| {
            let body = format!(r#"{{"prompt":"a","kv_transfer_params":{params}}}"#);
            parse(Api::Completions, body.as_bytes(), "m").unwrap().kv
        };
        assert_eq!(ask("null"), KvAsk::Local);
        assert_eq!(
            ask(r#"{"do_remote_decode":true,"do_remote_prefill":false}"#),
            KvAsk::RemoteDecode
        );
        assert_eq!(
            ask(r#"{"do_remote_prefill":true,"remote_num_tokens":40}"#),
            KvAsk::RemotePrefill { tokens: Some(40) }
        );
        assert_eq!(
            parse(Api::Completions, br#"{"prompt":"a"}"#, "m")
                .unwrap()
                .kv,
            KvAsk::Local
        );
    }

    #[test]
    fn wrong_model_and_bad_fields_are_rejected() {
        assert_eq!(
            parse(Api::Chat, br#"{"model":"x","messages":[]}"#, "m"),
            Err(ParseError::UnknownModel("x".into()))
        );
        assert!(parse(Api::Chat, br#"{"prompt":"no messages"}"#, "m").is_err());
        assert!(parse(Api::Completions, br#"{"prompt":"a","n":2}"#, "m").is_err());
        assert!(parse(Api::Completions, br#"{"prompt":"a","max_tokens":0}"#, "m").is_err());
        assert!(parse(Api::Completions, b"not json", "m").is_err());
    }
}

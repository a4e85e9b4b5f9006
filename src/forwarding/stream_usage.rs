//! Asking a stream for its token count: a streaming chat or text completion
//! that did not ask for `stream_options.include_usage` is forwarded with it
//! (`[[pools]] stream_usage`, on by default), so the replica ends the stream
//! with a usage event (vLLM: a chunk with `choices: []` and `usage`). llmlb
//! reads the counts from that event and keeps it from the client
//! ([`super::usage_strip`]).
//!
//! A replica that does not know the field answers 400: nothing was
//! generated, so llmlb sends the body as the client sent it to the same
//! replica, and when that is taken, stops adding the field for that
//! replica (`forward.rs`; its streams' tokens are then counted from the
//! events). A request that is bad for another reason gets its 400 twice,
//! the second one reaching the client, except from a replica whose last
//! answer to the field was not a 400: that one is not expected to refuse
//! it, so no copy of the request's headers is kept for a second send, and
//! the first 400 reaches the client.
//!
//! The body is rewritten without re-serialising it when the client sent no
//! `stream_options`: the member is inserted right after the opening brace
//! and every other byte stays as sent. A client's `stream_options` without
//! `include_usage: true` (say `continuous_usage_stats` alone) is merged,
//! which re-serialises the body (key order may change).
//!
//! Cost: none beyond the request's one parse, which reads `stream` and
//! `stream_options` ([`StreamOptions`]); a body is re-serialised only for a
//! merge. A body that is not a JSON object, or does not say
//! `"stream": true`, goes unchanged.

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde_json::{Map, Value};

/// The member inserted into a body that has no `stream_options`.
const INCLUDE_USAGE: &[u8] = br#""stream_options":{"include_usage":true}"#;

/// What a request body's `stream_options` says about usage, read by the
/// body's one parse (`server::request`), so the body is not parsed again
/// here: absent (or the body was not read), `include_usage: true` already,
/// or anything else (`null`, another value, an object without it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StreamOptions {
    #[default]
    Absent,
    IncludesUsage,
    Other,
}

impl<'de> Deserialize<'de> for StreamOptions {
    /// Built as a value (the field is small and rarely sent): an object
    /// whose `include_usage` is `true` (the last one, when repeated) asks
    /// already; any other value does not.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Ok(match Value::deserialize(d)? {
            Value::Object(o) if o.get("include_usage") == Some(&Value::Bool(true)) => {
                StreamOptions::IncludesUsage
            }
            _ => StreamOptions::Other,
        })
    }
}

/// The body to forward when llmlb must ask for usage itself, or `None` when
/// the body goes as sent (not a stream, not a completion path, or the client
/// asked for usage already).
pub fn ask_for_usage(path: &str, body: &Bytes, options: StreamOptions) -> Option<Bytes> {
    if !completion_path(path) {
        return None;
    }
    match options {
        StreamOptions::Absent => insert_first_member(body, &[INCLUDE_USAGE]),
        StreamOptions::IncludesUsage => None,
        // Not an object: the parse in `merge` fails.
        StreamOptions::Other => merge(body),
    }
}

/// `body` with the member written as `parts` first in its object, every
/// other byte as sent; `None` when the body is not a JSON object.
pub fn insert_first_member(body: &Bytes, parts: &[&[u8]]) -> Option<Bytes> {
    let non_space = |from: usize| body[from..].iter().position(|b| !b.is_ascii_whitespace());
    let open = non_space(0).filter(|&i| body[i] == b'{')?;
    let empty = non_space(open + 1).is_some_and(|i| body[open + 1 + i] == b'}');
    let added: usize = parts.iter().map(|p| p.len()).sum();
    let mut out = BytesMut::with_capacity(body.len() + added + 1);
    out.extend_from_slice(&body[..=open]);
    for part in parts {
        out.extend_from_slice(part);
    }
    if !empty {
        out.extend_from_slice(b",");
    }
    out.extend_from_slice(&body[open + 1..]);
    Some(out.freeze())
}

/// Whether the path (the URI's, without its query) takes `stream_options`
/// (chat and text completions: `/chat/completions` ends the same way).
pub fn completion_path(path: &str) -> bool {
    path.ends_with("/completions")
}

/// Sets `stream_options.include_usage = true` in a body that has
/// `stream_options`, keeping its other options.
fn merge(body: &[u8]) -> Option<Bytes> {
    let mut map: Map<String, Value> = serde_json::from_slice(body).ok()?;
    merge_into(&mut map);
    serde_json::to_vec(&map).ok().map(Bytes::from)
}

/// [`merge`] on a body already parsed.
pub fn merge_into(map: &mut Map<String, Value>) {
    let options = map
        .entry("stream_options")
        .or_insert_with(|| Value::Object(Map::new()));
    if !options.is_object() {
        *options = Value::Object(Map::new());
    }
    if let Value::Object(o) = options {
        o.insert("include_usage".into(), Value::Bool(true));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `forward` does with a body the request parse read: only a
    /// stream is asked, with the options the parse found.
    fn ask(path: &str, body: &str) -> Option<String> {
        #[derive(Deserialize)]
        struct Read {
            #[serde(default)]
            stream: Option<bool>,
            #[serde(default)]
            stream_options: StreamOptions,
        }
        let read: Read = serde_json::from_str(body).ok()?;
        if read.stream != Some(true) {
            return None;
        }
        // The request's path, as its URI gives it (`Uri::path`).
        let path = path.split('?').next().unwrap_or("");
        ask_for_usage(path, &Bytes::from(body.to_string()), read.stream_options)
            .map(|b| String::from_utf8(b.to_vec()).unwrap())
    }

    #[test]
    fn inserts_the_option_keeping_every_other_byte() {
        let body = " {\"model\":\"m\", \"stream\": true,\"messages\":[]}";
        assert_eq!(
            ask("/v1/chat/completions", body).unwrap(),
            " {\"stream_options\":{\"include_usage\":true},\"model\":\"m\", \"stream\": true,\"messages\":[]}"
        );
        assert!(ask("/v1/completions?x=1", body).is_some());
    }

    #[test]
    fn leaves_other_requests_alone() {
        let stream = r#"{"model":"m","stream":true}"#;
        assert_eq!(ask("/v1/embeddings", stream), None);
        assert_eq!(ask("/v1/chat/completions", r#"{"model":"m"}"#), None);
        assert_eq!(
            ask("/v1/chat/completions", r#"{"model":"m","stream":false}"#),
            None
        );
        assert_eq!(ask("/v1/chat/completions", r#"[{"stream":true}]"#), None);
        assert_eq!(ask("/v1/chat/completions", "{\"stream\":tru"), None);
        let asked = r#"{"stream":true,"stream_options":{"include_usage":true}}"#;
        assert_eq!(ask("/v1/chat/completions", asked), None);
    }

    #[test]
    fn merges_into_the_clients_own_options() {
        let body = r#"{"stream":true,"stream_options":{"continuous_usage_stats":true,"include_usage":false}}"#;
        let v: Value = serde_json::from_str(&ask("/v1/completions", body).unwrap()).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
        assert_eq!(v["stream_options"]["continuous_usage_stats"], true);
        let body = r#"{"stream":true,"stream_options":null}"#;
        let v: Value = serde_json::from_str(&ask("/v1/completions", body).unwrap()).unwrap();
        assert_eq!(v["stream_options"]["include_usage"], true);
    }
}

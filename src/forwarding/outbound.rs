//! The body a request leaves with, edited in one place: the model name an
//! alias resolved to (`[[pools]] aliases`), the request's priority level as
//! vLLM's `priority` field (`[[pools]] send_priority`), and
//! `stream_options.include_usage` for a stream llmlb asks for its token count
//! (`[[pools]] stream_usage`, [`super::stream_usage`]).
//!
//! The body is parsed at most once: not at all when no edit applies or the
//! edits are insertions (`priority` and `stream_options` go right after the
//! opening brace), once when the model is rewritten or the client sent a
//! `priority` of its own (llmlb's level replaces it), and the same parse
//! serves a merge into the client's own `stream_options`. Both bodies are
//! made before the first attempt: the one with `stream_options` goes to
//! every replica that has not refused the field, the other to those that
//! have.

use bytes::Bytes;
use serde_json::{Map, Value};

use super::stream_usage::{
    StreamOptions, ask_for_usage, completion_path, insert_first_member, merge_into,
};
use crate::routing::RouteError;

/// The bodies one request may be forwarded with.
#[derive(Debug, Clone)]
pub struct Outbound {
    /// As the client sent it, with the served model name under an alias.
    pub body: Bytes,
    /// The same with `stream_options.include_usage` added, when llmlb asks
    /// the stream for its usage itself.
    pub with_usage: Option<Bytes>,
}

impl Outbound {
    /// Applies the request's edits to `sent` (a request to `path`, the URI's
    /// path without its query): `rewrite` names the model the
    /// replicas serve (an alias resolved), `usage` is `Some` with the
    /// client's `stream_options` when the request streams and its pool asks
    /// streams for their usage, `priority` is `Some` with the level to send
    /// when the pool sends it (chat and text completions only).
    pub fn edit(
        sent: &Bytes,
        path: &str,
        rewrite: Option<&str>,
        usage: Option<StreamOptions>,
        priority: Option<u32>,
    ) -> Result<Outbound, RouteError> {
        let priority = priority.filter(|_| completion_path(path));
        // A client's own `priority` is replaced, so it needs the parse.
        let theirs = priority.is_some() && memchr::memmem::find(sent, b"\"priority\"").is_some();
        if rewrite.is_none() && !theirs {
            let body = match priority {
                Some(level) => insert_priority(sent, level),
                None => sent.clone(),
            };
            return Ok(Outbound {
                with_usage: usage.and_then(|o| ask_for_usage(path, &body, o)),
                body,
            });
        }
        let mut map: Map<String, Value> =
            serde_json::from_slice(sent).map_err(RouteError::BodyNotObject)?;
        if let Some(model) = rewrite {
            map.insert("model".into(), Value::String(model.into()));
        }
        if let Some(level) = priority {
            map.insert("priority".into(), Value::from(level));
        }
        let body = Bytes::from(serde_json::to_vec(&map).map_err(RouteError::Rewrite)?);
        let with_usage = match usage {
            // The client's own options are merged into the one parse.
            Some(StreamOptions::Other) if completion_path(path) => {
                merge_into(&mut map);
                serde_json::to_vec(&map).ok().map(Bytes::from)
            }
            Some(options) => ask_for_usage(path, &body, options),
            None => None,
        };
        Ok(Outbound { body, with_usage })
    }
}

/// `sent` with `"priority":LEVEL` as its first member; a body that is not a
/// JSON object goes unchanged (the replica answers it as it would have).
fn insert_priority(sent: &Bytes, level: u32) -> Bytes {
    let mut digits = itoa::Buffer::new();
    let level = digits.format(level).as_bytes();
    insert_first_member(sent, &[b"\"priority\":", level]).unwrap_or_else(|| sent.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edit(body: &str, rewrite: Option<&str>, usage: Option<StreamOptions>) -> Outbound {
        Outbound::edit(
            &Bytes::from(body.to_string()),
            "/v1/chat/completions",
            rewrite,
            usage,
            None,
        )
        .unwrap()
    }

    fn with_priority(path: &str, body: &str, rewrite: Option<&str>, level: u32) -> Outbound {
        let usage = Some(StreamOptions::Absent);
        Outbound::edit(
            &Bytes::from(body.to_string()),
            path,
            rewrite,
            usage,
            Some(level),
        )
        .unwrap()
    }

    fn json(b: &Bytes) -> Value {
        serde_json::from_slice(b).unwrap()
    }

    #[test]
    fn no_edit_keeps_the_bytes_as_sent() {
        let sent = r#"{"model":"m", "stream":false}"#;
        let out = edit(sent, None, None);
        assert_eq!(out.body, sent.as_bytes());
        assert_eq!(out.with_usage, None);
    }

    #[test]
    fn an_alias_and_a_stream_get_both_edits_from_one_parse() {
        let sent = r#"{"model":"alias","stream":true,"messages":[]}"#;
        let out = edit(sent, Some("served"), Some(StreamOptions::Absent));
        assert_eq!(json(&out.body)["model"], "served");
        assert_eq!(json(&out.body).get("stream_options"), None);
        let usage = json(out.with_usage.as_ref().unwrap());
        assert_eq!(usage["model"], "served");
        assert_eq!(usage["stream_options"]["include_usage"], true);
    }

    #[test]
    fn the_clients_own_options_are_merged_under_an_alias() {
        let sent =
            r#"{"model":"alias","stream":true,"stream_options":{"continuous_usage_stats":true}}"#;
        let out = edit(sent, Some("served"), Some(StreamOptions::Other));
        let usage = json(out.with_usage.as_ref().unwrap());
        assert_eq!(usage["model"], "served");
        assert_eq!(usage["stream_options"]["include_usage"], true);
        assert_eq!(usage["stream_options"]["continuous_usage_stats"], true);
        // Without an alias the same merge, from the body as sent.
        let plain = edit(sent, None, Some(StreamOptions::Other));
        assert_eq!(plain.body, sent.as_bytes());
        let usage = json(plain.with_usage.as_ref().unwrap());
        assert_eq!(usage["model"], "alias");
        assert_eq!(usage["stream_options"]["include_usage"], true);
    }

    #[test]
    fn a_body_that_is_not_an_object_cannot_take_an_alias() {
        let err = Outbound::edit(
            &Bytes::from_static(b"[1]"),
            "/v1/chat/completions",
            Some("served"),
            None,
            None,
        )
        .unwrap_err();
        assert!(matches!(err, RouteError::BodyNotObject(_)));
    }

    #[test]
    fn the_level_is_inserted_as_the_first_member_of_both_bodies() {
        let sent = " {\"model\":\"m\", \"stream\": true}";
        let out = with_priority("/v1/completions", sent, None, 1);
        assert_eq!(
            out.body,
            " {\"priority\":1,\"model\":\"m\", \"stream\": true}"
        );
        let usage = json(out.with_usage.as_ref().unwrap());
        assert_eq!(usage["priority"], 1);
        assert_eq!(usage["stream_options"]["include_usage"], true);
        let out = with_priority("/v1/chat/completions", "{ }", None, 0);
        assert_eq!(out.body, "{\"priority\":0 }");
        assert_eq!(json(&out.body)["priority"], 0);
    }

    #[test]
    fn the_clients_own_priority_is_replaced_in_one_parse_with_the_alias() {
        let sent = r#"{"model":"alias","stream":true,"priority":-5}"#;
        let out = with_priority("/v1/chat/completions", sent, Some("served"), 2);
        for body in [&out.body, out.with_usage.as_ref().unwrap()] {
            let v = json(body);
            assert_eq!(
                (v["priority"].as_i64(), v["model"].as_str()),
                (Some(2), Some("served"))
            );
        }
        let out = with_priority("/v1/completions", r#"{"priority":-5}"#, None, 3);
        assert_eq!(json(&out.body)["priority"], 3);
        // The word inside a prompt costs a parse, and changes nothing else.
        let out = with_priority("/v1/completions", r#"{"prompt":"\"priority\""}"#, None, 1);
        assert_eq!(json(&out.body)["prompt"], "\"priority\"");
        assert_eq!(json(&out.body)["priority"], 1);
    }

    #[test]
    fn other_paths_and_other_bodies_go_as_sent() {
        let sent = r#"{"model":"m","input":"x"}"#;
        assert_eq!(with_priority("/v1/embeddings", sent, None, 1).body, sent);
        assert_eq!(with_priority("/v1/completions", "[1]", None, 1).body, "[1]");
    }
}

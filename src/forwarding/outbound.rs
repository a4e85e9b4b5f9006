//! The body a request leaves with, edited in one place: the model name an
//! alias resolved to (`[[pools]] aliases`), and `stream_options.include_usage`
//! for a stream llmlb asks for its token count (`[[pools]] stream_usage`,
//! [`super::stream_usage`]).
//!
//! The body is parsed at most once: not at all when neither edit applies or
//! only `stream_options` is inserted (a byte insertion after the opening
//! brace), once when the model is rewritten, and the same parse serves a
//! merge into the client's own `stream_options`. Both bodies are made before
//! the first attempt: the one with `stream_options` goes to every replica
//! that has not refused the field, the other to those that have.

use bytes::Bytes;
use serde_json::{Map, Value};

use super::stream_usage::{StreamOptions, ask_for_usage, completion_path, merge_into};
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
    /// Applies the request's edits to `sent`: `rewrite` names the model the
    /// replicas serve (an alias resolved), `usage` is `Some` with the
    /// client's `stream_options` when the request streams and its pool asks
    /// streams for their usage.
    pub fn edit(
        sent: &Bytes,
        path_and_query: &str,
        rewrite: Option<&str>,
        usage: Option<StreamOptions>,
    ) -> Result<Outbound, RouteError> {
        let Some(model) = rewrite else {
            return Ok(Outbound {
                body: sent.clone(),
                with_usage: usage.and_then(|o| ask_for_usage(path_and_query, sent, o)),
            });
        };
        let mut map: Map<String, Value> =
            serde_json::from_slice(sent).map_err(RouteError::BodyNotObject)?;
        map.insert("model".into(), Value::String(model.into()));
        let body = Bytes::from(serde_json::to_vec(&map).map_err(RouteError::Rewrite)?);
        let with_usage = match usage {
            // The client's own options are merged into the one parse.
            Some(StreamOptions::Other) if completion_path(path_and_query) => {
                merge_into(&mut map);
                serde_json::to_vec(&map).ok().map(Bytes::from)
            }
            Some(options) => ask_for_usage(path_and_query, &body, options),
            None => None,
        };
        Ok(Outbound { body, with_usage })
    }
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
        )
        .unwrap_err();
        assert!(matches!(err, RouteError::BodyNotObject(_)));
    }
}

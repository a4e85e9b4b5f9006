//! Property tests of the parsers that face untrusted input: request-body
//! extraction (client bytes) and the config parser (operator text). The
//! Prometheus reader has its own in `signals_parse.rs`. The same functions
//! are fuzzed by the targets in `fuzz/`.

use llmlb::server::request::extract;
use proptest::prelude::*;
use serde_json::{Value, json};

const VALID_CONFIG: &str = r#"
[server]
listen = "127.0.0.1:8080"
admin_listen = "127.0.0.1:9090"
drain_delay = "1s"
max_connections = 100

[[pools]]
name = "chat"
models = ["llama-3-8b"]
balancer = "least_connections"
max_pending = 10

[pools.timeouts]
connect = "1s"

[[pools.replicas]]
url = "http://127.0.0.1:8001"
weight = 2
"#;

/// Arbitrary JSON values, a few levels deep.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(".{0,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Request bodies shaped like OpenAI calls, with arbitrary extra fields and
/// sometimes a missing or ill-typed `model`.
fn request_body() -> impl Strategy<Value = Value> {
    (
        prop_oneof![
            3 => "\\PC{1,20}".prop_map(Value::String),
            1 => json_value(),
        ],
        any::<bool>(),
        prop::option::of(any::<u32>()),
        prop::collection::vec(("(system|user|assistant)", "\\PC{0,30}"), 0..4),
        prop::collection::btree_map("x_[a-z]{1,5}", json_value(), 0..3),
    )
        .prop_map(|(model, stream, max_tokens, messages, extra)| {
            let mut o = serde_json::Map::new();
            o.insert("model".into(), model);
            o.insert("stream".into(), json!(stream));
            if let Some(n) = max_tokens {
                o.insert("max_tokens".into(), json!(n));
            }
            let msgs: Vec<Value> = messages
                .into_iter()
                .map(|(role, content)| json!({"role": role, "content": content}))
                .collect();
            o.insert("messages".into(), Value::Array(msgs));
            o.extend(extra);
            Value::Object(o)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn extract_never_panics_and_agrees_with_serde_json(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(meta) = extract(&bytes) {
            let v: Value = serde_json::from_slice(&bytes).expect("extract accepted invalid JSON");
            prop_assert_eq!(v["model"].as_str(), Some(meta.model.as_str()));
        }
    }

    #[test]
    fn extract_finds_the_model_serde_json_finds(body in request_body()) {
        let bytes = serde_json::to_vec(&body).unwrap();
        let result = extract(&bytes);
        match body["model"].as_str() {
            Some(model) if !model.is_empty() => {
                let meta = result.expect("a well-formed body with a string model is accepted");
                prop_assert_eq!(meta.model.as_str(), model);
                prop_assert_eq!(meta.stream, body["stream"].as_bool().unwrap());
                prop_assert_eq!(meta.max_tokens.map(u64::from), body["max_tokens"].as_u64());
                let read = meta.messages.as_ref().expect("chat messages");
                let sent = body["messages"].as_array().unwrap();
                prop_assert_eq!(read.len(), sent.len());
                for (m, r) in sent.iter().zip(read) {
                    prop_assert_eq!(r.role.as_str(), m["role"].as_str().unwrap());
                    prop_assert_eq!(r.joined(""), m["content"].as_str().unwrap());
                }
            }
            _ => prop_assert!(result.is_err(), "a body without a string model is refused"),
        }
    }

    #[test]
    fn extract_never_panics_on_mangled_requests(body in request_body(), cut in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let mut bytes = serde_json::to_vec(&body).unwrap();
        let i = cut.index(bytes.len());
        bytes[i] = byte;
        let _ = extract(&bytes);
        bytes.truncate(i);
        let _ = extract(&bytes);
    }

    #[test]
    fn config_parser_never_panics_on_arbitrary_text(text in "\\PC{0,200}") {
        let _ = llmlb::config::parse(&text);
    }

    #[test]
    fn config_parser_never_panics_on_mangled_configs(
        at in any::<prop::sample::Index>(),
        insert in "(\\PC|\n|\"|\\[|\\]|=){0,8}",
        cut in any::<bool>(),
    ) {
        let mut text = VALID_CONFIG.to_string();
        let mut i = at.index(text.len() + 1);
        while !text.is_char_boundary(i) {
            i -= 1;
        }
        if cut {
            text.truncate(i);
        }
        text.insert_str(i.min(text.len()), &insert);
        if let Err(issues) = llmlb::config::parse(&text) {
            prop_assert!(!issues.is_empty());
            prop_assert!(issues.iter().all(|i| !i.reason.is_empty()));
        }
    }
}

#[test]
fn the_base_config_of_the_mangling_test_is_valid() {
    let c = llmlb::config::parse(VALID_CONFIG).expect("valid");
    assert_eq!(c.pools[0].max_pending, 10);
    assert_eq!(c.server.max_connections, 100);
}

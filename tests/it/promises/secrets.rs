//! No secrets upstream: the client's key and llmlb's control headers stay
//! at the proxy; a pool may send its own key to the replicas.

use crate::common::*;

const KEY: &str = "sk-client-secret-0001";

fn config(up: &Upstream, pool_extra: &str) -> String {
    let digest = llmlb::gateway::keys::hash_key(KEY);
    format!(
        "[gateway]\nauth = true\n[[tiers]]\nname = \"paid\"\npriority = \"high\"\n\
         [[keys]]\nsha256 = \"{digest}\"\ntenant = \"acme\"\ntier = \"paid\"\n\
         [[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\n{pool_extra}\n\
         [[pools.replicas]]\nurl = \"{}\"\n",
        up.url()
    )
}

fn with_secrets(bearer: bool) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    let mut req = chat_request("/v1/chat/completions", CHAT);
    let h = req.headers_mut();
    if bearer {
        h.insert("authorization", format!("Bearer {KEY}").parse().unwrap());
    } else {
        h.insert("x-api-key", KEY.parse().unwrap());
    }
    h.insert("x-llmlb-tier", "paid".parse().unwrap());
    h.insert("x-llmlb-version", "v2".parse().unwrap());
    h.insert("x-llmlb-anything", "1".parse().unwrap());
    h.insert("x-custom", "kept".parse().unwrap());
    req
}

#[tokio::test]
async fn the_clients_key_and_control_headers_are_not_forwarded() {
    let up = Upstream::start("a", Mode::Json).await;
    let lb = start_llmlb(&config(&up, "")).await;
    for bearer in [true, false] {
        let (status, _, _) = call(lb.addr, with_secrets(bearer)).await;
        assert_eq!(status, 200);
        let seen = up.last_seen();
        for name in [
            "authorization",
            "x-api-key",
            "x-llmlb-tier",
            "x-llmlb-version",
            "x-llmlb-anything",
        ] {
            assert!(
                seen.headers.get(name).is_none(),
                "{name} reached the replica"
            );
        }
        assert_eq!(seen.headers["x-custom"], "kept");
        let all = format!("{:?}", seen.headers);
        assert!(!all.contains(KEY), "the key reached the replica: {all}");
    }
}

#[tokio::test]
async fn a_pool_sends_its_own_upstream_key() {
    let up = Upstream::start("a", Mode::Json).await;
    let lb = start_llmlb(&config(&up, "upstream_api_key = \"replica-key-7\"")).await;
    let (status, _, _) = call(lb.addr, with_secrets(true)).await;
    assert_eq!(status, 200);
    let seen = up.last_seen();
    assert_eq!(seen.headers["authorization"], "Bearer replica-key-7");
    assert!(seen.headers.get("x-api-key").is_none());
}

#[test]
fn the_redis_password_is_redacted_for_logs() {
    assert_eq!(
        llmlb::gateway::redact_url("redis://user:hunter2@cache.internal:6379/0"),
        "redis://user:***@cache.internal:6379/0"
    );
    assert_eq!(
        llmlb::gateway::redact_url("redis://:hunter2@cache:6379"),
        "redis://:***@cache:6379"
    );
    assert_eq!(
        llmlb::gateway::redact_url("redis://cache:6379"),
        "redis://cache:6379"
    );
}

#[test]
fn a_bad_request_log_line_holds_no_request_content() {
    let secret = "my very private prompt";
    let body = format!(r#"{{"model":"m","messages":"{secret}"}}"#);
    let err = llmlb::server::request::extract(body.as_bytes()).unwrap_err();
    assert!(!err.log_message().contains(secret), "{}", err.log_message());
}

#[test]
fn an_empty_upstream_key_is_a_config_error_naming_the_key() {
    let text = crate::common::one_pool(
        "round_robin",
        &[("http://127.0.0.1:1", 1)],
        "upstream_api_key = \"\"",
    );
    let issues = llmlb::config::parse(&text).unwrap_err();
    assert_eq!(issues[0].key, "pools[0].upstream_api_key", "{issues:?}");
}

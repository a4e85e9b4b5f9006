//! Model → pool through a real llmlb: aliases (the replica sees the served
//! name), the default pool, and `/v1/models` listing both.

mod common;

use common::{
    Mode, Upstream, call, chat_request, get_request, metric_value, metrics_text, sample,
    start_llmlb, strings_of,
};
use http::StatusCode;

#[tokio::test]
async fn aliases_rewrite_and_default_pool_catches_the_rest() {
    let llama = Upstream::start("llama", Mode::Json).await;
    let other = Upstream::start("other", Mode::Json).await;
    let config = format!(
        "default_pool = \"fallback\"\n[aliases]\n\"gpt-4o\" = \"llama-3-8b\"\n\
         [[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\n[[pools.replicas]]\nurl = \"{}\"\n\
         [[pools]]\nname = \"fallback\"\nmodels = [\"catch-all\"]\n[[pools.replicas]]\nurl = \"{}\"\n",
        llama.url(),
        other.url()
    );
    let lb = start_llmlb(&config).await;
    let body = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"max_tokens":8}"#;
    let (status, _, _) = call(lb.addr, chat_request("/v1/chat/completions", body)).await;
    assert_eq!(status, StatusCode::OK);
    let seen: serde_json::Value = serde_json::from_slice(&llama.last_seen().body).unwrap();
    assert_eq!(seen["model"], "llama-3-8b");
    assert_eq!(seen["max_tokens"], 8);

    let body = r#"{"model":"mystery-model","prompt":"hi"}"#;
    let (status, _, _) = call(lb.addr, chat_request("/v1/completions", body)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(other.requests(), 1);
    // The default pool's replicas get the body unchanged.
    assert_eq!(&other.last_seen().body[..], body.as_bytes());

    let req = get_request("/v1/models", "llmlb.test");
    let (_, _, list) = call(lb.addr, req).await;
    let v: serde_json::Value = serde_json::from_slice(&list).unwrap();
    let ids = strings_of(&v, "data", "id");
    assert_eq!(ids, ["llama-3-8b", "catch-all", "gpt-4o"]);
    let m = metrics_text(lb.admin_addr).await;
    assert_eq!(
        metric_value(&m, "llmlb_routing_decisions_total", &[("branch", "alias")]),
        1.0
    );
    assert_eq!(
        sample(
            &m,
            r#"llmlb_routing_decisions_total{branch="default_pool"}"#
        ),
        1.0
    );
    lb.shutdown().await;
}

#[tokio::test]
async fn unknown_model_without_default_pool_is_404() {
    let llama = Upstream::start("llama", Mode::Json).await;
    let lb = start_llmlb(&common::one_pool("round_robin", &[(&llama.url(), 1)], "")).await;
    let body = r#"{"model":"nope","prompt":"hi"}"#;
    let (status, _, bytes) = call(lb.addr, chat_request("/v1/completions", body)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(common::error_code(&bytes), "model_not_found");
    lb.shutdown().await;
}

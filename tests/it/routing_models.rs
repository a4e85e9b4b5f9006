//! Model → pool through a real llmlb: aliases (the replica sees the served
//! name), the default pool, and `/v1/models` listing both.

use crate::common;

use bytes::Bytes;
use common::{
    Mode, Upstream, call, chat_request, get_request, metric_value, metrics_text, sample,
    start_llmlb, strings_of,
};
use http::{Request, StatusCode};
use http_body_util::Full;

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

/// `models_from_replicas`: names only the replicas report (as vLLM lists
/// its LoRA adapters) are listed and routed to the pool whose replicas
/// report them, before the default pool; configured names keep their pool.
#[tokio::test]
async fn models_reported_by_replicas_are_listed_and_routed() {
    let sim = |model: &str| {
        let mut c = llmlb::replica_sim::SimConfig::profile("fast").unwrap();
        c.model = model.into();
        c
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let adapters = llmlb::replica_sim::spawn(listener, sim("sql-lora"));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = llmlb::replica_sim::spawn(listener, sim("base-model"));
    // A default pool takes what nobody serves, but not what a replica reports.
    let config = format!(
        "[[pools]]\nname = \"lora\"\nmodels_from_replicas = true\n\
         [pools.health]\nenabled = false\n[[pools.replicas]]\nurl = \"http://{}\"\n\
         [[pools]]\nname = \"base\"\nmodels = [\"base-model\"]\nmodels_from_replicas = true\n\
         [pools.health]\nenabled = false\n[[pools.replicas]]\nurl = \"http://{}\"\n",
        adapters.addr, base.addr
    );
    let lb = start_llmlb(&format!(
        "default_pool = \"base\"\n[server]\nreplica_header = true\n{config}"
    ))
    .await;
    let ask = |model: &str| {
        chat_request(
            "/v1/chat/completions",
            &format!(
                r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}],"max_tokens":2}}"#
            ),
        )
    };
    let (status, headers, _) = call(lb.addr, ask("sql-lora")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-llmlb-replica"], adapters.addr.to_string());
    let (status, headers, _) = call(lb.addr, ask("base-model")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-llmlb-replica"], base.addr.to_string());
    // The default pool's replica got it (and, as vLLM does, refused the name).
    let (status, headers, _) = call(lb.addr, ask("nobody-serves-this")).await;
    assert_eq!(headers["x-llmlb-replica"], base.addr.to_string());
    assert_eq!(status, StatusCode::NOT_FOUND);

    let get = |path: &str| {
        Request::get(path)
            .header("host", "llmlb.test")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let (_, _, list) = call(lb.addr, get("/v1/models")).await;
    let v: serde_json::Value = serde_json::from_slice(&list).unwrap();
    let listed: Vec<(&str, &str)> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["id"].as_str().unwrap(), m["owned_by"].as_str().unwrap()))
        .collect();
    // The configured name once, with its configured pool; the reported one after.
    assert_eq!(listed, [("base-model", "base"), ("sql-lora", "lora")]);
    let (status, _, one) = call(lb.addr, get("/v1/models/sql-lora")).await;
    assert_eq!(status, StatusCode::OK);
    let one: serde_json::Value = serde_json::from_slice(&one).unwrap();
    assert_eq!(one["owned_by"], "lora");
    lb.shutdown().await;
}

#[test]
fn a_pool_without_models_needs_models_from_replicas() {
    let pool = "[[pools]]\nname = \"p\"\n[[pools.replicas]]\nurl = \"http://127.0.0.1:1\"\n";
    let issues = llmlb::config::parse(pool).unwrap_err();
    assert_eq!(issues[0].key, "pools[0].models");
    assert!(
        issues[0].reason.contains("models_from_replicas"),
        "{issues:?}"
    );
    let ok = "[[pools]]\nname = \"p\"\nmodels_from_replicas = true\n[[pools.replicas]]\nurl = \"http://127.0.0.1:1\"\n";
    assert!(llmlb::config::parse(ok).is_ok());
}

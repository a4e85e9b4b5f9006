//! Request traces over OTLP/HTTP, received by a collector stand-in on a
//! loopback socket: the spans llmlb exports, how they nest, and the trace
//! context it continues from the client and hands to the replica.

use crate::common;

use std::net::SocketAddr;

use common::*;
use http::StatusCode;
use serde_json::Value;

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

/// Span and trace ids as lower-case hex (the JSON encoding's form).
fn id(span: &Value, key: &str) -> String {
    span[key].as_str().unwrap_or_default().to_ascii_lowercase()
}

fn otlp(collector: SocketAddr) -> String {
    format!(
        "[telemetry.otlp]\nendpoint = \"http://{collector}\"\nexport_interval = \"50ms\"\nservice_name = \"llmlb-test\"\n"
    )
}

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_continue_the_client_trace_through_queue_route_and_attempt() {
    let (collector, collector_addr) = Collector::start().await;
    let up = Upstream::start("a", Mode::Json).await;
    let pool = one_pool(
        "round_robin",
        &[(&up.url(), 1)],
        "max_inflight = 4\n[pools.health]\nenabled = false\n[pools.queue]\nmax_depth = 8\ntimeout = \"5s\"\n",
    );
    let lb = start_llmlb(&format!("{}{pool}", otlp(collector_addr))).await;
    let mut req = chat_request(
        "/v1/chat/completions",
        r#"{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}]}"#,
    );
    req.headers_mut().insert(
        "traceparent",
        format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01")
            .parse()
            .unwrap(),
    );
    let (status, _, _) = call(lb.addr, req).await;
    assert_eq!(status, StatusCode::OK);

    // The replica got llmlb's attempt as parent, in the client's trace.
    let sent = up.last_seen();
    let parent = sent.headers["traceparent"].to_str().unwrap().to_string();
    let parts: Vec<&str> = parent.split('-').collect();
    assert_eq!(parts.len(), 4, "{parent}");
    assert_eq!(parts[1], CLIENT_TRACE, "{parent}");
    assert_ne!(
        parts[2], CLIENT_SPAN,
        "the replica's parent is llmlb's own span"
    );
    assert_eq!(parts[3], "01", "sampled flag kept: {parent}");

    let spans = collector
        .wait_for(&[
            "POST /v1/chat/completions",
            "llmlb.queue",
            "llmlb.route",
            "llmlb.upstream",
        ])
        .await;
    assert!(
        collector
            .paths
            .lock()
            .unwrap()
            .iter()
            .all(|p| p == "/v1/traces")
    );
    let request = named(&spans, "POST /v1/chat/completions")[0];
    assert_eq!(id(request, "traceId"), CLIENT_TRACE);
    assert_eq!(id(request, "parentSpanId"), CLIENT_SPAN);
    assert_eq!(request["service"], "llmlb-test");
    assert_eq!(
        attr(request, "http.response.status_code").as_deref(),
        Some("200")
    );
    assert_eq!(attr(request, "llmlb.pool").as_deref(), Some("llama"));
    assert_eq!(
        attr(request, "gen_ai.request.model").as_deref(),
        Some("llama-3-8b")
    );
    assert_eq!(attr(request, "llmlb.outcome").as_deref(), Some("complete"));
    let request_id = id(request, "spanId");
    for name in ["llmlb.queue", "llmlb.route", "llmlb.upstream"] {
        let child = named(&spans, name);
        assert_eq!(child.len(), 1, "{name}: {child:?}");
        assert_eq!(id(child[0], "traceId"), CLIENT_TRACE, "{name}");
        assert_eq!(id(child[0], "parentSpanId"), request_id, "{name}");
    }
    let attempt = named(&spans, "llmlb.upstream")[0];
    assert_eq!(id(attempt, "spanId"), parts[2]);
    assert_eq!(attr(attempt, "llmlb.attempt").as_deref(), Some("1"));
    assert_eq!(
        attr(attempt, "http.response.status_code").as_deref(),
        Some("200")
    );
    lb.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_request_starts_its_own_trace_and_marks_the_error() {
    let (collector, collector_addr) = Collector::start().await;
    let dead = refused_addr().await;
    let pool = one_pool(
        "round_robin",
        &[(&format!("http://{dead}"), 1)],
        "[pools.health]\nenabled = false\n",
    );
    let lb = start_llmlb(&format!("{}{pool}", otlp(collector_addr))).await;
    let (status, _, _) = call(
        lb.addr,
        chat_request(
            "/v1/chat/completions",
            r#"{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}]}"#,
        ),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    let spans = collector
        .wait_for(&["POST /v1/chat/completions", "llmlb.upstream"])
        .await;
    let request = named(&spans, "POST /v1/chat/completions")[0];
    // No client context: a new trace, with the request span as its root.
    assert_eq!(id(request, "parentSpanId"), "");
    assert_eq!(id(request, "traceId").len(), 32);
    assert_eq!(
        attr(request, "http.response.status_code").as_deref(),
        Some("502")
    );
    // Status code 2 is ERROR in OTLP.
    assert_eq!(request["status"]["code"], 2, "{request}");
    let attempt = named(&spans, "llmlb.upstream")[0];
    assert_eq!(attempt["status"]["code"], 2, "{attempt}");
    assert_eq!(attempt["status"]["message"], "connect");
    assert_eq!(id(attempt, "traceId"), id(request, "traceId"));
    lb.shutdown().await;
}

#[tokio::test]
async fn a_reload_that_changes_the_exporter_says_it_needs_a_restart() {
    let (_collector, collector_addr) = Collector::start().await;
    let up = Upstream::start("a", Mode::Json).await;
    let pool = one_pool("round_robin", &[(&up.url(), 1)], "");
    let lb = start_llmlb(&format!("{}{pool}", otlp(collector_addr))).await;
    let changed = llmlb::config::parse(&pool).unwrap();
    let summary = llmlb::server::reload::apply(&lb.state, changed);
    assert_eq!(summary.needs_restart, ["telemetry.otlp"]);
    lb.shutdown().await;
}

//! Request traces over OTLP/HTTP, received by a collector stand-in on a
//! loopback socket: the spans llmlb exports, how they nest, and the trace
//! context it continues from the client and hands to the replica.

mod common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::net::TcpListener;

/// A collector stand-in: keeps every span posted to `/v1/traces`.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Value>>>,
    paths: Arc<Mutex<Vec<String>>>,
}

impl Collector {
    async fn start() -> (Collector, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let collector = Collector::default();
        let c = collector.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let c = c.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let c = c.clone();
                        async move {
                            c.paths.lock().unwrap().push(req.uri().path().to_string());
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            let doc: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                            c.keep(&doc);
                            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"{}"))))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        (collector, addr)
    }

    fn keep(&self, doc: &Value) {
        let mut spans = self.spans.lock().unwrap();
        for rs in doc["resourceSpans"].as_array().into_iter().flatten() {
            for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                for span in ss["spans"].as_array().into_iter().flatten() {
                    let mut span = span.clone();
                    span["service"] = service_name(&rs["resource"]);
                    spans.push(span);
                }
            }
        }
    }

    /// Waits (bounded) until spans with all of `names` have arrived.
    async fn wait_for(&self, names: &[&str]) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let spans = self.spans.lock().unwrap().clone();
            if names.iter().all(|n| spans.iter().any(|s| s["name"] == *n)) {
                return spans;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "spans {names:?} not exported within 10 s; got {:?}",
                spans.iter().map(|s| s["name"].clone()).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

fn service_name(resource: &Value) -> Value {
    resource["attributes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|a| a["key"] == "service.name")
        .map(|a| a["value"]["stringValue"].clone())
        .unwrap_or(Value::Null)
}

/// An attribute's value as text (OTLP/JSON writes 64-bit integers as strings).
fn attr(span: &Value, key: &str) -> Option<String> {
    let a = span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)?;
    let v = &a["value"];
    ["stringValue", "intValue", "doubleValue", "boolValue"]
        .iter()
        .find_map(|k| match &v[*k] {
            Value::Null => None,
            Value::String(s) => Some(s.clone()),
            other => Some(other.to_string()),
        })
}

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

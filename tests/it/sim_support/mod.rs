//! Helpers shared by the simulator's HTTP tests: start a replica on
//! `127.0.0.1:0`, talk to it over real HTTP, parse SSE and Prometheus text.

#![allow(dead_code)]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use llmlb::replica_sim::{SimConfig, SimHandle};
use serde_json::Value;

/// A scrape: `(name, sorted labels) -> value`.
pub type Scrape = HashMap<(String, Vec<(String, String)>), f64>;

pub async fn start(config: SimConfig) -> SimHandle {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    llmlb::replica_sim::spawn(listener, config)
}

pub fn fast() -> SimConfig {
    SimConfig::profile("fast").unwrap()
}

pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut b = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    let payload = match body {
        Some(v) => {
            b = b.header("content-type", "application/json");
            Bytes::from(v.to_string())
        }
        None => Bytes::new(),
    };
    let resp = tokio::time::timeout(
        Duration::from_secs(20),
        client.request(b.body(Full::new(payload)).unwrap()),
    )
    .await
    .expect("answer within 20 s")
    .unwrap();
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(bytes.to_vec()).unwrap())
}

pub async fn post(addr: SocketAddr, path: &str, body: Value) -> (u16, String) {
    request(addr, "POST", path, Some(&body)).await
}

pub async fn post_json(addr: SocketAddr, path: &str, body: Value) -> Value {
    let (status, text) = post(addr, path, body).await;
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

/// Sends a POST over a bare TCP connection and returns the connection
/// unread, so a test can drop it mid-request like a client that goes away.
pub async fn raw_post(addr: SocketAddr, path: &str, body: &Value) -> tokio::net::TcpStream {
    use tokio::io::AsyncWriteExt;
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let body = body.to_string();
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    conn.write_all(req.as_bytes()).await.unwrap();
    conn
}

/// The JSON payloads of an SSE stream, strictly checked: every event is a
/// `data: ` line followed by a blank line, and the last one is `[DONE]`.
pub fn sse_events(text: &str) -> Vec<Value> {
    assert!(
        text.ends_with("data: [DONE]\n\n"),
        "stream must end with [DONE]: {text:?}"
    );
    let mut out = Vec::new();
    for event in text.split_terminator("\n\n") {
        let data = event
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("not an SSE data event: {event:?}"));
        assert!(!data.contains('\n'), "one line per event");
        if data == "[DONE]" {
            continue;
        }
        out.push(serde_json::from_str(data).unwrap_or_else(|e| panic!("bad JSON {data:?}: {e}")));
    }
    out
}

/// Prometheus text parsed into `(name, sorted labels) -> value`, checking
/// that every sample belongs to a family declared by `# TYPE` before it.
pub fn parse_metrics(text: &str) -> Scrape {
    let mut families: HashMap<String, String> = HashMap::new();
    let mut out = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(["counter", "gauge", "histogram"].contains(&kind), "{line}");
            families.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap();
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.strip_suffix('}').unwrap()),
            None => (series, ""),
        };
        let family = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s)
                    .filter(|f| families.get(*f).is_some_and(|k| k == "histogram"))
            })
            .unwrap_or(name);
        assert!(
            families.contains_key(family),
            "sample before its # TYPE: {line}"
        );
        let mut labels: Vec<(String, String)> = labels
            .split("\",")
            .filter(|s| !s.is_empty())
            .map(|kv| {
                let (k, v) = kv.split_once("=\"").unwrap();
                (k.to_string(), v.trim_end_matches('"').to_string())
            })
            .collect();
        labels.sort();
        assert!(
            out.insert((name.to_string(), labels), value).is_none(),
            "duplicate series {line}"
        );
    }
    out
}

/// The value of `name` whose labels include every pair in `want`, summed.
pub fn metric(m: &Scrape, name: &str, want: &[(&str, &str)]) -> f64 {
    let mut found = false;
    let sum = m
        .iter()
        .filter(|((n, labels), _)| {
            n == name
                && want
                    .iter()
                    .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, v)| {
            found = true;
            *v
        })
        .sum();
    assert!(found, "no series {name} {want:?}");
    sum
}

pub async fn scrape(addr: SocketAddr) -> Scrape {
    let (status, text) = request(addr, "GET", "/metrics", None).await;
    assert_eq!(status, 200);
    parse_metrics(&text)
}

/// Polls `cond` every 5 ms until it holds, failing after 10 s.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// `POST /v1/completions` with `body`: status and text.
pub async fn complete(addr: SocketAddr, body: Value) -> (u16, String) {
    post(addr, "/v1/completions", body).await
}

/// `POST /v1/completions` with `body`, answered 200: the parsed answer.
pub async fn complete_json(addr: SocketAddr, body: Value) -> Value {
    post_json(addr, "/v1/completions", body).await
}

/// [`complete`] in the background.
pub fn spawn_complete(addr: SocketAddr, body: Value) -> tokio::task::JoinHandle<(u16, String)> {
    tokio::spawn(async move { complete(addr, body).await })
}

/// The label set of requests that stopped at their `max_tokens`.
pub const LENGTH: [(&str, &str); 1] = [("finished_reason", "length")];

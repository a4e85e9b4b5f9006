//! What passes through llmlb unchanged, what it adds, and how it spreads work.

use crate::common;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};

#[tokio::test]
async fn body_bytes_and_headers_pass_through_unchanged() {
    let (up, lb) = one_replica(Mode::Json, "", "").await;
    // Odd spacing, key order and unknown fields must survive byte for byte.
    let body = "{ \"max_tokens\" :5,\"model\":\"llama-3-8b\",  \"prompt\":\"héllo\",\"x_vendor\":{\"k\":[1,2]} }\n";
    let req = Request::post("/v1/completions?trace=1")
        .header("host", "client.example")
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-test")
        .header("x-custom", "kept")
        .header("x-forwarded-for", "10.1.2.3")
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "dropped")
        .header("x-request-id", "req-123")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let (status, headers, _) = call(lb.addr, req).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-request-id"], "req-123");
    let seen = up.last_seen();
    assert_eq!(&seen.body[..], body.as_bytes());
    assert_eq!(seen.path, "/v1/completions");
    assert_eq!(seen.headers["authorization"], "Bearer sk-test");
    assert_eq!(seen.headers["x-custom"], "kept");
    assert_eq!(seen.headers["x-request-id"], "req-123");
    assert_eq!(seen.headers["x-forwarded-for"], "10.1.2.3, 127.0.0.1");
    assert!(
        seen.headers.get("x-hop").is_none(),
        "headers named by Connection are hop-by-hop"
    );
    assert_eq!(seen.headers["host"], up.addr.to_string());
    lb.shutdown().await;
}

#[tokio::test]
async fn request_id_is_generated_when_absent() {
    let (up, lb) = one_replica(Mode::Json, "", "").await;
    let (_, headers, _) = call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
    let id = headers["x-request-id"].to_str().unwrap().to_string();
    assert_eq!(id.len(), 36, "a UUID: {id}");
    assert_eq!(up.last_seen().headers["x-request-id"], id.as_str());
    // Errors carry one too.
    let (_, headers, _) = call(lb.addr, chat_request("/v1/chat/completions", "{")).await;
    assert!(headers.contains_key("x-request-id"));
    lb.shutdown().await;
}

#[tokio::test]
async fn models_are_listed_from_the_config() {
    let up = Upstream::start("a", Mode::Json).await;
    let lb = start_llmlb(&format!(
        "{}\n[[pools]]\nname = \"qwen\"\nmodels = [\"qwen-7b\", \"qwen-7b-chat\"]\n[[pools.replicas]]\nurl = \"{}\"\n",
        one_pool("round_robin", &[(&up.url(), 1)], ""),
        up.url()
    ))
    .await;
    let req = get_request("/v1/models", "x");
    let (status, _, body) = call(lb.addr, req).await;
    assert_eq!(status, StatusCode::OK);
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let ids = strings_of(&v, "data", "id");
    assert_eq!(ids, vec!["llama-3-8b", "qwen-7b", "qwen-7b-chat"]);
    assert_eq!(up.requests(), 0);
    lb.shutdown().await;
}

#[tokio::test]
async fn weighted_round_robin_honours_weights() {
    let [a, b, c] = Upstream::many(["a", "b", "c"], Mode::Json).await;
    let lb = start_llmlb(&one_pool(
        "round_robin",
        &[(&a.url(), 3), (&b.url(), 1), (&c.url(), 1)],
        "",
    ))
    .await;
    let n = 250;
    let mut conn = Conn::open(lb.addr).await;
    for _ in 0..n {
        let resp = conn.send(chat_request("/v1/chat/completions", CHAT)).await;
        assert_eq!(resp.status(), StatusCode::OK);
        resp.into_body().collect().await.unwrap();
    }
    // Tolerance: within 2% of the weighted share (smooth WRR is exact per cycle
    // of 5 picks, so 250 sequential requests split 150/50/50).
    let expect = [(a.requests(), 150), (b.requests(), 50), (c.requests(), 50)];
    for (got, want) in expect {
        assert!(got.abs_diff(want) <= n / 50, "{expect:?}");
    }
    lb.shutdown().await;
}

#[tokio::test]
async fn h2c_prior_knowledge_streams_too() {
    let (up, lb) = one_replica(Mode::StreamHeld, "", "").await;
    let stream = tokio::net::TcpStream::connect(lb.addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = Request::post(format!("http://{}/v1/chat/completions", lb.addr))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(CHAT_STREAM)))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.version(), http::Version::HTTP_2);
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(first.starts_with(b"data: "));
    finish_stream(&up, body, "the held stream completes").await;
    lb.shutdown().await;
}

#[tokio::test]
async fn admin_reports_health_readiness_and_metrics() {
    let (up, lb) = one_replica(Mode::Json, "", "").await;
    for path in ["/healthz", "/readyz"] {
        let req = get_request(path, "a");
        let (status, _, _) = call(lb.admin_addr, req).await;
        assert_eq!(status, StatusCode::OK, "{path}");
    }
    for _ in 0..3 {
        call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
    }
    let text = metrics_text(lb.admin_addr).await;
    let replica = up.addr.to_string();
    let labels = [("pool", "llama"), ("replica", &replica), ("status", "200")];
    assert_eq!(metric_value(&text, "llmlb_requests_total", &labels), 3.0);
    assert_eq!(
        sample(
            &text,
            r#"llmlb_request_duration_seconds_count{pool="llama"}"#
        ),
        3.0
    );
    assert_eq!(
        sample(
            &text,
            r#"llmlb_time_to_first_byte_seconds_count{pool="llama"}"#
        ),
        3.0
    );
    assert_eq!(
        sample(&text, r#"llmlb_balancer_decisions_total{branch="single"}"#),
        3.0
    );
    lb.shutdown().await;
}

#[tokio::test]
async fn shutdown_lets_a_running_stream_finish() {
    let (up, lb) = one_replica(Mode::StreamHeld, "", "").await;
    let (_conn, body) = held_stream(lb.addr).await;
    let stopping = tokio::spawn(lb.shutdown());
    tokio::task::yield_now().await;
    assert!(!stopping.is_finished());
    finish_stream(&up, body, "the stream completes during drain").await;
    stopping.await.unwrap();
}

#[tokio::test]
async fn replica_header_is_opt_in() {
    let up = Upstream::start("a", Mode::Json).await;
    let pool = one_pool("round_robin", &[(&up.url(), 1)], "");
    let lb = start_llmlb(&pool).await;
    let (_, headers, _) = call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
    assert!(headers.get("x-llmlb-replica").is_none());
    lb.shutdown().await;
    let lb = start_llmlb(&format!("[server]\nreplica_header = true\n{pool}")).await;
    let (_, headers, _) = call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
    assert_eq!(headers["x-llmlb-replica"], up.addr.to_string());
    lb.shutdown().await;
}

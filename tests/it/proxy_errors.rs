//! Every error llmlb answers itself carries the right status and an
//! OpenAI-style JSON body; connection failures are retried elsewhere.

use crate::common;

use common::*;
use http::StatusCode;

#[tokio::test]
async fn malformed_json_is_400() {
    let (up, lb) = one_replica(Mode::Json, "", "").await;
    for body in ["{not json", r#"{"messages":[]}"#, r#"{"model":42}"#] {
        let (status, _, body) = call(lb.addr, chat_request("/v1/chat/completions", body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(error_code(&body), "invalid_request");
    }
    assert_eq!(up.requests(), 0, "bad requests never reach a replica");
    let text = metrics_text(lb.admin_addr).await;
    assert_eq!(
        sample(&text, r#"llmlb_rejections_total{reason="invalid_request"}"#),
        3.0
    );
    lb.shutdown().await;
}

#[tokio::test]
async fn unknown_model_and_path_are_404() {
    let (up, lb) = one_replica(Mode::Json, "", "").await;
    let (status, _, body) = call(
        lb.addr,
        chat_request("/v1/chat/completions", r#"{"model":"gpt-17","prompt":"x"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error_code(&body), "model_not_found");
    let (status, _, body) = call(lb.addr, chat_request("/v2/whatever", "{}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error_code(&body), "not_found");
    let get = get_request("/v1/chat/completions", "x");
    let (status, _, body) = call(lb.addr, get).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(error_code(&body), "method_not_allowed");
    assert_eq!(up.requests(), 0);
    lb.shutdown().await;
}

#[tokio::test]
async fn oversized_body_is_413() {
    let (up, lb) = one_replica(Mode::Json, "[server]\nmax_body_bytes = 1024\n", "").await;
    let big = format!(
        r#"{{"model":"llama-3-8b","prompt":"{}"}}"#,
        "x".repeat(4096)
    );
    // Declared length over the limit.
    let (status, _, body) = call(lb.addr, chat_request("/v1/completions", &big)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(error_code(&body), "payload_too_large");
    // A body that just fits goes through.
    let small = format!(r#"{{"model":"llama-3-8b","prompt":"{}"}}"#, "x".repeat(900));
    let (status, _, _) = call(lb.addr, chat_request("/v1/completions", &small)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(up.requests(), 1);
    lb.shutdown().await;
}

#[tokio::test]
async fn oversized_chunked_body_is_413() {
    let (up, lb) = one_replica(Mode::Json, "[server]\nmax_body_bytes = 1024\n", "").await;
    // Raw HTTP/1.1 with chunked encoding, so no Content-Length announces the size.
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(lb.addr).await.unwrap();
    let chunk = "y".repeat(2000);
    let raw = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n{:x}\r\n{chunk}\r\n0\r\n\r\n",
        chunk.len()
    );
    s.write_all(raw.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    assert!(out.starts_with("HTTP/1.1 413"), "{out}");
    assert!(out.contains("payload_too_large"), "{out}");
    assert_eq!(up.requests(), 0);
    lb.shutdown().await;
}

#[tokio::test]
async fn refused_replica_is_retried_on_another() {
    let up = Upstream::start("a", Mode::Json).await;
    let lb = refused_then(&up, "").await;
    for _ in 0..4 {
        let (status, _, body) = call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
        assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    }
    assert_eq!(up.requests(), 4);
    let text = metrics_text(lb.admin_addr).await;
    assert!(
        metric_value(&text, "llmlb_retries_total", &[("pool", "llama")]) >= 1.0,
        "{text}"
    );
    assert!(
        metric_value(&text, "llmlb_upstream_errors_total", &[("kind", "connect")]) >= 1.0,
        "{text}"
    );
    lb.shutdown().await;
}

#[tokio::test]
async fn all_replicas_refusing_is_502_then_503_once_marked_down() {
    let d1 = refused_addr().await;
    let d2 = refused_addr().await;
    let lb = start_llmlb(&one_pool(
        "least_connections",
        &[(&format!("http://{d1}"), 1), (&format!("http://{d2}"), 1)],
        "[pools.outlier]\nconsecutive_failures = 1\ncooldown = \"60s\"",
    ))
    .await;
    let (status, _, body) = call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(error_code(&body), "upstream_unavailable");
    // Both replicas failed once and are now set aside: nothing healthy is left.
    let (status, _, body) = call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error_code(&body), "no_healthy_replica");
    let ready = get_request("/readyz", "admin");
    let (status, _, _) = call(lb.admin_addr, ready).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    lb.shutdown().await;
}

#[tokio::test]
async fn upstream_silent_past_first_byte_timeout_is_504() {
    let (up, lb) = one_replica(Mode::Hang, "", "[pools.timeouts]\nfirst_byte = \"200ms\"").await;
    let (status, _, body) = call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
    assert_eq!(status, StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(error_code(&body), "upstream_timeout");
    // Giving up also closes the upstream connection.
    up.wait_closed(1, std::time::Duration::from_secs(1)).await;
    lb.shutdown().await;
}

#[tokio::test]
async fn replica_errors_pass_through_unchanged() {
    let (_up, lb) = one_replica(Mode::Status(503), "", "").await;
    let (status, _, body) = call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(String::from_utf8_lossy(&body).contains("replica says no"));
    // A replica answering 503 is full, not dead: it stays eligible.
    assert!(lb.state.topology().pools()[0].replicas[0].is_eligible());
    lb.shutdown().await;
}

/// Valid JSON with a field of the wrong type: 400 naming the field in
/// OpenAI's `param`, and llmlb keeps serving.
#[tokio::test]
async fn wrong_field_types_name_the_param() {
    let (up, lb) = one_replica(Mode::Json, "", "").await;
    for (body, param, words) in [
        (
            r#"{"model":"llama-3-8b","prompt":"x","max_tokens":-1}"#,
            "max_tokens",
            "-1",
        ),
        (
            r#"{"model":"llama-3-8b","prompt":"x","stream":"true"}"#,
            "stream",
            "boolean",
        ),
    ] {
        let (status, _, bytes) = call(lb.addr, chat_request("/v1/completions", body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["error"]["param"], param, "{v}");
        assert_eq!(v["error"]["code"], "invalid_request");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(param) && message.contains(words),
            "{message}"
        );
        assert!(!message.contains("not valid JSON"), "{message}");
    }
    let (status, _, _) = call(
        lb.addr,
        chat_request("/v1/completions", r#"{"model":"llama-3-8b","prompt":"x"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(up.requests(), 1);
}

//! Client-side limits on real sockets: header size and count (431), header
//! read timeout (slowloris), idle keep-alive timeout, maximum connections,
//! and the per-pool circuit breaker (`max_pending`, 503 with a JSON body).

use crate::common;

use std::time::Duration;

use common::*;
use http_body_util::BodyExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMIT: Duration = Duration::from_secs(10);

fn request_with_headers(extra: &str) -> Vec<u8> {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: llmlb.test\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n{extra}\r\n{CHAT}",
        CHAT.len()
    )
    .into_bytes()
}

/// Reads until the peer closes; `true` when it did within `LIMIT`.
async fn closed_by_peer(s: &mut TcpStream) -> bool {
    let mut buf = [0u8; 1024];
    tokio::time::timeout(LIMIT, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

#[tokio::test]
async fn oversized_head_gets_431_and_reaches_no_replica() {
    let (up, lb) = one_replica(Mode::Json, "[server]\nmax_header_bytes = 8192\n", "").await;
    // Under the limit: served.
    let ok = raw_exchange(
        lb.addr,
        &request_with_headers("X-Pad: small\r\n"),
        false,
        LIMIT,
    )
    .await;
    assert_raw_status(&ok, 200);
    assert_eq!(up.requests(), 1);
    let big = format!("X-Big: {}\r\n", "a".repeat(20_000));
    let resp = raw_exchange(lb.addr, &request_with_headers(&big), false, LIMIT).await;
    assert_raw_status(&resp, 431);
    assert_eq!(up.requests(), 1, "the oversized request reached no replica");
    lb.shutdown().await;
}

#[tokio::test]
async fn too_many_header_fields_get_431() {
    let (up, lb) = one_replica(Mode::Json, "[server]\nmax_headers = 10\n", "").await;
    let many: String = (0..20).map(|i| format!("X-H{i}: v\r\n")).collect();
    let resp = raw_exchange(lb.addr, &request_with_headers(&many), false, LIMIT).await;
    assert_raw_status(&resp, 431);
    assert_eq!(up.requests(), 0);
    lb.shutdown().await;
}

#[tokio::test]
async fn slow_head_is_cut_off_by_the_header_read_timeout() {
    let server = "[server]\nheader_read_timeout = \"200ms\"\nclient_idle_timeout = \"60s\"\n";
    let (up, lb) = one_replica(Mode::Json, server, "").await;
    let mut s = TcpStream::connect(lb.addr).await.unwrap();
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: llmlb.test\r\nX-Slow: ")
        .await
        .unwrap();
    assert!(closed_by_peer(&mut s).await, "a half-sent head is cut off");

    // A client that keeps trickling bytes of its head is cut off too: the
    // timer runs from the head's first byte, not from the last one.
    let mut s = TcpStream::connect(lb.addr).await.unwrap();
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nX-Slow: ")
        .await
        .unwrap();
    let cut = tokio::time::timeout(LIMIT, async {
        let mut buf = [0u8; 64];
        loop {
            tokio::time::sleep(Duration::from_millis(40)).await;
            if s.write_all(b"a").await.is_err() {
                return;
            }
            if let Ok(Ok(0) | Err(_)) =
                tokio::time::timeout(Duration::from_millis(1), s.read(&mut buf)).await
            {
                return;
            }
        }
    })
    .await;
    assert!(cut.is_ok(), "a trickling head is cut off");
    assert_eq!(up.requests(), 0);
    let text = metrics_text(lb.admin_addr).await;
    let closed = |reason| {
        metric_value(
            &text,
            "llmlb_client_connections_closed_total",
            &[("listener", "client"), ("reason", reason)],
        )
    };
    assert_eq!(closed("header_timeout"), 2.0);
    assert_eq!(closed("idle_timeout"), 0.0);
    lb.shutdown().await;
}

#[tokio::test]
async fn idle_keep_alive_connection_is_closed_but_a_quiet_stream_is_not() {
    let server = "[server]\nclient_idle_timeout = \"300ms\"";
    let (up, lb) = one_replica(Mode::Json, server, "[pools.timeouts]\nidle = \"30s\"").await;
    // A keep-alive connection that did one request and then says nothing.
    let mut c = Conn::open(lb.addr).await;
    let resp = c.send(chat_request("/v1/chat/completions", CHAT)).await;
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap();
    tokio::time::timeout(LIMIT, &mut c.task)
        .await
        .expect("idle connection closed by llmlb")
        .unwrap();
    let text = metrics_text(lb.admin_addr).await;
    assert_eq!(
        sample(
            &text,
            r#"llmlb_client_connections_closed_total{listener="client",reason="idle_timeout"}"#
        ),
        1.0
    );

    // A stream in flight whose replica stays silent longer than the client
    // idle timeout is not cut: the pool's own idle timeout governs it.
    up.set_mode(Mode::StreamHeld);
    let (_c, body) = held_stream(lb.addr).await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    finish_stream(&up, body, "the held stream completes").await;
    lb.shutdown().await;
}

#[tokio::test]
async fn connections_beyond_the_limit_wait_until_one_closes() {
    let (up, lb) = one_replica(Mode::Json, "[server]\nmax_connections = 1\n", "").await;
    let mut first = Conn::open(lb.addr).await;
    let resp = first.send(chat_request("/v1/chat/completions", CHAT)).await;
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.unwrap();

    // The second connection completes its TCP handshake (listen backlog)
    // but is not served while the first stays open.
    let addr = lb.addr;
    let second =
        tokio::spawn(async move { call(addr, chat_request("/v1/chat/completions", CHAT)).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!second.is_finished(), "served beyond max_connections");
    assert_eq!(up.requests(), 1);
    first.close();
    let (status, _, _) = tokio::time::timeout(LIMIT, second).await.unwrap().unwrap();
    assert_eq!(status, 200);
    assert_eq!(up.requests(), 2);
    lb.shutdown().await;
}

#[tokio::test]
async fn circuit_breaker_refuses_beyond_max_pending_with_json() {
    let (up, lb) = one_replica(Mode::StreamHeld, "", "max_pending = 1").await;
    let (_c, body) = held_stream(lb.addr).await;

    let (status, headers, text) = call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
    assert_eq!(status, 503);
    assert_eq!(headers["content-type"], "application/json");
    assert_eq!(error_code(&text), "pool_overloaded");
    assert_eq!(up.requests(), 1, "the refused request reached no replica");

    up.release_one();
    body.collect().await.unwrap();
    up.set_mode(Mode::Json);
    let (status, _, _) = call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
    assert_eq!(status, 200, "the slot is free again once the stream ended");
    let text = metrics_text(lb.admin_addr).await;
    assert_eq!(
        sample(&text, r#"llmlb_rejections_total{reason="pool_overloaded"}"#),
        1.0
    );
    lb.shutdown().await;
}

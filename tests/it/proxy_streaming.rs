//! Streaming through llmlb: no buffering, cancellation on client disconnect,
//! and least-connections placement by open streams.

use crate::common;

use std::time::Duration;

use common::*;
use http_body_util::BodyExt;

fn cfg(replicas: &[(&str, u32)], balancer: &str) -> String {
    one_pool(balancer, replicas, "")
}

#[tokio::test]
async fn first_sse_chunk_arrives_while_upstream_holds_the_rest() {
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let lb = start_llmlb(&cfg(&[(&up.url(), 1)], "round_robin")).await;
    let (_conn, resp) = open_stream(lb.addr).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut body = resp.into_body();
    // The upstream has sent only its first chunk and is waiting for release.
    let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("first chunk must arrive before the upstream finishes")
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    assert!(
        first.starts_with(b"data: {\"replica\":\"a\",\"n\":1}"),
        "{first:?}"
    );
    assert_eq!(up.open_streams.load(std::sync::atomic::Ordering::SeqCst), 1);
    up.release_one();
    let rest = body.collect().await.unwrap().to_bytes();
    assert_eq!(&rest[..], b"data: {\"n\":2}\n\ndata: [DONE]\n\n");
    lb.shutdown().await;
}

/// Answers read to their end leave their replica connection for the next
/// request; a stream the client dropped closes its own, and the next
/// request gets a new one.
#[tokio::test]
async fn answers_read_to_their_end_share_one_replica_connection() {
    let conns =
        |up: &Upstream| -> Vec<usize> { up.seen.lock().unwrap().iter().map(|s| s.conn).collect() };
    let up = Upstream::start("a", Mode::Json).await;
    let lb = start_llmlb(&cfg(&[(&up.url(), 1)], "round_robin")).await;
    for _ in 0..5 {
        let (status, _, _) = call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
        assert_eq!(status, 200);
    }
    let first = conns(&up);
    assert!(first.iter().all(|&c| c == first[0]), "{first:?}");
    up.set_mode(Mode::StreamHeld);
    let (conn, body) = held_stream(lb.addr).await;
    drop(body);
    conn.close();
    up.wait_closed(1, Duration::from_secs(1)).await;
    up.set_mode(Mode::Json);
    let (status, _, _) = call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
    assert_eq!(status, 200);
    let all = conns(&up);
    assert_eq!(all.len(), 7);
    assert_eq!(all[5], first[0], "the stream went on the same connection");
    assert_ne!(all[6], all[5], "the dropped stream's connection was closed");
    lb.shutdown().await;
}

#[tokio::test]
async fn client_disconnect_mid_stream_closes_upstream_and_releases_load() {
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let lb = start_llmlb(&cfg(&[(&up.url(), 1)], "least_connections")).await;
    let (conn, body) = held_stream(lb.addr).await;
    let replica = lb.state.topology().pools()[0].replicas[0].clone();
    assert_eq!(replica.in_flight(), 1);
    drop(body);
    conn.close();
    up.wait_closed(1, Duration::from_secs(1)).await;
    // The guard travels in the response body: once hyper drops it, the count is back.
    until("in-flight count returns to 0", || replica.in_flight() == 0).await;
    let text = metrics_text(lb.admin_addr).await;
    assert_eq!(metric_value(&text, "llmlb_replica_in_flight", &[]), 0.0);
    assert_eq!(
        metric_value(&text, "llmlb_requests_total", &[("status", "499")]),
        1.0
    );
    lb.shutdown().await;
}

#[tokio::test]
async fn client_disconnect_before_headers_closes_upstream() {
    let up = Upstream::start("a", Mode::Hang).await;
    let lb = start_llmlb(&cfg(&[(&up.url(), 1)], "least_connections")).await;
    let mut conn = Conn::open(lb.addr).await;
    let req = chat_request("/v1/chat/completions", CHAT);
    conn.sender.ready().await.unwrap();
    let pending = conn.sender.send_request(req);
    // Wait until the request has reached the upstream, then go away.
    until("the request reaches the upstream", || up.requests() > 0).await;
    drop(pending);
    conn.close();
    up.wait_closed(1, Duration::from_secs(1)).await;
    let replica = lb.state.topology().pools()[0].replicas[0].clone();
    until("in-flight count returns to 0", || replica.in_flight() == 0).await;
    lb.shutdown().await;
}

#[tokio::test]
async fn least_connections_prefers_replica_with_fewer_open_streams() {
    let [a, b] = Upstream::many(["a", "b"], Mode::StreamHeld).await;
    let lb = start_llmlb(&cfg(&[(&a.url(), 1), (&b.url(), 1)], "least_connections")).await;

    // Two held streams: one must land on each replica.
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(held_stream(lb.addr).await);
    }
    assert_eq!((a.requests(), b.requests()), (1, 1));

    // A third held stream lands somewhere; now one replica has 2 open, the other 1.
    held.push(held_stream(lb.addr).await);
    let (busy, idle) = if a.requests() == 2 {
        (&a, &b)
    } else {
        (&b, &a)
    };
    assert_eq!(busy.requests(), 2);

    // Every further request goes to the replica with fewer open streams.
    for i in 0..4 {
        held.push(held_stream(lb.addr).await);
        let (bi, ii) = (busy.requests(), idle.requests());
        if i == 0 {
            assert_eq!(
                (bi, ii),
                (2, 2),
                "the replica with fewer open streams gets the request"
            );
        }
        // Counts never drift apart by more than one open stream.
        assert!(bi.abs_diff(ii) <= 1, "after {i}: busy {bi}, idle {ii}");
    }
    assert_eq!(busy.requests() + idle.requests(), 7);
    for _ in 0..held.len() {
        a.release_one();
        b.release_one();
    }
    drop(held);
    lb.shutdown().await;
}

#[tokio::test]
async fn silent_stream_past_idle_timeout_ends_with_an_sse_error_event() {
    let (up, lb) = one_replica(Mode::StreamHeld, "", "[pools.timeouts]\nidle = \"200ms\"").await;
    let (_conn, resp) = open_stream(lb.addr).await;
    assert_eq!(resp.status(), 200);
    // The upstream sends one chunk and then nothing: llmlb gives up after 200 ms,
    // tells the client in a parseable SSE event, ends the body and drops the replica.
    let all = tokio::time::timeout(Duration::from_secs(5), resp.into_body().collect())
        .await
        .expect("body ends after the idle timeout")
        .unwrap()
        .to_bytes();
    let text = String::from_utf8_lossy(&all);
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 2, "{text}");
    let err: serde_json::Value =
        serde_json::from_str(events[1].strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(err["error"]["code"], "idle_timeout");
    up.wait_closed(1, Duration::from_secs(1)).await;
    let metrics = metrics_text(lb.admin_addr).await;
    assert_eq!(
        sample(
            &metrics,
            r#"llmlb_upstream_errors_total{kind="idle_timeout"}"#
        ),
        1.0
    );
    lb.shutdown().await;
}

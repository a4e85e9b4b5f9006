//! Bodies have a deadline and a budget: a body that stops arriving gets 408
//! after `server.body_timeout`; bodies held across all connections are capped
//! by `server.max_buffered_bytes` (503 beyond); when the pool is known
//! before the body (one pool, or a tier's own pool), `max_pending` and the
//! queue refuse before the body is read.

use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::common::*;

fn head(len: usize) -> String {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: llmlb.test\r\ncontent-type: application/json\r\n\
         content-length: {len}\r\n\r\n"
    )
}

#[tokio::test]
async fn a_body_that_stops_arriving_gets_408() {
    let (up, lb) = one_replica(Mode::Json, "[server]\nbody_timeout = \"300ms\"\n", "").await;
    let partial = format!("{}{{\"model\":", head(CHAT.len()));
    let resp = raw_exchange(lb.addr, partial.as_bytes(), false, Duration::from_secs(5)).await;
    assert_eq!(
        raw_status(&resp),
        Some(408),
        "{}",
        String::from_utf8_lossy(&resp)
    );
    assert_eq!(up.requests(), 0);
}

#[tokio::test]
async fn bodies_in_flight_are_capped_across_connections() {
    let (_up, lb) = one_replica(Mode::Json, "[server]\nmax_buffered_bytes = 1000\n", "").await;
    // A slow client announces 900 bytes and sends 10.
    let mut slow = tokio::net::TcpStream::connect(lb.addr).await.unwrap();
    slow.write_all(format!("{}{{\"model\":", head(900)).as_bytes())
        .await
        .unwrap();
    let busy = || {
        let lb = lb.state.clone();
        move || lb.buffered_bytes() >= 900
    };
    until("slow body counted", busy()).await;
    // 900 + this one's 200 bytes would exceed 1000.
    let padded = format!(
        r#"{{"model":"llama-3-8b","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(140)
    );
    let (status, _, body) = call(lb.addr, chat_request("/v1/chat/completions", &padded)).await;
    assert_eq!(status, 503, "{}", String::from_utf8_lossy(&body));
    assert_eq!(error_code(&body), "server_busy");
    drop(slow);
    until("slow body released", || lb.state.buffered_bytes() == 0).await;
    let (status, _, _) = call(lb.addr, chat_request("/v1/chat/completions", &padded)).await;
    assert_eq!(status, 200);
}

/// Sends a request head announcing a body that never comes, and returns the
/// status llmlb answers with within 3 s (`None`: it is still waiting for the
/// body, as it must when the pool is not known before the body).
async fn status_before_body(addr: std::net::SocketAddr) -> Option<u16> {
    let resp = raw_exchange(
        addr,
        head(CHAT.len()).as_bytes(),
        false,
        Duration::from_secs(3),
    )
    .await;
    raw_status(&resp)
}

#[tokio::test]
async fn an_overloaded_pool_refuses_before_reading_the_body() {
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let lb = start_llmlb(&one_pool(
        "round_robin",
        &[(&up.url(), 1)],
        "max_pending = 1\n[pools.health]\nenabled = false\n",
    ))
    .await;
    let (conn, held) = open_stream(lb.addr).await;
    until("the stream holds the pool's one pending place", || {
        up.requests() == 1
    })
    .await;
    // The only pool is known from the start: 503 without waiting for the body.
    assert_eq!(status_before_body(lb.addr).await, Some(503));
    drop((held, conn));
    lb.shutdown().await;
}

#[tokio::test]
async fn a_full_queue_refuses_before_reading_the_body() {
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let lb = start_llmlb(&one_pool(
        "round_robin",
        &[(&up.url(), 1)],
        "max_inflight = 1\n[pools.health]\nenabled = false\n[pools.queue]\nmax_depth = 1\n",
    ))
    .await;
    let (conn, held) = open_stream(lb.addr).await;
    until("the stream takes the only slot", || up.requests() == 1).await;
    let addr = lb.addr;
    let queued =
        tokio::spawn(async move { call(addr, chat_request("/v1/chat/completions", CHAT)).await });
    until("one request waits", || {
        queue_depths(&lb).iter().sum::<usize>() == 1
    })
    .await;
    // The level is full: 429 at once, body or not.
    assert_eq!(status_before_body(lb.addr).await, Some(429));
    queued.abort();
    drop((held, conn));
    lb.shutdown().await;
}

#[tokio::test]
async fn with_several_pools_the_body_decides() {
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let other = Upstream::start("b", Mode::Json).await;
    let lb = start_llmlb(&format!(
        "[server]\nbody_timeout = \"5s\"\n{}[[pools]]\nname = \"other\"\nmodels = [\"other-model\"]\n\
         [[pools.replicas]]\nurl = \"{}\"\n",
        one_pool(
            "round_robin",
            &[(&up.url(), 1)],
            "max_pending = 1\n[pools.health]\nenabled = false\n",
        ),
        other.url()
    ))
    .await;
    let (conn, held) = open_stream(lb.addr).await;
    until("the stream holds the pool's one pending place", || {
        up.requests() == 1
    })
    .await;
    // Which pool is not known before the model is read: llmlb waits for it.
    assert_eq!(status_before_body(lb.addr).await, None);
    drop((held, conn));
    lb.shutdown().await;
}

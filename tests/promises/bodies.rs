//! Bodies have a deadline and a budget: a body that stops arriving gets 408
//! after `server.body_timeout`; bodies held across all connections are capped
//! by `server.max_buffered_bytes` (503 beyond).

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

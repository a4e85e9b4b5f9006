//! Graceful drain: after SIGTERM (`Running::drain`) `/readyz` turns 503 at
//! once, the client listener keeps accepting for `drain_delay`, then stops;
//! streams in flight finish. A replica drained through the admin API gets no
//! new work while its running streams finish.

use crate::common;

use std::time::Duration;

use common::*;
use http_body_util::BodyExt;

const LIMIT: Duration = Duration::from_secs(10);

#[tokio::test]
async fn drain_turns_unready_keeps_accepting_then_lets_streams_finish() {
    let server = "[server]\ndrain_delay = \"1500ms\"\ndrain_timeout = \"10s\"\n";
    let (up, lb) = one_replica(Mode::StreamHeld, server, "").await;
    let (addr, admin) = (lb.addr, lb.admin_addr);
    assert_eq!(admin_get(admin, "/readyz").await.0, 200);

    let (_conn, body) = held_stream(addr).await;
    up.set_mode(Mode::Json);

    let stopping = tokio::spawn(lb.drain());
    until_async("readyz 503", LIMIT, async || {
        admin_get(admin, "/readyz").await.0 == 503
    })
    .await;
    // Still accepting during the delay: a new connection is served.
    let (status, _, text) = call(addr, chat_request("/v1/chat/completions", CHAT)).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&text));

    // Then the listener stops accepting.
    until_async("listener closed", LIMIT, async || {
        tokio::net::TcpStream::connect(addr).await.is_err()
    })
    .await;
    assert!(
        !stopping.is_finished(),
        "the held stream keeps the drain open"
    );
    // The admin listener still answers while the client listener drains.
    assert_eq!(admin_get(admin, "/readyz").await.0, 503);
    finish_stream(&up, body, "stream completes").await;
    tokio::time::timeout(LIMIT, stopping)
        .await
        .expect("drain ends once the stream is done")
        .unwrap();
}

#[tokio::test]
async fn drain_timeout_closes_streams_that_do_not_finish() {
    let server = "[server]\ndrain_delay = \"0s\"\ndrain_timeout = \"200ms\"\n";
    let (up, lb) = one_replica(Mode::StreamHeld, server, "").await;
    let (_conn, body) = held_stream(lb.addr).await;
    tokio::time::timeout(LIMIT, lb.drain())
        .await
        .expect("drain gives up after drain_timeout");
    // The client sees its connection end, not a hang.
    let rest = tokio::time::timeout(LIMIT, body.collect()).await.unwrap();
    assert!(rest.is_err() || !rest.unwrap().to_bytes().ends_with(b"[DONE]\n\n"));
    up.wait_closed(1, LIMIT).await;
}

#[tokio::test]
async fn admin_drain_stops_new_work_and_lets_streams_finish() {
    let [a, b] = Upstream::many(["a", "b"], Mode::StreamHeld).await;
    let lb = start_llmlb(&one_pool(
        "round_robin",
        &[(&a.url(), 1), (&b.url(), 1)],
        "",
    ))
    .await;
    let (_conn, body) = held_stream(lb.addr).await;
    let (busy, other) = if a.requests() == 1 {
        (&a, &b)
    } else {
        (&b, &a)
    };
    let name = busy.addr.to_string();
    a.set_mode(Mode::Json);
    b.set_mode(Mode::Json);

    let (status, v) = admin_post(lb.admin_addr, &format!("/admin/replicas/{name}/drain")).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["replicas"][0]["draining"], true);
    assert_eq!(v["replicas"][0]["in_flight"], 1);
    let (_, listing) = admin_get(lb.admin_addr, "/admin/replicas").await;
    let listing: serde_json::Value = serde_json::from_str(&listing).unwrap();
    let entry = replica_entry(&listing, &name).clone();
    assert_eq!(entry["draining"], true);
    assert_eq!(entry["eligible"], false);

    for _ in 0..4 {
        let (status, _, _) = call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
        assert_eq!(status, 200);
    }
    assert_eq!(busy.requests(), 1, "a drained replica gets no new work");
    assert_eq!(other.requests(), 4);
    finish_stream(busy, body, "its stream finishes").await;

    let (status, _) = admin_post(lb.admin_addr, &format!("/admin/replicas/{name}/undrain")).await;
    assert_eq!(status, 200);
    for _ in 0..2 {
        call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
    }
    assert_eq!(busy.requests(), 2, "undrained: back in rotation");

    let (status, v) = admin_post(lb.admin_addr, "/admin/replicas/nope/drain").await;
    assert_eq!(status, 404);
    assert_eq!(v["error"]["code"], "replica_not_found");
    lb.shutdown().await;
}

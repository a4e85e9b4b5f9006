//! Priority tiers through a real llmlb: each tier lands on its replicas, and
//! a higher tier overflows into a lower tier's replicas only when that is
//! configured and only while its own are saturated.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::{
    CHAT, Conn, Mode, Upstream, call, chat_request, metric_value, metrics_text, sample,
    start_llmlb, tier_chat, until,
};
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;

fn config(paid: &Upstream, free: &Upstream, open: &Upstream, overflow: bool) -> String {
    format!(
        "[[tiers]]\nname = \"paid\"\npriority = \"high\"\nreplicas = [\"paid-1\"]\noverflow = {overflow}\n\
         [[tiers]]\nname = \"free\"\npriority = \"low\"\nreplicas = [\"free-1\"]\n\
         [[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\nbalancer = \"round_robin\"\n\
         [pools.saturation]\nmax_in_flight = 1\n\
         [[pools.replicas]]\nurl = \"{}\"\nname = \"paid-1\"\n\
         [[pools.replicas]]\nurl = \"{}\"\nname = \"free-1\"\n\
         [[pools.replicas]]\nurl = \"{}\"\nname = \"open-1\"\n",
        paid.url(),
        free.url(),
        open.url()
    )
}

/// `paid-1` answering in `paid_mode`, `free-1` and `open-1` answering JSON,
/// behind the tiers of `config`.
async fn tiered(
    paid_mode: Mode,
    overflow: bool,
) -> (Upstream, Upstream, Upstream, llmlb::daemon::Running) {
    let paid = Upstream::start("paid-1", paid_mode).await;
    let free = Upstream::start("free-1", Mode::Json).await;
    let open = Upstream::start("open-1", Mode::Json).await;
    let lb = start_llmlb(&config(&paid, &free, &open, overflow)).await;
    (paid, free, open, lb)
}

/// Requests routed outside their tier so far.
fn overflows(metrics: &str) -> f64 {
    sample(
        metrics,
        r#"llmlb_routing_decisions_total{branch="tier_overflow"}"#,
    )
}

fn request(tier: Option<&str>, stream: bool) -> Request<Full<Bytes>> {
    let body = if stream {
        common::CHAT_STREAM
    } else {
        common::CHAT
    };
    let mut req = chat_request("/v1/chat/completions", body);
    if let Some(t) = tier {
        req.headers_mut().insert("x-llmlb-tier", t.parse().unwrap());
    }
    req
}

async fn replica_of(addr: SocketAddr, tier: Option<&str>) -> String {
    let (status, _, body) = call(addr, request(tier, false)).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    v["replica"].as_str().unwrap().to_string()
}

/// Opens a stream that the replica holds open, and returns the response
/// after its first chunk named the replica.
async fn hold(addr: SocketAddr, tier: &str) -> (Conn, Incoming, String) {
    let mut conn = Conn::open(addr).await;
    let resp = conn.send(request(Some(tier), true)).await;
    let mut body = resp.into_body();
    let frame = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("first chunk in time")
        .unwrap()
        .unwrap();
    let text = String::from_utf8(frame.into_data().unwrap().to_vec()).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(text.trim().trim_start_matches("data: ")).unwrap();
    (conn, body, v["replica"].as_str().unwrap().to_string())
}

#[tokio::test]
async fn tiers_land_on_their_replicas() {
    let (_paid, _free, _open, lb) = tiered(Mode::Json, true).await;
    for _ in 0..6 {
        assert_eq!(replica_of(lb.addr, Some("paid")).await, "paid-1");
        assert_eq!(replica_of(lb.addr, Some("free")).await, "free-1");
        // No tier: the replicas no tier reserved.
        assert_eq!(replica_of(lb.addr, None).await, "open-1");
    }
    let m = metrics_text(lb.admin_addr).await;
    assert_eq!(
        metric_value(&m, "llmlb_routing_decisions_total", &[("branch", "tier")]),
        12.0
    );
    assert_eq!(overflows(&m), 0.0);
    lb.shutdown().await;
}

#[tokio::test]
async fn overflow_only_when_configured_and_saturated() {
    let (paid, _free, _open, lb) = tiered(Mode::StreamHeld, true).await;
    // paid-1 busy with one request: at saturation.max_in_flight.
    let (c1, b1, r1) = hold(lb.addr, "paid").await;
    assert_eq!(r1, "paid-1");
    // Saturated: paid overflows into the lower tier's and the open replicas.
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(replica_of(lb.addr, Some("paid")).await);
    }
    assert!(
        seen.iter().all(|r| r == "free-1" || r == "open-1"),
        "{seen:?}"
    );
    // A lower tier never overflows upwards, saturated or not.
    assert_eq!(replica_of(lb.addr, Some("free")).await, "free-1");
    // Once paid-1 has room again, paid goes back to it.
    paid.release_one();
    drop(b1);
    c1.close();
    paid.set_mode(Mode::Json);
    until("in-flight count released", || {
        lb.state.topology().pools()[0].replicas[0].in_flight() == 0
    })
    .await;
    assert_eq!(replica_of(lb.addr, Some("paid")).await, "paid-1");
    let m = metrics_text(lb.admin_addr).await;
    assert_eq!(overflows(&m), 4.0);
    lb.shutdown().await;
}

#[tokio::test]
async fn no_overflow_without_the_rule() {
    let (_paid, free, open, lb) = tiered(Mode::StreamHeld, false).await;
    let (c1, b1, r1) = hold(lb.addr, "paid").await;
    let (c2, b2, r2) = hold(lb.addr, "paid").await;
    assert_eq!((r1.as_str(), r2.as_str()), ("paid-1", "paid-1"));
    assert_eq!(free.requests() + open.requests(), 0);
    let m = metrics_text(lb.admin_addr).await;
    assert_eq!(overflows(&m), 0.0);
    drop((b1, b2));
    c1.close();
    c2.close();
    lb.shutdown().await;
}

/// The priority level each tier's request carried to `up`, in the order
/// they arrived (`None`: no `priority` member).
fn levels_seen(up: &Upstream) -> Vec<Option<i64>> {
    let seen = up.seen.lock().unwrap();
    seen.iter()
        .map(|s| {
            let v: serde_json::Value = serde_json::from_slice(&s.body).unwrap();
            v.get("priority").map(|p| p.as_i64().unwrap())
        })
        .collect()
}

#[tokio::test]
async fn send_priority_tells_the_replica_each_tiers_level() {
    let up = Upstream::start("r", Mode::Json).await;
    let config = |send: bool| {
        format!(
            "[[tiers]]\nname = \"paid\"\npriority = \"high\"\n\
             [[tiers]]\nname = \"free\"\npriority = \"low\"\n\
             [[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\nsend_priority = {send}\n\
             [[pools.replicas]]\nurl = \"{}\"\n",
            up.url()
        )
    };
    let own = r#"{"model":"llama-3-8b","priority":-7,"messages":[{"role":"user","content":"hi"}]}"#;
    let lb = start_llmlb(&config(true)).await;
    for (tier, body) in [("paid", CHAT), ("free", CHAT), ("free", own), ("paid", own)] {
        let (status, _, _) = call(lb.addr, tier_chat(body, tier)).await;
        assert_eq!(status, 200);
    }
    // The client's own `priority` gives way to its tier's level.
    assert_eq!(levels_seen(&up), [Some(0), Some(1), Some(1), Some(0)]);
    lb.shutdown().await;

    // Off (the default): the body goes as the client sent it.
    let lb = start_llmlb(&config(false)).await;
    for body in [CHAT, own] {
        assert_eq!(call(lb.addr, tier_chat(body, "free")).await.0, 200);
    }
    assert_eq!(levels_seen(&up)[4..], [None, Some(-7)]);
    lb.shutdown().await;
}

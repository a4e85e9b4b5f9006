//! The admin status page and its JSON over real loopback sockets: the page is
//! served at `/`, and `/admin/status` follows in-flight requests and
//! ejections as they happen. (`scripts/status-page-check.sh` renders the page
//! in a headless browser.)

mod common;

use common::*;
use http::Request;
use http_body_util::{BodyExt, Full};

fn get(path: &str) -> Request<Full<bytes::Bytes>> {
    Request::get(path)
        .header("host", "admin")
        .body(Full::default())
        .unwrap()
}

async fn status(admin: std::net::SocketAddr) -> serde_json::Value {
    let (code, headers, body) = call(admin, get("/admin/status")).await;
    assert_eq!(code, 200);
    assert_eq!(headers["content-type"], "application/json");
    serde_json::from_slice(&body).unwrap()
}

fn replica<'a>(doc: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    doc["pools"][0]["replicas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no replica {name} in {doc}"))
}

#[tokio::test]
async fn page_is_served_at_the_root() {
    let up = Upstream::start("a", Mode::Json).await;
    let lb = start_llmlb(&one_pool("round_robin", &[(&up.url(), 1)], "")).await;
    let (code, headers, body) = call(lb.admin_addr, get("/")).await;
    assert_eq!(code, 200);
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    let page = String::from_utf8(body.to_vec()).unwrap();
    assert!(page.starts_with("<!doctype html>"));
    assert!(page.contains("fetch(\"/admin/status\""));
}

#[tokio::test]
async fn status_follows_in_flight_and_ejection() {
    let good = Upstream::start("good", Mode::StreamHeld).await;
    let dead = refused_addr().await;
    let config = format!(
        "{}\n[[pools.replicas]]\nurl = \"http://{dead}\"\nname = \"dead\"\n",
        one_pool(
            "round_robin",
            &[],
            &format!(
                "max_inflight = 4\n[pools.outlier]\nconsecutive_failures = 1\n[[pools.replicas]]\nurl = \"{}\"\nname = \"good\"",
                good.url()
            ),
        )
    );
    let lb = start_llmlb(&config).await;

    let before = status(lb.admin_addr).await;
    assert_eq!(before["ready"], true);
    assert_eq!(replica(&before, "dead")["health"]["ejected"], false);
    let levels = before["pools"][0]["queue"]["levels"].as_array().unwrap();
    assert!(!levels.is_empty());
    assert!(levels.iter().all(|l| l["depth"] == 0));

    // Two streams: round-robin sends one of them to the dead replica first,
    // whose refused connection ejects it; the retry lands on the good one.
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut c = Conn::open(lb.addr).await;
        let resp = c
            .send(chat_request("/v1/chat/completions", CHAT_STREAM))
            .await;
        assert_eq!(resp.status(), 200);
        held.push((c, resp));
    }
    let during = status(lb.admin_addr).await;
    assert_eq!(replica(&during, "good")["in_flight"], 2);
    let dead_now = replica(&during, "dead");
    assert_eq!(dead_now["health"]["ejected"], true);
    assert_eq!(dead_now["health"]["ejections"], 1);
    assert_eq!(dead_now["eligible"], false);
    assert_eq!(during["pools"][0]["queue"]["active"], 2);

    for _ in 0..2 {
        good.release_one();
    }
    for (_c, resp) in held {
        resp.into_body().collect().await.unwrap();
    }
    let after = status(lb.admin_addr).await;
    assert_eq!(replica(&after, "good")["in_flight"], 0);
    assert_eq!(after["pools"][0]["queue"]["active"], 0);
}

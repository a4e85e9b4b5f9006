//! The admin status page and its JSON over real loopback sockets: the page is
//! served at `/`, and `/admin/status` follows in-flight requests and
//! ejections as they happen, shows each replica's prefix-cache hit rate from
//! its own `/metrics`, and lists the last dispatches. (`scripts/status-page-check.sh`
//! renders the page in a headless browser.)

use crate::common;
use crate::signals_fake;

use common::*;
use http::Request;
use http_body_util::{BodyExt, Full};

fn get(path: &str) -> Request<Full<bytes::Bytes>> {
    get_request(path, "admin")
}

async fn status(admin: std::net::SocketAddr) -> serde_json::Value {
    let (code, headers, body) = call(admin, get("/admin/status")).await;
    assert_eq!(code, 200);
    assert_eq!(headers["content-type"], "application/json");
    serde_json::from_slice(&body).unwrap()
}

#[tokio::test]
async fn page_is_served_at_the_root() {
    let (_up, lb) = one_replica(Mode::Json, "", "").await;
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
    assert_eq!(replica_entry(&before, "dead")["health"]["ejected"], false);
    let levels = before["pools"][0]["queue"]["levels"].as_array().unwrap();
    assert!(!levels.is_empty());
    assert!(levels.iter().all(|l| l["depth"] == 0));

    // Two streams: round-robin sends one of them to the dead replica first,
    // whose refused connection ejects it; the retry lands on the good one.
    let mut held = Vec::new();
    for _ in 0..2 {
        let (c, resp) = open_stream(lb.addr).await;
        assert_eq!(resp.status(), 200);
        held.push((c, resp));
    }
    let during = status(lb.admin_addr).await;
    assert_eq!(replica_entry(&during, "good")["in_flight"], 2);
    let dead_now = replica_entry(&during, "dead");
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
    assert_eq!(replica_entry(&after, "good")["in_flight"], 0);
    assert_eq!(after["pools"][0]["queue"]["active"], 0);
}

#[tokio::test]
async fn status_shows_prefix_cache_hit_rate_and_recent_dispatches() {
    let fake = signals_fake::Fake::start().await;
    fake.set_metrics(format!(
        "{}# TYPE vllm:prefix_cache_queries counter\n\
         vllm:prefix_cache_queries_total{{engine=\"0\",model_name=\"tiny\"}} 120.0\n\
         vllm:prefix_cache_queries_total{{engine=\"1\",model_name=\"tiny\"}} 80.0\n\
         # TYPE vllm:prefix_cache_hits counter\n\
         vllm:prefix_cache_hits_total{{engine=\"0\",model_name=\"tiny\"}} 40.0\n\
         vllm:prefix_cache_hits_total{{engine=\"1\",model_name=\"tiny\"}} 10.0\n",
        signals_fake::vllm_metrics(1, 0, 0.2)
    ));
    let proxy = signals_fake::Proxy::start(
        &[&fake],
        "",
        "[pools.scrape]\nenabled = true\ninterval = \"50ms\"\ntimeout = \"40ms\"\nstaleness = \"2s\"",
    )
    .await;
    for _ in 0..3 {
        let (code, _) = proxy.chat(false, 4).await;
        assert_eq!(code, 200);
    }
    proxy
        .wait_for(
            &fake,
            std::time::Duration::from_secs(3),
            "prefix cache",
            |r| !r["prefix_cache"]["hit_rate"].is_null(),
        )
        .await;

    let doc = status(proxy.running.admin_addr).await;
    let r = &doc["pools"][0]["replicas"][0];
    // 50 hit tokens of 200 looked up, summed over both engines.
    assert_eq!(r["prefix_cache"]["hits"], 50.0);
    assert_eq!(r["prefix_cache"]["queries"], 200.0);
    assert_eq!(r["prefix_cache"]["hit_rate"], 0.25);

    let recent = doc["recent_dispatches"].as_array().unwrap();
    assert_eq!(recent.len(), 3, "{doc}");
    let seqs: Vec<u64> = recent.iter().map(|d| d["seq"].as_u64().unwrap()).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] > w[1]),
        "newest first: {seqs:?}"
    );
    for d in recent {
        assert_eq!(d["pool"], "p");
        assert_eq!(d["replica"], r["name"]);
        assert_eq!(d["balancer_branch"], "single");
        assert_eq!(d["attempt"], 1);
        assert_eq!(d["outcome"], "200");
        assert!(d["at_unix_ms"].as_u64().unwrap() > 1_600_000_000_000);
    }
    // Names and labels only: nothing of the prompt.
    assert!(!doc.to_string().contains("hello there"));
    proxy.stop().await;
}

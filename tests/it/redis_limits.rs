//! Per-key rate limits shared by two llmlb instances through a real
//! `redis-server` (named directly or by a Redis Sentinel), and the local
//! fallback when Redis goes away.
//!
//! Needs `redis-server` on the PATH (`.ci/run` installs it). Without it the
//! test prints why it did not run, unless `LLMLB_REQUIRE_REDIS` is set (CI
//! sets it), in which case a missing server is a failure.

use crate::common;

use common::*;
use http::StatusCode;

fn config(url: &str, upstream: &str) -> String {
    let key = llmlb::gateway::keys::hash_key("sk-shared");
    format!(
        "limits = {{ backend = \"redis\", url = \"{url}\", timeout = \"200ms\" }}\n\
         [[tiers]]\nname = \"t\"\npriority = \"low\"\n\
         [[keys]]\nsha256 = \"{key}\"\ntenant = \"acme\"\ntier = \"t\"\nrequests_per_minute = 4\n\
         {}",
        one_pool("round_robin", &[(upstream, 1)], ""),
    )
}

async fn send(lb: std::net::SocketAddr) -> (StatusCode, http::HeaderMap) {
    let mut r = chat_request("/v1/chat/completions", CHAT);
    r.headers_mut()
        .insert("authorization", "Bearer sk-shared".parse().unwrap());
    let (status, headers, _) = call(lb, r).await;
    (status, headers)
}

#[tokio::test]
async fn two_instances_share_one_budget_and_fall_back_when_redis_dies() {
    let Some(mut redis) = RedisServer::start("redis_limits").await else {
        return;
    };
    let up = Upstream::start("a", Mode::Json).await;
    let a = start_llmlb(&config(&redis.url(), &up.url())).await;
    let b = start_llmlb(&config(&redis.url(), &up.url())).await;

    // 4 requests per minute for the key, whichever instance serves them.
    let mut remaining = Vec::new();
    for lb in [a.addr, b.addr, a.addr, b.addr] {
        let (status, h) = send(lb).await;
        assert_eq!(status, StatusCode::OK);
        remaining.push(
            h["x-ratelimit-remaining-requests"]
                .to_str()
                .unwrap()
                .to_string(),
        );
    }
    assert_eq!(remaining, vec!["3", "2", "1", "0"]);
    for lb in [a.addr, b.addr] {
        let (status, h) = send(lb).await;
        assert_eq!(
            status,
            StatusCode::TOO_MANY_REQUESTS,
            "the budget is shared"
        );
        assert!(h.contains_key("retry-after"));
    }
    assert_eq!(up.requests(), 4);

    // Redis goes away: requests are never failed closed; each instance uses
    // its local buckets (which have their own, untouched budget) and says so.
    redis.stop();
    let (status, _) = send(a.addr).await;
    assert_eq!(status, StatusCode::OK, "limits fall back to local");
    let text = metrics_text(a.admin_addr).await;
    assert!(
        metric_value(&text, "llmlb_rate_limit_fallbacks_total", &[]) >= 1.0,
        "{text}"
    );
    assert_eq!(metric_value(&text, "llmlb_rate_limit_backend_up", &[]), 0.0);
    a.shutdown().await;
    b.shutdown().await;
}

/// Two instances with the store at `url`: six requests in turn, one
/// budget of 4 between them, the backend up.
async fn one_budget_through(url: &str) {
    let up = Upstream::start("a", Mode::Json).await;
    let a = start_llmlb(&config(url, &up.url())).await;
    let b = start_llmlb(&config(url, &up.url())).await;
    let mut statuses = Vec::new();
    for lb in [a.addr, b.addr, a.addr, b.addr, a.addr, b.addr] {
        statuses.push(send(lb).await.0);
    }
    let ok = StatusCode::OK;
    let full = StatusCode::TOO_MANY_REQUESTS;
    assert_eq!(statuses, [ok, ok, ok, ok, full, full], "one budget of 4");
    let text = metrics_text(b.admin_addr).await;
    assert_eq!(metric_value(&text, "llmlb_rate_limit_backend_up", &[]), 1.0);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn a_budget_is_shared_through_the_master_a_sentinel_names() {
    let Some(redis) = RedisServer::start("redis_limits sentinel").await else {
        return;
    };
    let Some(sentinel) = Sentinel::start("redis_limits sentinel", redis.port, 5_000).await else {
        return;
    };
    one_budget_through(&sentinel.url()).await;
}

#[tokio::test]
async fn a_budget_is_shared_through_a_redis_cluster() {
    let Some(cluster) = RedisCluster::start("redis_limits cluster").await else {
        return;
    };
    one_budget_through(&cluster.url()).await;
}

//! No duplicate generations: a request that reached a replica is never sent
//! to another one; only a request provably not sent is retried.

use super::raw::{Misbehaviour, RawUpstream};
use crate::common::*;

#[tokio::test]
async fn a_request_the_replica_read_is_not_retried_elsewhere() {
    let closer = RawUpstream::start(Misbehaviour::CloseAfterRequest).await;
    let good = Upstream::start("good", Mode::Json).await;
    let lb = start_llmlb(&one_pool(
        "round_robin",
        &[(&closer.url(), 1), (&good.url(), 1)],
        // No health probes: the closing replica counts every request it reads.
        "retries = 2\n[pools.health]\nenabled = false",
    ))
    .await;
    // Round robin starts with the first replica: the one that closes.
    let (status, _, body) = call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
    assert_eq!(closer.requests(), 1);
    assert_eq!(status, 502, "{}", String::from_utf8_lossy(&body));
    assert_eq!(error_code(&body), "upstream_unavailable");
    assert_eq!(
        good.requests(),
        0,
        "no second generation on another replica"
    );
    let text = metrics_text(lb.admin_addr).await;
    assert_eq!(
        metric_value(&text, "llmlb_upstream_errors_total", &[("kind", "reset")]),
        1.0,
        "{text}"
    );
    assert_eq!(
        metric_value(&text, "llmlb_upstream_errors_total", &[("kind", "timeout")]),
        0.0
    );
    assert_eq!(metric_value(&text, "llmlb_retries_total", &[]), 0.0);
}

#[tokio::test]
async fn a_refused_connection_is_retried_on_another_replica() {
    let good = Upstream::start("good", Mode::Json).await;
    let lb = refused_then(&good, "retries = 2").await;
    let (status, _, _) = call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
    assert_eq!(status, 200);
    assert_eq!(good.requests(), 1);
}

#[test]
fn the_upstream_idle_timeout_is_shorter_than_uvicorns_keep_alive() {
    let c =
        llmlb::config::parse(&one_pool("round_robin", &[("http://127.0.0.1:1", 1)], "")).unwrap();
    assert_eq!(
        c.pools[0].timeouts.upstream_idle,
        std::time::Duration::from_secs(4)
    );
    let c = llmlb::config::parse(&one_pool(
        "round_robin",
        &[("http://127.0.0.1:1", 1)],
        "[pools.timeouts]\nupstream_idle = \"1500ms\"",
    ))
    .unwrap();
    assert_eq!(
        c.pools[0].timeouts.upstream_idle,
        std::time::Duration::from_millis(1500)
    );
}

/// Three replicas that refuse connections, five retries allowed: the
/// request goes to each once (two re-sends), then fails. The counter says
/// two: a retry counts when another replica takes it, not when one is
/// looked for.
#[tokio::test]
async fn the_retry_counter_counts_re_sends_not_searches() {
    let dead: Vec<String> = futures_util::future::join_all((0..3).map(|_| refused_addr()))
        .await
        .into_iter()
        .map(|a| format!("http://{a}"))
        .collect();
    let lb = start_llmlb(&one_pool(
        "round_robin",
        &[(&dead[0], 1), (&dead[1], 1), (&dead[2], 1)],
        "retries = 5\n[pools.health]\nenabled = false",
    ))
    .await;
    let (status, _, body) = call(lb.addr, chat_request("/v1/chat/completions", CHAT)).await;
    assert_eq!(status, 502, "{}", String::from_utf8_lossy(&body));
    let text = metrics_text(lb.admin_addr).await;
    assert_eq!(
        metric_value(&text, "llmlb_upstream_errors_total", &[("kind", "connect")]),
        3.0,
        "{text}"
    );
    assert_eq!(
        metric_value(&text, "llmlb_retries_total", &[]),
        2.0,
        "{text}"
    );
}

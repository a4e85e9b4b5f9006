//! `max_inflight` is a hard per-replica limit.

use std::time::Duration;

use crate::common::*;

fn tier_config(free: &Upstream, open: &Upstream) -> String {
    format!(
        "[[tiers]]\nname = \"free\"\npriority = \"low\"\nreplicas = [\"free-1\"]\n\
         [[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\nmax_inflight = 1\n\
         [[pools.replicas]]\nurl = \"{}\"\nname = \"free-1\"\n\
         [[pools.replicas]]\nurl = \"{}\"\nname = \"open-1\"\n",
        free.url(),
        open.url()
    )
}

fn free_stream() -> http::Request<http_body_util::Full<bytes::Bytes>> {
    let mut req = chat_request("/v1/chat/completions", CHAT_STREAM);
    req.headers_mut()
        .insert("x-llmlb-tier", "free".parse().unwrap());
    req
}

/// Two requests of a tier with one replica of limit 1: the pool queue has
/// room for two (two replicas), but the second must wait for the tier's
/// replica instead of overfilling it.
#[tokio::test]
async fn a_tier_subset_never_exceeds_its_replicas_limit() {
    let free = Upstream::start("free-1", Mode::StreamHeld).await;
    let open = Upstream::start("open-1", Mode::StreamHeld).await;
    let lb = start_llmlb(&tier_config(&free, &open)).await;
    let first = tokio::spawn(call(lb.addr, free_stream()));
    until("first on free-1", || free.requests() == 1).await;
    let second = tokio::spawn(call(lb.addr, free_stream()));
    // The second request has been admitted by the queue (capacity 2) and
    // must now wait for free-1's slot.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(free.requests(), 1, "free-1 is at its limit of 1");
    assert_eq!(open.requests(), 0, "open-1 is not the free tier's");
    free.release_one();
    let (status, _, _) = first.await.unwrap();
    assert_eq!(status, 200);
    until("second on free-1", || free.requests() == 2).await;
    free.release_one();
    let (status, _, _) = second.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(open.requests(), 0);
}

/// A reload that changes a replica's weight keeps its in-flight count, so
/// a request arriving after the reload waits instead of overfilling it.
#[tokio::test]
async fn a_reload_that_changes_the_weight_keeps_the_count() {
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let config = |weight: u32| {
        format!(
            "[[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\nmax_inflight = 1\n\
             [pools.queue]\nmax_depth = 8\n\
             [[pools.replicas]]\nurl = \"{}\"\nname = \"a\"\nweight = {weight}\n",
            up.url()
        )
    };
    let lb = start_llmlb(&config(1)).await;
    let stream = || chat_request("/v1/chat/completions", CHAT_STREAM);
    let first = tokio::spawn(call(lb.addr, stream()));
    until("first dispatched", || up.requests() == 1).await;
    let parsed = llmlb::config::parse(&config(5)).unwrap();
    llmlb::server::reload::apply(&lb.state, parsed);
    let replica = lb.state.topology().pools()[0].replicas[0].clone();
    assert_eq!(replica.weight, 5);
    assert_eq!(replica.in_flight(), 1, "the running request still counts");
    let second = tokio::spawn(call(lb.addr, stream()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(up.requests(), 1, "the limit of 1 holds across the reload");
    up.release_one();
    assert_eq!(first.await.unwrap().0, 200);
    until("second dispatched", || up.requests() == 2).await;
    up.release_one();
    assert_eq!(second.await.unwrap().0, 200);
}

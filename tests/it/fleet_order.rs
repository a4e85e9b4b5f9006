//! One queue order across llmlb instances sharing a `[fleet]` store (a
//! real `redis-server`) in front of one replica: a request waiting on one
//! instance at a higher priority gets the next free slot before a lower one
//! that has waited longer on another; a killed instance's waiters stop
//! counting within its TTL; with the store down each instance orders only
//! its own waiters, and says so.

use crate::common;

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use http_body_util::BodyExt;

const TTL: Duration = Duration::from_millis(600);

fn config(redis: &str, upstream: &str) -> String {
    format!(
        "[fleet]\nstore = \"{redis}\"\nrefresh = \"40ms\"\ntimeout = \"40ms\"\n\
         instance_ttl = \"{}ms\"\n{}\
         [[pools.replicas]]\nurl = \"{upstream}\"\n",
        TTL.as_millis(),
        paid_free("[[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\nmax_inflight = 2\n"),
    )
}

/// A streaming chat whose content names `tier`.
fn chat_of(tier: &str) -> String {
    format!(
        r#"{{"model":"llama-3-8b","stream":true,"messages":[{{"role":"user","content":"{tier}"}}]}}"#
    )
}

/// A streaming chat of `tier` whose content names it, held open once its
/// first chunk arrived.
async fn held(addr: SocketAddr, tier: &str) -> (Conn, hyper::body::Incoming) {
    let mut conn = Conn::open(addr).await;
    let resp = conn.send(tier_chat(&chat_of(tier), tier)).await;
    assert_eq!(resp.status(), 200, "{tier}");
    let mut body = resp.into_body();
    body.frame()
        .await
        .expect("a first chunk")
        .expect("it reads");
    (conn, body)
}

/// The tier named by the `n`-th request the replica saw.
fn tier_of(up: &Upstream, n: usize) -> String {
    let seen = up.seen.lock().unwrap();
    let body = String::from_utf8_lossy(&seen[n].body).into_owned();
    ["paid", "free"]
        .into_iter()
        .find(|t| body.contains(&format!("\"content\":\"{t}\"")))
        .unwrap_or("?")
        .to_string()
}

async fn depths_reach(lb: &llmlb::daemon::Running, want: Vec<usize>) {
    until(&format!("queue depths {want:?}"), || {
        queue_depths(lb) == want
    })
    .await;
}

/// `a` holds `b`'s report of its free waiter and `b` holds `a`'s of its
/// paid one.
async fn each_sees_the_other(a: &llmlb::daemon::Running, b: &llmlb::daemon::Running) {
    until("each instance to hold the other's report", || {
        others_depths(a) == vec![0, 1] && others_depths(b) == vec![1, 0]
    })
    .await;
}

/// Both instances run one stream each (the replica's two slots), then a
/// free request queues on `b` and, later, a paid one on `a`; the reports
/// have time to travel.
async fn set_up(
    a: &llmlb::daemon::Running,
    b: &llmlb::daemon::Running,
    up: &Upstream,
) -> [(Conn, hyper::body::Incoming); 2] {
    let on_a = held(a.addr, "free").await;
    until("both instances to hold a lease", || {
        queue_depths(b).is_empty() || up.open_streams.load(Ordering::SeqCst) == 1
    })
    .await;
    let on_b = held(b.addr, "free").await;
    assert_eq!(up.open_streams.load(Ordering::SeqCst), 2);
    [on_a, on_b]
}

#[tokio::test]
async fn a_higher_waiter_on_another_instance_takes_the_freed_slot_first() {
    let Some(redis) = RedisServer::start("fleet-order").await else {
        return;
    };
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let cfg = config(&redis.url(), &up.url());
    let (a, b) = (start_llmlb(&cfg).await, start_llmlb(&cfg).await);
    let [_on_a, on_b] = set_up(&a, &b, &up).await;
    let low = tokio::spawn(held(b.addr, "free"));
    depths_reach(&b, vec![0, 1]).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let high = tokio::spawn(held(a.addr, "paid"));
    depths_reach(&a, vec![1, 0]).await;
    each_sees_the_other(&a, &b).await;
    // The slot frees on b (its client leaves), whose own waiter has
    // waited longer.
    drop(on_b);
    until("a third request at the replica", || up.requests() == 3).await;
    assert_eq!(tier_of(&up, 2), "paid", "the higher waiter went first");
    let _high = high.await.unwrap();
    assert!(!low.is_finished());
    assert_eq!(queue_depths(&b), vec![0, 1]);
    // The next slot goes to the free request.
    up.release_one();
    until("a fourth request", || up.requests() == 4).await;
    assert_eq!(tier_of(&up, 3), "free");
    let _low = low.await.unwrap();
    for _ in 0..2 {
        up.release_one();
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn a_killed_instances_waiters_stop_counting_within_its_ttl() {
    let Some(redis) = RedisServer::start("fleet-order").await else {
        return;
    };
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let file = TempFile::config(
        "fleet-order",
        &serve_config("", &config(&redis.url(), &up.url())),
    );
    let mut doomed = ServeProcess::start(&file.path, &[]);
    let b = start_llmlb(&config(&redis.url(), &up.url())).await;
    let doomed_addr = doomed.addr;
    let _on_doomed = held(doomed_addr, "free").await;
    let on_b = held(b.addr, "free").await;
    let low = tokio::spawn(held(b.addr, "free"));
    depths_reach(&b, vec![0, 1]).await;
    // The paid request's connection dies with its instance: its error is
    // expected and not read.
    let _high = tokio::spawn(async move {
        let mut conn = Conn::open(doomed_addr).await;
        let req = tier_chat(&chat_of("paid"), "paid");
        let _ = conn.sender.send_request(req).await;
    });
    // b holds the doomed instance's report of its paid waiter.
    until("b to see the paid waiter", || {
        others_depths(&b) == vec![1, 0]
    })
    .await;
    doomed.child.0.kill().unwrap();
    let killed = Instant::now();
    doomed.child.0.wait().unwrap();
    drop(on_b);
    // While its report lives, the dead instance's paid waiter still goes
    // first; then the free one gets the slot.
    tokio::time::sleep(Duration::from_millis(100)).await;
    if killed.elapsed() < TTL / 2 {
        assert_eq!(
            queue_depths(&b),
            vec![0, 1],
            "held back for the paid waiter"
        );
    }
    let _low = tokio::time::timeout(Duration::from_secs(10), low)
        .await
        .expect("the free request is served")
        .unwrap();
    let took = killed.elapsed();
    assert!(
        took < TTL * 2 + Duration::from_millis(500),
        "served {took:?} after the kill"
    );
    up.release_one();
    b.shutdown().await;
}

#[tokio::test]
async fn with_the_store_down_each_instance_orders_its_own_waiters() {
    let Some(mut redis) = RedisServer::start("fleet-order").await else {
        return;
    };
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let cfg = config(&redis.url(), &up.url());
    let (a, b) = (start_llmlb(&cfg).await, start_llmlb(&cfg).await);
    let [_on_a, on_b] = set_up(&a, &b, &up).await;
    let low = tokio::spawn(held(b.addr, "free"));
    depths_reach(&b, vec![0, 1]).await;
    let _high = tokio::spawn(held(a.addr, "paid"));
    depths_reach(&a, vec![1, 0]).await;
    each_sees_the_other(&a, &b).await;
    redis.stop();
    until_async(
        "b to notice the store is gone",
        Duration::from_secs(10),
        async || {
            let text = metrics_text(b.admin_addr).await;
            metric_value(&text, "llmlb_fleet_queue_order_fallbacks_total", &[]) >= 1.0
        },
    )
    .await;
    // The slot frees on b: its own waiter takes it.
    drop(on_b);
    let _low = tokio::time::timeout(Duration::from_secs(10), low)
        .await
        .expect("the free request is served")
        .unwrap();
    assert_eq!(tier_of(&up, 2), "free");
    assert_eq!(
        queue_depths(&a),
        vec![1, 0],
        "the paid one still waits on a"
    );
    for _ in 0..3 {
        up.release_one();
    }
    a.shutdown().await;
    b.shutdown().await;
}

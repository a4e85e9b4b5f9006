//! Several llmlb instances sharing one `[fleet]` store (a real
//! `redis-server`) in front of one replica: its `max_inflight` holds for
//! the sum of their requests, while instances come and go and while the
//! store goes away and comes back.

use crate::common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::*;
use http::StatusCode;
use http_body_util::BodyExt;

fn config(redis: &str, upstream: &str, limit: u32) -> String {
    format!(
        "[fleet]\nstore = \"{redis}\"\nrefresh = \"40ms\"\ntimeout = \"40ms\"\ninstance_ttl = \"600ms\"\n{}",
        one_pool(
            "least_connections",
            &[(upstream, 1)],
            &format!("max_inflight = {limit}")
        )
    )
}

/// One streaming chat through `lb`, read to its end: its status.
async fn stream(lb: std::net::SocketAddr) -> StatusCode {
    let (_conn, resp) = open_stream(lb).await;
    let status = resp.status();
    let _ = resp.into_body().collect().await;
    status
}

/// Lets the replica finish held streams one at a time until `done` says
/// stop, recording the most it ever held open at once.
async fn release_and_watch(up: &Upstream, every: Duration, done: impl Fn() -> bool) -> usize {
    let mut peak = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = Instant::now();
    while !done() {
        assert!(Instant::now() < deadline, "the run ends");
        peak = peak.max(up.open_streams.load(Ordering::SeqCst));
        if last.elapsed() >= every && up.open_streams.load(Ordering::SeqCst) > 0 {
            up.release_one();
            last = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    peak
}

#[tokio::test]
async fn three_instances_keep_one_replica_under_its_limit() {
    let Some(redis) = RedisServer::start("fleet").await else {
        return;
    };
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let cfg = config(&redis.url(), &up.url(), 2);
    let lbs = [
        start_llmlb(&cfg).await,
        start_llmlb(&cfg).await,
        start_llmlb(&cfg).await,
    ];
    let peak = limited_run(&[&lbs[0], &lbs[1], &lbs[2]], &up).await;
    assert_eq!(up.requests(), 12);
    assert!(peak <= 2, "the replica held {peak} streams at once");
    assert!(peak >= 1);
    // Every instance lists the three; the status page shows the store.
    let (_, body) = admin_get(lbs[0].admin_addr, "/admin/status").await;
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["fleet"]["store_up"], true, "{doc}");
    assert_eq!(
        doc["fleet"]["instances"].as_array().unwrap().len(),
        3,
        "{doc}"
    );
    let text = metrics_text(lbs[1].admin_addr).await;
    assert_eq!(metric_value(&text, "llmlb_fleet_store_up", &[]), 1.0);
    assert_eq!(metric_value(&text, "llmlb_fleet_instances", &[]), 3.0);
    for lb in lbs {
        lb.shutdown().await;
    }
}

#[tokio::test]
async fn the_store_stopped_and_restarted_under_load_fails_nothing() {
    let Some(mut redis) = RedisServer::start("fleet").await else {
        return;
    };
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let cfg = config(&redis.url(), &up.url(), 3);
    let lbs = [
        start_llmlb(&cfg).await,
        start_llmlb(&cfg).await,
        start_llmlb(&cfg).await,
    ];
    // Six clients, each sending streams one after the other.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..6)
        .map(|i| {
            let (lb, stop) = (lbs[i % 3].addr, stop.clone());
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for _ in 0..400 {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    statuses.push(stream(lb).await);
                }
                statuses
            })
        })
        .collect();
    let watch = {
        let stop = stop.clone();
        let up = &up;
        async move {
            let started = Instant::now();
            release_and_watch(up, Duration::from_millis(5), || {
                started.elapsed() > Duration::from_secs(4) && stop.load(Ordering::SeqCst)
            })
            .await
        }
    };
    let faults = async {
        tokio::time::sleep(Duration::from_millis(500)).await;
        redis.stop();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        redis.restart().await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
        stop.store(true, Ordering::SeqCst);
    };
    let (peak, ()) = tokio::join!(watch, faults);
    let mut served = 0;
    for c in clients {
        for s in c.await.unwrap() {
            assert_eq!(s, StatusCode::OK, "no request fails because of the store");
            served += 1;
        }
    }
    assert!(served > 30, "{served} requests served");
    assert!(peak <= 3, "the replica held {peak} streams at once");
    for lb in &lbs {
        let text = metrics_text(lb.admin_addr).await;
        assert!(
            metric_value(&text, "llmlb_fleet_fallbacks_total", &[]) >= 1.0,
            "{text}"
        );
        assert_eq!(
            metric_value(&text, "llmlb_fleet_store_up", &[]),
            1.0,
            "back"
        );
    }
    for lb in lbs {
        lb.shutdown().await;
    }
}

/// One streaming chat of `tier` through `lb`, read to its end: its status.
async fn stream_of(lb: std::net::SocketAddr, tier: &str) -> StatusCode {
    let mut conn = Conn::open(lb).await;
    let resp = conn.send(tier_chat(CHAT_STREAM, tier)).await;
    let status = resp.status();
    let _ = resp.into_body().collect().await;
    status
}

/// Paid requests on one instance and free ones on all three: the
/// instances whose free waiters wait for the paid ones give their slots
/// back before their refreshes (`llmlb_fleet_slot_releases_total`), and
/// the replica never runs more than its limit.
#[tokio::test]
async fn slots_given_back_for_another_instances_waiters_keep_the_limit() {
    let Some(redis) = RedisServer::start("fleet").await else {
        return;
    };
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let cfg = paid_free(&config(&redis.url(), &up.url(), 3));
    let lbs = [
        start_llmlb(&cfg).await,
        start_llmlb(&cfg).await,
        start_llmlb(&cfg).await,
    ];
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Two free clients per instance, one paid client on the first.
    let clients: Vec<_> = (0..7)
        .map(|i| {
            let (lb, stop) = (lbs[i % 3].addr, stop.clone());
            let tier = if i == 6 { "paid" } else { "free" };
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                for _ in 0..400 {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    statuses.push(stream_of(lb, tier).await);
                }
                statuses
            })
        })
        .collect();
    let started = Instant::now();
    let peak = release_and_watch(&up, Duration::from_millis(5), || {
        let done = started.elapsed() > Duration::from_secs(3);
        if done {
            stop.store(true, Ordering::SeqCst);
        }
        done && clients.iter().all(|c| c.is_finished())
    })
    .await;
    let mut served = 0;
    for c in clients {
        for s in c.await.unwrap() {
            assert_eq!(s, StatusCode::OK);
            served += 1;
        }
    }
    assert!(served > 30, "{served} requests served");
    assert!(peak <= 3, "the replica held {peak} streams at once");
    let mut released = 0.0;
    for lb in &lbs[1..] {
        let text = metrics_text(lb.admin_addr).await;
        released += metric_value(&text, "llmlb_fleet_slot_releases_total", &[]);
    }
    assert!(released >= 1.0, "slots were given back ({released})");
    for lb in lbs {
        lb.shutdown().await;
    }
}

#[tokio::test]
async fn a_killed_instance_gives_its_slots_back_within_its_ttl() {
    let Some(redis) = RedisServer::start("fleet").await else {
        return;
    };
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let cfg = TempFile::config(
        "fleet-kill",
        &serve_config("", &config(&redis.url(), &up.url(), 2)),
    );
    let mut doomed = ServeProcess::start(&cfg.path, &[]);
    let other = ServeProcess::start(&cfg.path, &[]);
    // The doomed instance takes both slots (the other wants none yet).
    let (_c1, _b1) = held_stream(doomed.addr).await;
    let (_c2, _b2) = held_stream(doomed.addr).await;
    assert_eq!(up.open_streams.load(Ordering::SeqCst), 2);
    // The other's request waits: the limit holds across processes.
    let waiting = tokio::spawn(stream(other.addr));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(up.requests(), 2, "no third request reached the replica");
    doomed.child.0.kill().unwrap();
    let killed = Instant::now();
    doomed.child.0.wait().unwrap();
    // Its streams die with it; its lease lapses with its registration.
    until("the waiting request to reach the replica", || {
        up.requests() == 3
    })
    .await;
    let took = killed.elapsed();
    assert!(
        took < Duration::from_millis(500 + 500),
        "slots back in {took:?}"
    );
    up.release_one();
    assert_eq!(waiting.await.unwrap(), StatusCode::OK);
    drop(other);
}

async fn replica_for(addr: std::net::SocketAddr, body: &str) -> String {
    let (status, _, bytes) = call(addr, chat_request("/v1/chat/completions", body)).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    v["replica"].as_str().unwrap().to_string()
}

fn decisions(text: &str, branch: &str) -> f64 {
    metric_value(text, "llmlb_routing_decisions_total", &[("branch", branch)])
}

#[tokio::test]
async fn cache_mode_instances_share_one_prefix_view() {
    let Some(redis) = RedisServer::start("fleet").await else {
        return;
    };
    let ups = [
        Upstream::start("r0", Mode::Json).await,
        Upstream::start("r1", Mode::Json).await,
        Upstream::start("r2", Mode::Json).await,
    ];
    let mut pool = String::from(
        "[[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\nbalancer = \"round_robin\"\n\
         [pools.prefix]\nmode = \"cache\"\n",
    );
    for u in &ups {
        pool.push_str(&format!("[[pools.replicas]]\nurl = \"{}\"\n", u.url()));
    }
    let cfg = format!(
        "[fleet]\nstore = \"{}\"\nrefresh = \"40ms\"\ntimeout = \"40ms\"\ninstance_ttl = \"600ms\"\n{pool}",
        redis.url()
    );
    let (a, b) = (start_llmlb(&cfg).await, start_llmlb(&cfg).await);
    let mut first = Vec::new();
    for p in 0..8 {
        first.push(replica_for(a.addr, &support_chat(p, "Where is my parcel?")).await);
    }
    until_async(
        "the second instance to fold the first's records",
        Duration::from_secs(5),
        async || {
            let text = metrics_text(b.admin_addr).await;
            metric_value(&text, "llmlb_fleet_prefix_records_total", &[]) >= 8.0
        },
    )
    .await;
    // What the first instance sent is a prefix hit on the second: it sends
    // each prompt where the first did, though it never saw them itself.
    for (p, there) in first.iter().enumerate() {
        assert_eq!(
            &replica_for(b.addr, &support_chat(p, "And the invoice?")).await,
            there
        );
    }
    let text = metrics_text(b.admin_addr).await;
    assert_eq!(
        (
            decisions(&text, "prefix_hit"),
            decisions(&text, "prefix_miss")
        ),
        (8.0, 0.0)
    );
    a.shutdown().await;
    b.shutdown().await;
}

/// A slot freed on one instance while a paid request waits on another:
/// the instance whose free waiter is held back gives the slot back (and
/// wakes the other through the store's `wake` channel), and the paid
/// request takes it, not the free one waiting where it freed.
#[tokio::test]
async fn a_slot_given_back_goes_to_the_waiter_that_goes_first() {
    let Some(redis) = RedisServer::start("fleet").await else {
        return;
    };
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let fleet = format!(
        "[fleet]\nstore = \"{}\"\nrefresh = \"1s\"\ntimeout = \"200ms\"\ninstance_ttl = \"10s\"\n",
        redis.url()
    );
    let pool = one_pool("least_connections", &[(&up.url(), 1)], "max_inflight = 1");
    let cfg = paid_free(&format!("{fleet}{pool}"));
    let (a, b) = (start_llmlb(&cfg).await, start_llmlb(&cfg).await);
    // B runs a free stream in the replica's one slot; a free request waits
    // on B, then a paid one on A.
    let (_conn, _body) = held_stream(b.addr).await;
    let free = tokio::spawn(stream_of(b.addr, "free"));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let paid = tokio::spawn(stream_of(a.addr, "paid"));
    // B reads A's queue report at its next refreshes.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(up.requests(), 1, "the limit holds across instances");
    let released = Instant::now();
    up.release_one();
    while up.requests() < 2 {
        assert!(
            released.elapsed() < Duration::from_secs(20),
            "the slot moves"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    // The paid request took it: B's free request still waits.
    let text = metrics_text(b.admin_addr).await;
    assert_eq!(
        metric_value(&text, "llmlb_queue_depth", &[("level", "low")]),
        1.0,
        "{text}"
    );
    up.release_one();
    assert_eq!(paid.await.unwrap(), StatusCode::OK);
    while up.requests() < 3 {
        assert!(
            released.elapsed() < Duration::from_secs(30),
            "the free request runs"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    up.release_one();
    assert_eq!(free.await.unwrap(), StatusCode::OK);
    for lb in [a, b] {
        lb.shutdown().await;
    }
}

/// Until `lb`'s status shows the store answering and `n` instances, within
/// `within`.
async fn store_up_with(lb: std::net::SocketAddr, n: usize, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let (_, body) = admin_get(lb, "/admin/status").await;
        let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
        let listed = doc["fleet"]["instances"].as_array().map_or(0, |a| a.len());
        if doc["fleet"]["store_up"] == true && listed == n {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// Twelve streams through `lbs` in turn, the replica releasing one every
/// 15 ms: the most it held at once (each stream must succeed).
async fn limited_run(lbs: &[&llmlb::daemon::Running], up: &Upstream) -> usize {
    let tasks: Vec<_> = (0..12)
        .map(|i| tokio::spawn(stream(lbs[i % lbs.len()].addr)))
        .collect();
    let peak = release_and_watch(up, Duration::from_millis(15), || {
        tasks.iter().all(|t| t.is_finished())
    })
    .await;
    for t in tasks {
        assert_eq!(t.await.unwrap(), StatusCode::OK);
    }
    peak
}

#[tokio::test]
async fn instances_reach_the_store_through_a_sentinel_and_follow_its_failover() {
    let test = "fleet through a sentinel";
    let Some(mut master) = RedisServer::start(test).await else {
        return;
    };
    let Some(replica) = RedisServer::start_replica(test, master.port).await else {
        return;
    };
    let Some(sentinel) = Sentinel::start(test, master.port, 300).await else {
        return;
    };
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let cfg = config(&sentinel.url(), &up.url(), 2);
    let (a, b) = (start_llmlb(&cfg).await, start_llmlb(&cfg).await);
    assert!(store_up_with(a.admin_addr, 2, Duration::from_secs(10)).await);
    let peak = limited_run(&[&a, &b], &up).await;
    assert!(
        (1..=2).contains(&peak),
        "the replica held {peak} streams at once"
    );

    // The master goes; the Sentinel promotes its replica and both
    // instances find it there.
    master.stop();
    let promoted = async {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", sentinel.port)).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        loop {
            let addr: Vec<String> = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg("main")
                .query_async(&mut conn)
                .await
                .unwrap();
            if addr.get(1) == Some(&replica.port.to_string()) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), promoted)
        .await
        .expect("the sentinel promotes the replica");
    for lb in [&a, &b] {
        assert!(
            store_up_with(lb.admin_addr, 2, Duration::from_secs(20)).await,
            "an instance reconnects to the promoted master"
        );
    }
    let peak = limited_run(&[&a, &b], &up).await;
    assert!(
        peak <= 2,
        "after the failover the replica held {peak} streams at once"
    );
    // Both noticed the old master go, and answer from the new one.
    for lb in [&a, &b] {
        let text = metrics_text(lb.admin_addr).await;
        assert_eq!(metric_value(&text, "llmlb_fleet_store_up", &[]), 1.0);
        assert!(metric_value(&text, "llmlb_fleet_store_errors_total", &[]) >= 1.0);
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn three_instances_keep_the_limit_on_a_redis_cluster() {
    let Some(cluster) = RedisCluster::start("fleet on a cluster").await else {
        return;
    };
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let cfg = config(&cluster.url(), &up.url(), 2);
    let (a, b, c) = (
        start_llmlb(&cfg).await,
        start_llmlb(&cfg).await,
        start_llmlb(&cfg).await,
    );
    assert!(store_up_with(a.admin_addr, 3, Duration::from_secs(10)).await);
    let peak = limited_run(&[&a, &b, &c], &up).await;
    assert!(
        (1..=2).contains(&peak),
        "the replica held {peak} streams at once"
    );
    // The fleet's keys sit under the prefix's hash tag (one slot).
    let mut conn = cluster.connect().await;
    let live: i64 = redis::cmd("ZCARD")
        .arg("{llmlb:fleet:}instances")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(live, 3);
    for lb in [a, b, c] {
        lb.shutdown().await;
    }
}

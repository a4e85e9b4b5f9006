//! Replica health through a real llmlb: outlier ejection on 500s and
//! readmission after recovery, 503 taken as "full" not "dead", and the active
//! check taking a hanging replica out and back in.

use crate::signals_fake;

use std::time::Duration;

use std::sync::Arc;

use signals_fake::{Fake, Mode, Proxy, metric_value};

/// Two replicas `a` and `b` behind round-robin with no retries, so every
/// answer a replica gives reaches the client; `tables` configures health.
async fn pair(tables: &str) -> (Arc<Fake>, Arc<Fake>, Proxy) {
    let a = Fake::start().await;
    let b = Fake::start().await;
    let proxy = Proxy::start(&[&a, &b], "balancer = \"round_robin\"\nretries = 0", tables).await;
    (a, b, proxy)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_replica_is_ejected_then_readmitted() {
    let (a, _b, proxy) = pair("[pools.outlier]\nconsecutive_failures = 3\ncooldown = \"300ms\"\nmax_ejection_time = \"2s\"").await;
    a.set_mode(Mode::Fail500);

    let mut statuses = Vec::new();
    for _ in 0..12 {
        statuses.push(proxy.chat(false, 8).await.0);
    }
    // Round-robin alternates; a's third 500 ejects it, the rest go to b.
    assert_eq!(a.chats(), 3, "statuses {statuses:?}");
    assert_eq!(statuses.iter().filter(|s| **s == 500).count(), 3);
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 9);
    let r = proxy.replica(&a).await;
    assert_eq!(r["health"]["ejected"], true, "{r}");
    assert_eq!(r["eligible"], false);
    assert_eq!(r["health"]["ejections"], 1);
    let m = proxy.metrics().await;
    assert_eq!(
        metric_value(&m, "llmlb_outlier_ejections_total{pool=\"p\""),
        1.0,
        "{m}"
    );
    let down = format!("llmlb_replica_down{{pool=\"p\",replica=\"{}\"}}", a.addr);
    assert_eq!(metric_value(&m, &down), 1.0, "{m}");

    // The replica recovers; once its ejection time is over it gets work again.
    a.set_mode(Mode::Ok);
    proxy
        .wait_for(&a, Duration::from_secs(3), "readmission", |r| {
            r["eligible"] == true
        })
        .await;
    let before = a.chats();
    for _ in 0..10 {
        assert_eq!(proxy.chat(false, 8).await.0, 200);
    }
    let served = a.chats() - before;
    assert!(
        (4..=6).contains(&served),
        "a served {served} of 10 after recovery"
    );
    assert_eq!(proxy.replica(&a).await["health"]["consecutive_failures"], 0);
    // The supervisor's next tick clears the gauge.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while metric_value(&proxy.metrics().await, &down) != 0.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "llmlb_replica_down stayed 1"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn still_failing_after_readmission_is_ejected_for_longer() {
    let (a, _b, proxy) = pair("[pools.outlier]\nconsecutive_failures = 2\ncooldown = \"200ms\"\nmax_ejection_time = \"5s\"").await;
    a.set_mode(Mode::Fail500);
    for _ in 0..6 {
        proxy.chat(false, 8).await;
    }
    assert_eq!(proxy.replica(&a).await["health"]["ejections"], 1);
    proxy
        .wait_for(&a, Duration::from_secs(3), "readmission", |r| {
            r["eligible"] == true
        })
        .await;
    for _ in 0..6 {
        proxy.chat(false, 8).await;
    }
    let r = proxy.replica(&a).await;
    assert_eq!(r["health"]["ejections"], 2, "{r}");
    // Second ejection: 2 × 200 ms, so more than one base time is left.
    assert!(
        r["health"]["ejection_remaining_ms"].as_u64().unwrap() > 200,
        "{r}"
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_replica_answering_503_is_not_ejected() {
    let (a, _b, proxy) = pair("[pools.outlier]\nconsecutive_failures = 2").await;
    a.set_mode(Mode::Full503);
    let mut full = 0;
    for _ in 0..10 {
        if proxy.chat(false, 8).await.0 == 503 {
            full += 1;
        }
    }
    assert_eq!(full, 5);
    assert_eq!(a.chats(), 5);
    let r = proxy.replica(&a).await;
    assert_eq!(r["health"]["ejected"], false, "{r}");
    assert_eq!(r["eligible"], true);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hanging_replica_is_taken_out_by_active_checks() {
    let (a, _b, proxy) = pair("[pools.health]\nenabled = true\ninterval = \"100ms\"\ntimeout = \"80ms\"\nfall = 2\nrise = 2").await;
    proxy
        .wait_for(&a, Duration::from_secs(3), "first check", |r| {
            r["health"]["active"] == "up"
        })
        .await;

    // The replica hangs: health checks time out, chats would hang too.
    a.set_health_hangs(true);
    a.set_mode(Mode::Hang);
    proxy
        .wait_for(&a, Duration::from_secs(3), "active check down", |r| {
            r["health"]["active"] == "down"
        })
        .await;
    assert_eq!(proxy.replica(&a).await["eligible"], false);
    let before = a.chats();
    for _ in 0..6 {
        assert_eq!(proxy.chat(false, 8).await.0, 200);
    }
    assert_eq!(
        a.chats(),
        before,
        "no request may reach the hanging replica"
    );
    let m = proxy.metrics().await;
    let up_series = format!(
        "llmlb_replica_health_up{{pool=\"p\",replica=\"{}\"}}",
        a.addr
    );
    assert!(m.contains(&format!("{up_series} 0")), "{m}");
    assert!(
        metric_value(&m, "llmlb_health_check_failures_total{kind=\"timeout\"") >= 2.0,
        "{m}"
    );

    // It recovers: `rise` good checks bring it back.
    a.set_health_hangs(false);
    a.set_mode(Mode::Ok);
    proxy
        .wait_for(&a, Duration::from_secs(3), "active check up", |r| {
            r["health"]["active"] == "up" && r["eligible"] == true
        })
        .await;
    for _ in 0..6 {
        assert_eq!(proxy.chat(false, 8).await.0, 200);
    }
    assert!(a.chats() > before);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ejection_share_keeps_part_of_the_pool_when_all_answer_500() {
    let (a, b, proxy) = pair(
        "[pools.outlier]\nconsecutive_failures = 2\ncooldown = \"60s\"\nmax_ejection_percent = 50",
    )
    .await;
    a.set_mode(Mode::Fail500);
    b.set_mode(Mode::Fail500);
    for _ in 0..10 {
        assert_eq!(proxy.chat(false, 8).await.0, 500);
    }
    let ejected = [proxy.replica(&a).await, proxy.replica(&b).await]
        .iter()
        .filter(|r| r["health"]["ejected"] == true)
        .count();
    assert_eq!(
        ejected, 1,
        "half of a two-replica pool may be ejected, not all"
    );
    proxy.stop().await;
}

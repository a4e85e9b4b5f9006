//! The KV-event subscribers' metrics through a real llmlb in front of
//! simulated replicas that published before llmlb started: the replica
//! with a replay endpoint is caught up by a complete replay; the one
//! without shows a sequence gap and stays unknown, which the gauge counts.

use crate::common;
use crate::kv_support;

use std::net::SocketAddr;
use std::time::Duration;

use common::{metric_value, metrics_text, start_llmlb};
use kv_support::{chat, sim_with_events, system};

/// Polls the admin metrics until `cond` holds (5 s at most); returns them.
async fn metrics_until(admin: SocketAddr, what: &str, cond: impl Fn(&str) -> bool) -> String {
    for _ in 0..250 {
        let m = metrics_text(admin).await;
        if cond(&m) {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for {what}");
}

#[tokio::test]
async fn gaps_replays_and_unknown_records_are_counted() {
    let without_replay = sim_with_events(false, 400, None).await;
    let with_replay = sim_with_events(true, 400, None).await;
    let model = without_replay.config().model.clone();
    // Both publish before llmlb subscribes.
    for s in [&without_replay, &with_replay] {
        chat(s.addr, &model, &system(1), "before llmlb").await;
    }
    let mut text = format!(
        "[[pools]]\nname = \"sim\"\nmodels = [{model:?}]\n[pools.prefix]\nmode = \"exact\"\n\
         [[pools.replicas]]\nurl = \"http://{}\"\nname = \"r0\"\nkv_events = \"tcp://{}\"\n",
        without_replay.addr,
        without_replay.kv_events.unwrap(),
    );
    text.push_str(&format!(
        "[[pools.replicas]]\nurl = \"http://{}\"\nname = \"r1\"\nkv_events = \"tcp://{}\"\nkv_events_replay = \"tcp://{}\"\n",
        with_replay.addr,
        with_replay.kv_events.unwrap(),
        with_replay.kv_replay.unwrap()
    ));
    let lb = start_llmlb(&text).await;
    let replays = |m: &str, outcome| {
        metric_value(
            m,
            "llmlb_kv_events_replays_total",
            &[("replica", "r1"), ("outcome", outcome)],
        )
    };
    metrics_until(lb.admin_addr, "r1's replay", |m| {
        replays(m, "complete") >= 1.0
    })
    .await;
    // r0 missed its first events: the next one it publishes is a gap.
    chat(without_replay.addr, &model, &system(2), "after llmlb").await;
    let m = metrics_until(lb.admin_addr, "r0's gap", |m| {
        metric_value(m, "llmlb_kv_events_gaps_total", &[("replica", "r0")]) >= 1.0
    })
    .await;
    assert!(metric_value(&m, "llmlb_kv_events_missed_total", &[("replica", "r0")]) >= 1.0);
    assert_eq!(
        metric_value(&m, "llmlb_kv_events_gaps_total", &[("replica", "r1")]),
        0.0
    );
    let m = metrics_until(lb.admin_addr, "one unknown replica", |m| {
        metric_value(m, "llmlb_kv_events_unknown_replicas", &[("pool", "sim")]) == 1.0
    })
    .await;
    assert_eq!(replays(&m, "failed") + replays(&m, "timeout"), 0.0);
    let topo = lb.state.topology();
    let pool = &topo.pools()[0];
    let known: Vec<bool> = pool
        .replicas
        .iter()
        .map(|r| pool.router.held(r.id).unwrap().known())
        .collect();
    assert_eq!(known, vec![false, true]);
    lb.shutdown().await;
    without_replay.shutdown().await;
    with_replay.shutdown().await;
}

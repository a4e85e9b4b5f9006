//! The closed loop of prefix routing through a real llmlb in front of
//! simulated replicas: the cached prompt tokens llmlb predicted for the
//! replica it chose against the `cached_tokens` the replica reported, in
//! `exact`, `cache` and `hash` modes, for JSON answers and for streams that
//! ask for `include_usage` (streams that do not are not counted).

use crate::common;
use crate::kv_support;

use std::net::SocketAddr;
use std::time::Duration;

use llmlb::replica_sim::SimHandle;

use common::{call, chat_request, metric_value, metrics_text, start_llmlb};
use kv_support::{chat, sim_with_events, system};

const PREDICTED: &str = "llmlb_prefix_cached_tokens_predicted_total";
const REPORTED: &str = "llmlb_prefix_cached_tokens_reported_total";
const ERRORS: &str = "llmlb_prefix_cached_tokens_error_ratio_count";

fn config(sims: &[SimHandle], mode: &str, events: bool) -> String {
    let mut s = format!(
        "[[pools]]\nname = \"sim\"\nmodels = [{:?}]\n\
         [pools.prefix]\nmode = \"{mode}\"\n\
         [pools.scrape]\ninterval = \"50ms\"\ntimeout = \"50ms\"\nstaleness = \"1s\"\n",
        sims[0].config().model
    );
    for (i, r) in sims.iter().enumerate() {
        s.push_str(&format!(
            "[[pools.replicas]]\nurl = \"http://{}\"\nname = \"r{i}\"\n",
            r.addr
        ));
        if events {
            s.push_str(&format!(
                "kv_events = \"tcp://{}\"\nkv_events_replay = \"tcp://{}\"\n",
                r.kv_events.unwrap(),
                r.kv_replay.unwrap()
            ));
        }
    }
    s
}

async fn fleet(n: usize, events: bool) -> Vec<SimHandle> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(sim_with_events(events, 400, None).await);
    }
    out
}

/// (predicted, reported, answers counted), once `answers` were counted.
async fn loop_totals(admin: SocketAddr, answers: f64) -> (f64, f64, f64) {
    for _ in 0..250 {
        let m = metrics_text(admin).await;
        let counted = metric_value(&m, ERRORS, &[("pool", "sim")]);
        if counted >= answers {
            return (
                metric_value(&m, PREDICTED, &[("pool", "sim")]),
                metric_value(&m, REPORTED, &[("pool", "sim")]),
                counted,
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("fewer than {answers} answers counted");
}

/// The shared-prefix workload: `systems` system prompts, `users` questions
/// each, interleaved, one request at a time.
async fn workload(addr: SocketAddr, model: &str, systems: usize, users: usize) -> usize {
    let mut n = 0;
    for u in 0..users {
        for k in 0..systems {
            chat(addr, model, &system(k), &format!("question {u} about {k}")).await;
            n += 1;
        }
    }
    n
}

#[tokio::test]
async fn exact_mode_predicts_what_the_replicas_report() {
    let sims = fleet(3, true).await;
    let lb = start_llmlb(&config(&sims, "exact", true)).await;
    let model = sims[0].config().model.clone();
    // Let every subscriber connect (and replay the empty history) first.
    let topo = lb.state.topology();
    let pool = &topo.pools()[0];
    common::until("the replicas' records are known", || {
        pool.replicas
            .iter()
            .all(|r| pool.router.held(r.id).unwrap().known())
    })
    .await;
    let n = workload(lb.addr, &model, 5, 6).await;
    let (predicted, reported, counted) = loop_totals(lb.admin_addr, n as f64).await;
    assert_eq!(counted, n as f64);
    assert!(reported > 0.0, "the workload shares prefixes");
    let gap = (predicted - reported).abs() / reported;
    eprintln!("exact mode: {n} requests, predicted {predicted}, reported {reported}");
    assert!(
        gap <= 0.05,
        "predicted {predicted}, reported {reported}: {:.1} % apart",
        gap * 100.0
    );
    // Per replica too, the counters are there and add up.
    let m = metrics_text(lb.admin_addr).await;
    let per_replica: f64 = (0..3)
        .map(|i| metric_value(&m, REPORTED, &[("replica", &format!("r{i}"))]))
        .sum();
    assert_eq!(per_replica, reported);
    lb.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}

async fn stream(addr: SocketAddr, model: &str, usage: bool) {
    let mut body = serde_json::json!({
        "model": model,
        "max_tokens": 2,
        "stream": true,
        "messages": [{"role": "system", "content": system(1)}, {"role": "user", "content": "hi"}],
    });
    if usage {
        body["stream_options"] = serde_json::json!({"include_usage": true});
    }
    let (status, _, bytes) = call(
        addr,
        chat_request("/v1/chat/completions", &body.to_string()),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(String::from_utf8_lossy(&bytes).contains("\"usage\""), usage);
}

#[tokio::test]
async fn cache_mode_counts_streams_that_carry_usage() {
    let sims = fleet(2, false).await;
    let lb = start_llmlb(&config(&sims, "cache", false)).await;
    let model = sims[0].config().model.clone();
    stream(lb.addr, &model, true).await;
    stream(lb.addr, &model, true).await;
    let (predicted, reported, _) = loop_totals(lb.admin_addr, 2.0).await;
    assert!(reported > 0.0);
    assert_eq!(predicted, reported, "the second send is predicted exactly");
    // A stream whose client did not ask for usage is asked for it by llmlb
    // (`stream_usage`, on by default): counted, though its client sees none.
    stream(lb.addr, &model, false).await;
    chat(lb.addr, &model, &system(2), "json answers are counted").await;
    let (_, _, counted) = loop_totals(lb.admin_addr, 4.0).await;
    assert_eq!(counted, 4.0);
    lb.shutdown().await;
    // With `stream_usage = false` such a stream reports nothing: not counted.
    let text = config(&sims, "cache", false)
        .replace("[pools.prefix]", "stream_usage = false\n[pools.prefix]");
    let lb = start_llmlb(&text).await;
    stream(lb.addr, &model, false).await;
    chat(lb.addr, &model, &system(3), "json answers are counted").await;
    let (_, _, counted) = loop_totals(lb.admin_addr, 1.0).await;
    assert_eq!(counted, 1.0);
    lb.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}

#[tokio::test]
async fn hash_mode_predicts_from_what_it_sent() {
    let sims = fleet(2, false).await;
    let lb = start_llmlb(&config(&sims, "hash", false)).await;
    let model = sims[0].config().model.clone();
    let n = workload(lb.addr, &model, 2, 3).await;
    let (predicted, reported, counted) = loop_totals(lb.admin_addr, n as f64).await;
    assert_eq!(counted, n as f64);
    assert!(reported > 0.0);
    assert_eq!(predicted, reported);
    lb.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}

const TTFT_RATIO: &str = "llmlb_prefix_ttft_observed_over_predicted_count";

/// A stream's time to first token from its dispatch, against what the
/// cost model expected when it picked the replica: streams only (a JSON
/// answer's first byte is its last), in the modes that score (`cache`,
/// `exact`), not `hash`.
#[tokio::test]
async fn cache_mode_sets_each_streams_ttft_beside_its_prediction() {
    let sims = fleet(2, false).await;
    let lb = start_llmlb(&config(&sims, "cache", false)).await;
    let model = sims[0].config().model.clone();
    for _ in 0..3 {
        stream(lb.addr, &model, true).await;
    }
    chat(lb.addr, &model, &system(2), "a json answer is not counted").await;
    loop_totals(lb.admin_addr, 4.0).await;
    let mut m = metrics_text(lb.admin_addr).await;
    for _ in 0..50 {
        if metric_value(&m, TTFT_RATIO, &[("pool", "sim")]) >= 3.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        m = metrics_text(lb.admin_addr).await;
    }
    assert_eq!(metric_value(&m, TTFT_RATIO, &[("pool", "sim")]), 3.0, "{m}");
    let seconds = |name: &str| metric_value(&m, name, &[("pool", "sim")]);
    assert!(
        seconds("llmlb_prefix_ttft_predicted_seconds_total") > 0.0,
        "{m}"
    );
    assert!(
        seconds("llmlb_prefix_ttft_observed_seconds_total") > 0.0,
        "{m}"
    );
    lb.shutdown().await;
    let lb = start_llmlb(&config(&sims, "hash", false)).await;
    stream(lb.addr, &model, true).await;
    loop_totals(lb.admin_addr, 1.0).await;
    let m = metrics_text(lb.admin_addr).await;
    assert_eq!(metric_value(&m, TTFT_RATIO, &[("pool", "sim")]), 0.0, "{m}");
    lb.shutdown().await;
    for s in sims {
        s.shutdown().await;
    }
}

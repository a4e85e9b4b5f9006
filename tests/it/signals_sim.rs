//! Load signals and health against `llmlb replica-sim` replicas, with faults injected
//! through the simulator's own `/sim/fault` endpoint.

use crate::common;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::Full;
use llmlb::bench::workload::{LenRange, RandomOptions};
use llmlb::bench::{self, Arrivals, BenchSpec, Limits, WorkloadSpec};
use llmlb::replica_sim::{SimConfig, SimHandle};
use tokio::net::TcpListener;

async fn fleet(n: usize, max_num_seqs: usize) -> Vec<SimHandle> {
    let mut out = Vec::new();
    for i in 0..n {
        let mut config = SimConfig::profile("fast").unwrap();
        config.engine.max_num_seqs = max_num_seqs;
        config.seed = i as u64;
        out.push(llmlb::replica_sim::spawn(
            TcpListener::bind("127.0.0.1:0").await.unwrap(),
            config,
        ));
    }
    out
}

fn pool(balancer: &str, replicas: &[SimHandle], extra: &str) -> String {
    let mut s = format!(
        "[server]\nreplica_header = true\n[[pools]]\nname = \"sim\"\nmodels = [\"llmlb-sim\"]\nbalancer = \"{balancer}\"\n{extra}\n"
    );
    for r in replicas {
        s.push_str(&format!(
            "[[pools.replicas]]\nurl = \"http://{}\"\n",
            r.addr
        ));
    }
    s
}

async fn fault(replica: SocketAddr, json: &str) {
    let req = Request::post("/sim/fault")
        .header("host", replica.to_string())
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(json.to_string())))
        .unwrap();
    let (status, _, body) = call(replica, req).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
}

/// Requests each replica served out of a closed-loop run of `n` requests.
async fn spread(
    lb: SocketAddr,
    n: u64,
    concurrency: usize,
) -> std::collections::BTreeMap<String, u64> {
    let mut spec = BenchSpec::new(
        format!("http://{lb}"),
        "llmlb-sim",
        WorkloadSpec::Random(RandomOptions {
            input_len: LenRange::fixed(64),
            output_len: LenRange::fixed(16),
        }),
    );
    spec.arrivals = Arrivals::Closed { concurrency };
    spec.limits = Limits {
        num_requests: Some(n),
        duration: Some(Duration::from_secs(60)),
        ..Limits::default()
    };
    let report = bench::run(&spec).await.unwrap();
    assert_eq!(report.figures.completed, n, "{:?}", report.figures.errors);
    report.figures.replicas
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowed_replica_gets_less_work_under_load_aware_balancers() {
    let n = 90;
    let mut share = Vec::new();
    for balancer in ["round_robin", "jsq", "least_tokens"] {
        let replicas = fleet(3, 2).await;
        let slow = replicas[2].addr;
        fault(slow, r#"{"slowdown": 10.0}"#).await;
        let extra = "[pools.scrape]\ninterval = \"50ms\"\ntimeout = \"50ms\"\nstaleness = \"1s\"";
        let lb = start_llmlb(&pool(balancer, &replicas, extra)).await;
        let counts = spread(lb.addr, n, 6).await;
        let slow_count = counts.get(&slow.to_string()).copied().unwrap_or(0);
        share.push((balancer, slow_count));
        lb.shutdown().await;
        for r in replicas {
            r.shutdown().await;
        }
    }
    eprintln!("requests served by the slowed replica out of {n}: {share:?}");
    // Round-robin gives the slow replica its third regardless.
    assert_eq!(share[0].1, n / 3, "{share:?}");
    // The load-aware balancers give it clearly less: at most 60% of a fair share.
    for (balancer, count) in &share[1..] {
        assert!(*count <= n * 6 / 30, "{balancer}: {share:?}");
    }
}

#[tokio::test]
async fn replica_answering_500s_is_ejected_then_readmitted() {
    let replicas = fleet(2, 32).await;
    let bad = replicas[1].addr;
    let lb = start_llmlb(&pool(
        "round_robin",
        &replicas,
        "[pools.outlier]\nconsecutive_failures = 3\ncooldown = \"300ms\"\nmax_ejection_percent = 50",
    ))
    .await;
    fault(bad, r#"{"error_rate": 1.0}"#).await;
    let body = r#"{"model":"llmlb-sim","prompt":"hello","max_tokens":2}"#;
    let replica = lb.state.topology().pools()[0].replicas[1].clone();
    let mut statuses = Vec::new();
    for _ in 0..12 {
        let (status, _, _) = call(lb.addr, chat_request("/v1/completions", body)).await;
        statuses.push(status.as_u16());
        if !replica.is_eligible() {
            break;
        }
    }
    assert!(
        !replica.is_eligible(),
        "ejected after repeated 500s: {statuses:?}"
    );
    assert_eq!(
        statuses.iter().filter(|s| **s == 500).count(),
        3,
        "{statuses:?}"
    );
    // While ejected, everything goes to the healthy replica.
    for _ in 0..4 {
        let (status, headers, _) = call(lb.addr, chat_request("/v1/completions", body)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers["x-llmlb-replica"], replicas[0].addr.to_string());
    }
    fault(bad, r#"{"reset": true}"#).await;
    until("readmission", || replica.is_eligible()).await;
    let mut served_by_bad = false;
    for _ in 0..6 {
        let (status, headers, _) = call(lb.addr, chat_request("/v1/completions", body)).await;
        assert_eq!(status, StatusCode::OK);
        served_by_bad |= headers["x-llmlb-replica"] == bad.to_string();
    }
    assert!(served_by_bad, "the recovered replica serves again");
    lb.shutdown().await;
    for r in replicas {
        r.shutdown().await;
    }
}

#[tokio::test]
async fn hanging_replica_is_ejected_by_the_active_check_and_comes_back() {
    let replicas = fleet(2, 32).await;
    let lb = start_llmlb(&pool(
        "round_robin",
        &replicas,
        "[pools.health]\nenabled = true\ninterval = \"100ms\"\ntimeout = \"100ms\"\nfall = 2\nrise = 1",
    ))
    .await;
    let replica = lb.state.topology().pools()[0].replicas[1].clone();
    until("first check passes", || replica.is_eligible()).await;
    fault(replicas[1].addr, r#"{"hang": true}"#).await;
    until("hung replica ejected", || !replica.is_eligible()).await;
    // Requests keep succeeding on the other replica meanwhile.
    let body = r#"{"model":"llmlb-sim","prompt":"hello","max_tokens":2}"#;
    for _ in 0..3 {
        let (status, headers, _) = call(lb.addr, chat_request("/v1/completions", body)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(headers["x-llmlb-replica"], replicas[0].addr.to_string());
    }
    fault(replicas[1].addr, r#"{"reset": true}"#).await;
    until("recovered replica readmitted", || replica.is_eligible()).await;
    lb.shutdown().await;
    for r in replicas {
        r.shutdown().await;
    }
}

/// A replica slowed 3× through `/sim/fault` is learned to prefill and
/// decode about 3× slower than its twin, from its own timing histograms, and
/// the learned rates are exported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn learned_rates_follow_a_replica_made_three_times_slower() {
    let replicas = fleet(2, 8).await;
    fault(replicas[1].addr, r#"{"slowdown": 3.0}"#).await;
    let extra = "[pools.scrape]\nenabled = true\ninterval = \"50ms\"\ntimeout = \"50ms\"\nstaleness = \"1s\"";
    let lb = start_llmlb(&pool("round_robin", &replicas, extra)).await;
    let mut spec = BenchSpec::new(
        format!("http://{}", lb.addr),
        "llmlb-sim",
        WorkloadSpec::Random(RandomOptions {
            input_len: LenRange::fixed(512),
            output_len: LenRange::fixed(24),
        }),
    );
    spec.arrivals = Arrivals::Closed { concurrency: 2 };
    spec.limits = Limits {
        num_requests: Some(60),
        duration: Some(Duration::from_secs(60)),
        ..Limits::default()
    };
    let report = bench::run(&spec).await.unwrap();
    assert_eq!(report.figures.completed, 60, "{:?}", report.figures.errors);
    // One more scrape after the last request, so the tail is learned too.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let pool = lb.state.topology().pools()[0].clone();
    let (fast, slow) = (
        pool.replicas[0].learned.rates(),
        pool.replicas[1].learned.rates(),
    );
    let ratio = |f: Option<f64>, s: Option<f64>| f.unwrap() / s.unwrap();
    let prefill = ratio(
        fast.prefill_tokens_per_second,
        slow.prefill_tokens_per_second,
    );
    let step = ratio(slow.decode_step_seconds, fast.decode_step_seconds);
    eprintln!("fast {fast:?}\nslow {slow:?}\nprefill ratio {prefill:.2}, decode ratio {step:.2}");
    assert!(
        (2.0..=4.5).contains(&prefill),
        "prefill rate ratio {prefill}"
    );
    assert!((2.0..=4.5).contains(&step), "decode step ratio {step}");
    // Every answer was 24 tokens long, on both replicas.
    assert_eq!(fast.output_tokens, Some(24.0));
    assert_eq!(slow.output_tokens, Some(24.0));
    let text = metrics_text(lb.admin_addr).await;
    let labels = [("pool", "sim"), ("replica", &*replicas[1].addr.to_string())];
    let exported = metric_value(&text, "llmlb_replica_prefill_tokens_per_second", &labels);
    assert!(exported > 0.0, "learned rate exported");
    let answers = metric_value(&text, "llmlb_replica_output_tokens_per_request", &labels);
    assert_eq!(answers, 24.0, "learned answer length exported");
    lb.shutdown().await;
    for r in replicas {
        r.shutdown().await;
    }
}

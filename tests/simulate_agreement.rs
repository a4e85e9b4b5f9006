//! `llmlb simulate` against the real-time path on loopback: 4 `llmlb sim`
//! replicas behind `llmlb serve`, loaded by `llmlb bench` with the first
//! requests of the conversation trace (lengths and time scaled down so a
//! run takes a few seconds), then the same workload through `simulate` with
//! the same pool config and engine profile, for every policy.
//!
//! What is asserted is what the real path reproduces on a shared, loaded
//! machine: the same requests complete and fail, the fleet prefix-hit rate
//! agrees within 10 points and output throughput within 10 %. TTFT is
//! printed (`--nocapture`) and compared in docs/SIMULATOR.md, not asserted:
//! the real path's milliseconds carry the proxy's, the client's and the
//! host's own time, which the simulation leaves out.

use std::path::PathBuf;
use std::time::Duration;

use llmlb::bench::workload::{TraceOptions, WorkloadSpec};
use llmlb::bench::{Arrivals, BenchSpec, Limits};
use llmlb::demo::fleet::{Fleet, FleetSpec};
use llmlb::sim::SimConfig;
use llmlb::simulate::run::{RunSpec, run};
use llmlb::simulate::{Policy, SimWorkload};

const REQUESTS: usize = 80;
const LENGTH_SCALE: f64 = 0.05;
/// Trace time in simulated time: ten times the trace's rate.
const RATE_SCALE: f64 = 10.0;
/// The real replicas run at half speed (simulated seconds per wall second),
/// so the proxy's and the host's own milliseconds weigh half as much.
const SIM_TIME_SCALE: f64 = 0.5;
const POLICIES: [&str; 5] = ["round_robin", "least_connections", "jsq", "hash", "cache"];

fn trace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/conversation_trace.jsonl")
}

/// The pool keys of a policy, as `llmlb demo` writes them.
fn pool_keys(policy: &str) -> String {
    match policy {
        "hash" | "cache" => {
            format!("balancer = \"least_connections\"\n[pools.prefix]\nmode = {policy:?}\n")
        }
        b => format!("balancer = {b:?}\n"),
    }
}

/// The demo fleet's pool with placeholder addresses, for `simulate`.
fn sim_config(model: &str, policy: &str) -> llmlb::config::Config {
    let mut text = format!(
        "[[pools]]\nname = \"demo\"\nmodels = [{model:?}]\n{}\n\
         [pools.scrape]\ninterval = \"100ms\"\ntimeout = \"100ms\"\nstaleness = \"1s\"\n",
        pool_keys(policy)
    );
    for i in 0..4 {
        text.push_str(&format!(
            "[[pools.replicas]]\nurl = \"http://127.0.0.1:{}\"\n",
            20_000 + i
        ));
    }
    llmlb::config::parse(&text).unwrap()
}

struct Row {
    policy: &'static str,
    real_completed: u64,
    real_failed: u64,
    real_hit: f64,
    real_ttft: (f64, f64),
    real_tput: f64,
    sim_completed: u64,
    sim_failed: u64,
    sim_hit: f64,
    sim_ttft: (f64, f64),
    sim_tput: f64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulate_agrees_with_the_real_time_path() {
    let mut profile = SimConfig::profile("fast").unwrap();
    profile.time_scale = SIM_TIME_SCALE;
    let workload = SimWorkload::trace(&trace(), LENGTH_SCALE, RATE_SCALE, Some(REQUESTS)).unwrap();
    let mut rows = Vec::new();
    for policy in POLICIES {
        let spec = FleetSpec {
            sim: profile.clone(),
            replicas: 4,
            seed: 0,
            top: String::new(),
            pool: pool_keys(policy),
            kv_events: false,
        };
        let fleet = Fleet::start(&spec).await.unwrap();
        let mut bench = BenchSpec::new(
            format!("http://{}", fleet.proxy_addr()),
            fleet.model(),
            WorkloadSpec::Trace(TraceOptions {
                path: trace(),
                time_scale: 1.0 / (RATE_SCALE * SIM_TIME_SCALE),
                length_scale: LENGTH_SCALE,
                max_requests: Some(REQUESTS),
            }),
        );
        bench.arrivals = Arrivals::Timestamps;
        bench.limits = Limits {
            num_requests: Some(REQUESTS as u64),
            duration: Some(Duration::from_secs(60)),
            request_timeout: Duration::from_secs(30),
            ..Limits::default()
        };
        let report = llmlb::bench::run(&bench).await.unwrap();
        let cache = fleet.prefix_cache().await;
        let model = fleet.model().to_string();
        fleet.stop().await;

        let config = policy
            .parse::<Policy>()
            .unwrap()
            .apply(&sim_config(&model, policy));
        let sim = run(
            &RunSpec {
                workload: &workload,
                config: &config,
                model: &model,
                profile: &profile,
                faults: &[],
                goodput_ttft: 2.0,
                seed: 0,
            },
            policy,
        )
        .unwrap();
        let f = &report.figures;
        rows.push(Row {
            policy,
            real_completed: f.completed,
            real_failed: f.failed,
            real_hit: cache.hit_rate().unwrap_or(0.0),
            // Wall time on the replicas' scaled clock → simulated time.
            real_ttft: (
                f.ttft_ms.p50 * SIM_TIME_SCALE,
                f.ttft_ms.p99 * SIM_TIME_SCALE,
            ),
            real_tput: f.output_throughput / SIM_TIME_SCALE,
            sim_completed: sim.outcomes.completed,
            sim_failed: sim.outcomes.errors(),
            sim_hit: sim.prefix_hit_rate,
            sim_ttft: (sim.ttft_s.p50 * 1000.0, sim.ttft_s.p99 * 1000.0),
            sim_tput: sim.output_tokens_per_s,
        });
    }
    println!(
        "{:<18} {:>9} {:>9} {:>8} {:>8} {:>16} {:>16} {:>14}",
        "policy",
        "done r/s",
        "fail r/s",
        "hit % r",
        "hit % s",
        "TTFT p50 r/s ms",
        "TTFT p99 r/s ms",
        "tok/s r/s"
    );
    for r in &rows {
        println!(
            "{:<18} {:>4}/{:<4} {:>4}/{:<4} {:>8.1} {:>8.1} {:>7.1}/{:<8.1} {:>7.1}/{:<8.1} {:>6.0}/{:<7.0}",
            r.policy,
            r.real_completed,
            r.sim_completed,
            r.real_failed,
            r.sim_failed,
            r.real_hit * 100.0,
            r.sim_hit * 100.0,
            r.real_ttft.0,
            r.sim_ttft.0,
            r.real_ttft.1,
            r.sim_ttft.1,
            r.real_tput,
            r.sim_tput
        );
    }
    for r in &rows {
        assert_eq!(
            (r.real_completed, r.real_failed),
            (r.sim_completed, r.sim_failed),
            "{}: completed and failed requests",
            r.policy
        );
        assert!(
            (r.real_tput / r.sim_tput - 1.0).abs() <= 0.10,
            "{}: output tokens/s real {:.0} vs simulated {:.0}",
            r.policy,
            r.real_tput,
            r.sim_tput
        );
        assert!(
            (r.real_hit - r.sim_hit).abs() <= 0.10,
            "{}: prefix-hit rate real {:.3} vs simulated {:.3}",
            r.policy,
            r.real_hit,
            r.sim_hit
        );
    }
}

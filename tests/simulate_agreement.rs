//! `llmlb simulate` against the real-time path on loopback: 4 `llmlb sim`
//! replicas behind `llmlb serve`, loaded by `llmlb bench` with the first
//! requests of the conversation trace, then the same workload through
//! `simulate` with the same pool, engine profile and replica addresses, for
//! every policy.
//!
//! The workload is chosen so that engine time dominates what a client sees:
//! the `h100-8b` profile (prefill at 0.1 ms a token, 10 ms steps) with the
//! trace's arrivals twelve times faster, so requests queue and batch on the
//! engines and TTFT is hundreds of simulated milliseconds. The replicas run
//! at `SIM_TIME_SCALE` (simulated seconds per wall second); every real
//! figure is converted to simulated time with it, and the pool's scrape
//! interval and staleness (wall time in `serve`) are given to `simulate`
//! scaled the same way. What the real path adds per request (the client,
//! the proxy, the replica's HTTP front, loopback) is measured on an idle
//! fleet first (`probe_network_delay`) and given to `simulate` as its
//! `network_delay`: one figure for every policy, never fitted to one.
//!
//! Asserted for every policy: the same requests complete and fail, and the
//! fleet prefix-hit rate agrees within 10 %; TTFT and throughput as far as
//! [`bounds`] says. Every figure is printed (`--nocapture`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use llmlb::bench::workload::{LenRange, RandomOptions, TraceOptions, WorkloadSpec};
use llmlb::bench::{Arrivals, BenchSpec, Limits};
use llmlb::demo::fleet::{Fleet, FleetSpec, PrefixCache};
use llmlb::sim::SimConfig;
use llmlb::simulate::run::{RunSpec, run};
use llmlb::simulate::{Policy, RunResult, SimWorkload};

const PROFILE: &str = "h100-8b";
const REQUESTS: usize = 120;
/// Tokens per engine step (the profile has 8192): smaller steps, so that a
/// few milliseconds of arrival jitter cannot move a prompt into a step a
/// second later.
const BATCHED_TOKENS: usize = 1024;
const LENGTH_SCALE: f64 = 0.05;
/// Trace time in simulated time: twelve times the trace's rate.
const RATE_SCALE: f64 = 12.0;
/// Simulated seconds per wall second on the real replicas: slower than real
/// time, so that a millisecond of the host's own time weighs less.
const SIM_TIME_SCALE: f64 = 0.5;
/// The pool's scrape interval and staleness in `serve` (wall time).
const SCRAPE_MS: f64 = 100.0;
const STALENESS_MS: f64 = 1000.0;
const POLICIES: [&str; 5] = ["round_robin", "least_connections", "jsq", "hash", "cache"];
/// Requests of the idle probe, one at a time.
const PROBES: u64 = 8;

/// Relative bounds asserted per policy on TTFT p50 and output throughput,
/// from what held over repeated runs on a loaded 2-core machine
/// (docs/SIMULATOR.md has the table). `round_robin` sends every request to
/// the same replica on both paths, so only engine timing differs: its p50
/// stayed within 7 % here and landed 17 % above once on a loaded CI host,
/// so it is held to 25 %. Where routing
/// reads load (`least_connections`, `jsq`, `cache`) or a loaded replica's
/// queue (`hash`), a few milliseconds of the host's jitter change which
/// requests share a step or a replica, and one real run lands up to 42 %
/// from the simulation at p50. p99 (the second-worst of 120 requests) is
/// printed only: on the real path it carries the host's worst stalls.
fn bounds(policy: &str) -> (f64, f64) {
    match policy {
        "round_robin" => (0.25, 0.25),
        _ => (0.50, 0.25),
    }
}

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

/// The demo fleet's pool for `simulate`: the same replica addresses (never
/// contacted; `hash` ranks replicas by them) and the same scrape timing in
/// simulated time.
fn sim_config(model: &str, policy: &str, replicas: &[SocketAddr]) -> llmlb::config::Config {
    let ms = |wall: f64| (wall * SIM_TIME_SCALE).round() as u64;
    let mut text = format!(
        "[[pools]]\nname = \"demo\"\nmodels = [{model:?}]\n{}\n\
         [pools.scrape]\ninterval = \"{}ms\"\ntimeout = \"{}ms\"\nstaleness = \"{}ms\"\n",
        pool_keys(policy),
        ms(SCRAPE_MS),
        ms(SCRAPE_MS),
        ms(STALENESS_MS),
    );
    for addr in replicas {
        text.push_str(&format!("[[pools.replicas]]\nurl = \"http://{addr}\"\n"));
    }
    llmlb::config::parse(&text).unwrap()
}

fn profile() -> SimConfig {
    let mut p = SimConfig::profile(PROFILE).unwrap();
    p.time_scale = SIM_TIME_SCALE;
    p.engine.max_num_batched_tokens = BATCHED_TOKENS;
    p
}

/// What one real run gives back.
struct Real {
    figures: llmlb::bench::stats::Figures,
    cache: PrefixCache,
    replicas: Vec<SocketAddr>,
    model: String,
}

/// Starts a 4-replica fleet under `policy`, runs `bench` against it, stops it.
async fn run_real(policy: &str, workload: WorkloadSpec, arrivals: Arrivals, requests: u64) -> Real {
    let spec = FleetSpec {
        sim: profile(),
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
        workload,
    );
    bench.arrivals = arrivals;
    bench.limits = Limits {
        num_requests: Some(requests),
        duration: Some(Duration::from_secs(60)),
        request_timeout: Duration::from_secs(30),
        ..Limits::default()
    };
    let report = llmlb::bench::run(&bench).await.unwrap();
    let real = Real {
        figures: report.figures,
        cache: fleet.prefix_cache().await,
        replicas: fleet.replica_addrs(),
        model: fleet.model().to_string(),
    };
    fleet.stop().await;
    real
}

fn simulate(workload: &SimWorkload, real: &Real, policy: &str, network_delay: f64) -> RunResult {
    let config =
        policy
            .parse::<Policy>()
            .unwrap()
            .apply(&sim_config(&real.model, policy, &real.replicas));
    run(
        &RunSpec {
            workload,
            config: &config,
            model: &real.model,
            profile: &profile(),
            faults: &[],
            goodput_ttft: 2.0,
            seed: 0,
            network_delay,
            tiers: None,
        },
        policy,
    )
    .unwrap()
}

/// The real path's own time per request, in simulated seconds: the median
/// TTFT of `PROBES` requests sent one at a time to an idle fleet, less the
/// simulated TTFT of the same request (its prefill step alone).
async fn probe_network_delay() -> f64 {
    let spec = WorkloadSpec::Random(RandomOptions {
        input_len: LenRange::fixed(512),
        output_len: LenRange::fixed(4),
    });
    let real = run_real(
        "round_robin",
        spec.clone(),
        Arrivals::Closed { concurrency: 1 },
        PROBES,
    )
    .await;
    assert_eq!(real.figures.completed, PROBES, "probe requests");
    let one = SimWorkload::builtin(&spec, 1, 1.0, 1.0, 0).unwrap();
    let engine = simulate(&one, &real, "round_robin", 0.0).ttft_s.p50;
    let seen = real.figures.ttft_ms.p50 / 1000.0 * SIM_TIME_SCALE;
    println!(
        "idle probe: TTFT {:.1} ms real, {:.1} ms engine (simulated ms)",
        seen * 1000.0,
        engine * 1000.0
    );
    (seen - engine).max(0.0)
}

struct Row {
    policy: &'static str,
    real: (u64, u64),
    sim: (u64, u64),
    hit: (f64, f64),
    p50: (f64, f64),
    p99: (f64, f64),
    tput: (f64, f64),
}

fn within(pair: (f64, f64), tolerance: f64) -> bool {
    (pair.0 / pair.1 - 1.0).abs() <= tolerance
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulate_agrees_with_the_real_time_path() {
    let delay = probe_network_delay().await;
    println!("network delay given to simulate: {:.1} ms", delay * 1000.0);
    // The prompts' token ids as the replicas and the router see them behind
    // `bench`, so `hash` and `cache` rank replicas as `serve` does.
    let workload = SimWorkload::trace(&trace(), LENGTH_SCALE, RATE_SCALE, Some(REQUESTS))
        .unwrap()
        .with_bench_text();
    let mut rows = Vec::new();
    for policy in POLICIES {
        let real = run_real(
            policy,
            WorkloadSpec::Trace(TraceOptions {
                path: trace(),
                time_scale: 1.0 / (RATE_SCALE * SIM_TIME_SCALE),
                length_scale: LENGTH_SCALE,
                max_requests: Some(REQUESTS),
            }),
            Arrivals::Timestamps,
            REQUESTS as u64,
        )
        .await;
        let sim = simulate(&workload, &real, policy, delay);
        let f = &real.figures;
        // Wall milliseconds on the replicas' scaled clock → simulated ms.
        let real_ms = |wall_ms: f64| wall_ms * SIM_TIME_SCALE;
        rows.push(Row {
            policy,
            real: (f.completed, f.failed),
            sim: (sim.outcomes.completed, sim.outcomes.errors()),
            hit: (real.cache.hit_rate().unwrap_or(0.0), sim.prefix_hit_rate),
            p50: (real_ms(f.ttft_ms.p50), sim.ttft_s.p50 * 1000.0),
            p99: (real_ms(f.ttft_ms.p99), sim.ttft_s.p99 * 1000.0),
            tput: (
                f.output_throughput / SIM_TIME_SCALE,
                sim.output_tokens_per_s,
            ),
        });
    }
    println!(
        "{:<18} {:>9} {:>9} {:>11} {:>17} {:>17} {:>13}",
        "policy",
        "done r/s",
        "fail r/s",
        "hit % r/s",
        "TTFT p50 ms r/s",
        "TTFT p99 ms r/s",
        "tok/s r/s"
    );
    for r in &rows {
        println!(
            "{:<18} {:>4}/{:<4} {:>4}/{:<4} {:>5.1}/{:<5.1} {:>8.0}/{:<8.0} {:>8.0}/{:<8.0} {:>6.0}/{:<6.0}",
            r.policy,
            r.real.0,
            r.sim.0,
            r.real.1,
            r.sim.1,
            r.hit.0 * 100.0,
            r.hit.1 * 100.0,
            r.p50.0,
            r.p50.1,
            r.p99.0,
            r.p99.1,
            r.tput.0,
            r.tput.1
        );
    }
    for r in &rows {
        let p = r.policy;
        assert_eq!(r.real, r.sim, "{p}: completed and failed requests");
        assert!(
            within(r.hit, 0.10),
            "{p}: prefix-hit rate real/sim {:?}",
            r.hit
        );
        let (p50, tput) = bounds(p);
        assert!(within(r.p50, p50), "{p}: TTFT p50 ms real/sim {:?}", r.p50);
        assert!(
            within(r.tput, tput),
            "{p}: output tok/s real/sim {:?}",
            r.tput
        );
    }
}

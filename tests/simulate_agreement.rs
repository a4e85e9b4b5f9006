// A test binary of its own, not a module of `tests/it/`: its real-time
// fleets are timed against the simulator and must have the machine's cores
// to themselves (cargo runs test binaries one after another).

//! `llmlb fleet-sim` against the real-time path on loopback: 4 `llmlb replica-sim`
//! replicas behind `llmlb serve`, loaded by `llmlb bench` with the first
//! requests of the conversation trace, then the same workload through
//! `simulate` with the same pool, engine profile and replica addresses, for
//! every policy.
//!
//! The workload is chosen so that engine time dominates what a client sees:
//! the `h100-8b` profile (prefill at 0.1 ms a token, 10 ms steps) with the
//! trace's arrivals twelve times faster, so requests queue and batch on the
//! engines and TTFT is hundreds of simulated milliseconds. The replicas run
//! at [`sim_time_scale`] (simulated seconds per wall second); every real
//! figure is converted to simulated time with it, and the pool's scrape
//! interval and staleness (wall time in `serve`) are given to `simulate`
//! scaled the same way. What the real path adds per request (the client,
//! the proxy, the replica's HTTP front, loopback) is measured on an idle
//! fleet first (`probe_network_delay`) and given to `simulate` as its
//! `network_delay`: one figure for every policy, never fitted to one.
//!
//! One run of either path is one draw: a fraction of a millisecond of
//! arrival jitter changes which requests share an engine step or a replica,
//! and the run diverges from there. So each real run's own lateness (how
//! late `bench` sent against the schedule: its mean and standard deviation)
//! is measured and given to `simulate` as its arrival jitter, several seeded
//! draws are simulated per real run, and the means are compared.
//! Two more simulations per real run are printed beside the draws: the
//! real run's own send times replayed ([`replay`]), and the same with the
//! requests of each burst in a random order ([`shuffle_bursts`]); they tell
//! where a real run's spread comes from (docs/SIMULATOR.md).
//! `AGREEMENT_PER_REQUEST=1` lists every request's real and replayed TTFT
//! and replica.
//! `AGREEMENT_RUNS=N` repeats the real path N times per policy (default 1;
//! docs/SIMULATOR.md has the comparison at 8); `AGREEMENT_POLICIES=jsq,hash`
//! compares only those; `AGREEMENT_TIME_SCALE` slows the real replicas
//! further ([`sim_time_scale`]); `AGREEMENT_DECISIONS=1` prints each real run's scrape ages and
//! balancer decisions by branch (the proxy's `/metrics`).
//!
//! Asserted for every policy: the same requests complete and fail in every
//! run and draw, and the mean fleet prefix-hit rate agrees within 10 %; mean
//! TTFT and throughput as far as [`bounds`] says. A comparison that
//! disagrees is made again on a fresh fleet, up to [`ATTEMPTS`] in all
//! ([`agrees`]). Every figure is printed (`--nocapture`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use llmlb::bench::text::{SplitMix, mix};
use llmlb::bench::workload::{
    LenRange, RandomOptions, SharedPrefixOptions, TraceOptions, WorkloadSpec,
};
use llmlb::bench::{Arrivals, BenchSpec, Limits};
use llmlb::demo::fleet::{Fleet, FleetSpec, PrefixCache, pool_keys};
use llmlb::fleet_sim::run::{RunSpec, run};
use llmlb::fleet_sim::{Policy, RunResult, SimWorkload};
use llmlb::replica_sim::SimConfig;

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
/// `AGREEMENT_TIME_SCALE` overrides the default of 0.5 (a smaller scale
/// shrinks every wall-clock effect of the real path against the engines'
/// times, at the cost of a longer run).
fn sim_time_scale() -> f64 {
    std::env::var("AGREEMENT_TIME_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&v: &f64| v > 0.0)
        .unwrap_or(0.5)
}

/// The pool's scrape interval in `serve` (wall ms): 50 simulated ms at any
/// time scale (100 wall ms at the default); staleness is ten of these.
fn scrape_ms() -> f64 {
    50.0 / sim_time_scale()
}

const POLICIES: [&str; 6] = [
    "round_robin",
    "least_connections",
    "jsq",
    "hash",
    "cache",
    "exact",
];
/// Requests of the idle probe, one at a time.
const PROBES: u64 = 8;

/// Relative bounds asserted per policy on the means of TTFT p50 and output
/// throughput, wide enough for one real run (the default) against the
/// simulated mean on a loaded 2-core machine; the means of 8 real runs
/// agreed within 10 % on the trace (docs/SIMULATOR.md has the tables). `round_robin` sends every request to
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

/// The demo fleet's pool for `simulate`: the same replica addresses (never
/// contacted; `hash` ranks replicas by them) and the same scrape timing in
/// simulated time.
fn sim_config(model: &str, policy: &str, replicas: &[SocketAddr]) -> llmlb::config::Config {
    let ms = |wall: f64| (wall * sim_time_scale()).round() as u64;
    let mut text = format!(
        "[[pools]]\nname = \"demo\"\nmodels = [{model:?}]\n{}\n\
         [pools.scrape]\ninterval = \"{}ms\"\ntimeout = \"{}ms\"\nstaleness = \"{}ms\"\n",
        pool_keys(policy),
        ms(scrape_ms()),
        ms(scrape_ms()),
        ms(scrape_ms() * 10.0),
    );
    for addr in replicas {
        text.push_str(&format!("[[pools.replicas]]\nurl = \"http://{addr}\"\n"));
        if policy == "exact" {
            // Names the replica's events; `simulate` feeds them directly.
            text.push_str(&format!("kv_events = \"tcp://{addr}\"\n"));
        }
    }
    llmlb::config::parse(&text).unwrap()
}

fn profile() -> SimConfig {
    let mut p = SimConfig::profile(PROFILE).unwrap();
    p.time_scale = sim_time_scale();
    p.engine.max_num_batched_tokens = BATCHED_TOKENS;
    p
}

/// What one real run gives back.
struct Real {
    figures: llmlb::bench::stats::Figures,
    /// When each request was sent, wall ms from the start of the run, in
    /// the order sent.
    sent_ms: Vec<f64>,
    /// Per request in the same order: its TTFT (wall ms) and replica.
    per_request: Vec<(Option<f64>, String)>,
    cache: PrefixCache,
    replicas: Vec<SocketAddr>,
    /// Requests on the busiest replica ÷ the mean (the `x-llmlb-replica`
    /// of each answer).
    busiest: f64,
    /// When the replicas' next scrape came after `bench` started, in
    /// simulated seconds (the mean over the replicas).
    scrape_phase: f64,
    model: String,
}

fn busiest_over_mean(records: &[llmlb::bench::record::RequestRecord], replicas: usize) -> f64 {
    let mut per: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
    for r in records {
        *per.entry(r.replica.as_deref().unwrap_or("")).or_default() += 1;
    }
    let most = per.values().copied().max().unwrap_or(0) as f64;
    most / (records.len().max(1) as f64 / replicas.max(1) as f64)
}

/// Starts a 4-replica fleet under `policy`, runs `bench` against it, stops it.
async fn run_real(policy: &str, workload: WorkloadSpec, arrivals: Arrivals, requests: u64) -> Real {
    let spec = FleetSpec {
        sim: profile(),
        replicas: 4,
        seed: 0,
        top: String::new(),
        pool: pool_keys(policy),
        kv_events: policy == "exact",
        scrape_interval: Duration::from_secs_f64(scrape_ms() / 1000.0),
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
    // Each replica's scrape loop runs on its own interval from the proxy's
    // start; traffic starts when `bench` has built its client and workload,
    // a few milliseconds after the ages are read (the report's `date`).
    let ages = fleet.scrape_ages_ms();
    let read_at = std::time::SystemTime::now();
    let report = llmlb::bench::run(&bench).await.unwrap();
    let started = humantime::parse_rfc3339(&report.date).unwrap();
    let setup_ms = started
        .duration_since(read_at)
        .map_or(0.0, |d| d.as_secs_f64() * 1000.0);
    let next_wall_ms = ages
        .iter()
        .map(|&a| (scrape_ms() - a as f64 - setup_ms).rem_euclid(scrape_ms()))
        .sum::<f64>()
        / ages.len().max(1) as f64;
    if std::env::var_os("AGREEMENT_DECISIONS").is_some() {
        println!(
            "{policy}: scrape ages when read (wall ms) {ages:?}, traffic {setup_ms:.1} ms later"
        );
        let text = fleet.proxy_metrics().await.unwrap_or_default();
        for line in text
            .lines()
            .filter(|l| l.starts_with("llmlb_balancer_decisions_total"))
        {
            println!("{policy}: {line}");
        }
    }
    let mut by_send: Vec<_> = report.requests.iter().collect();
    by_send.sort_by(|a, b| a.start_ms.total_cmp(&b.start_ms));
    let real = Real {
        sent_ms: by_send.iter().map(|r| r.start_ms).collect(),
        per_request: by_send
            .iter()
            .map(|r| (r.ttft_ms, r.replica.clone().unwrap_or_default()))
            .collect(),
        busiest: busiest_over_mean(&report.requests, fleet.replica_addrs().len()),
        scrape_phase: next_wall_ms * sim_time_scale() / 1000.0,
        figures: report.figures,
        cache: fleet.prefix_cache().await,
        replicas: fleet.replica_addrs(),
        model: fleet.model().to_string(),
    };
    fleet.stop().await;
    real
}

fn simulate(
    workload: &SimWorkload,
    real: &Real,
    policy: &str,
    network_delay: f64,
    seed: u64,
) -> RunResult {
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
            goodput_tpot: 0.0,
            seed,
            network_delay,
            scrape_phase: real.scrape_phase,
            tiers: None,
            tenants: None,
            instances: llmlb::fleet_sim::instances::Instances::one(),
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
    let engine = simulate(&one, &real, "round_robin", 0.0, 0).ttft_s.p50;
    let seen = real.figures.ttft_ms.p50 / 1000.0 * sim_time_scale();
    println!(
        "idle probe: TTFT {:.1} ms real, {:.1} ms engine (simulated ms)",
        seen * 1000.0,
        engine * 1000.0
    );
    (seen - engine).max(0.0)
}

/// Real runs per policy: `AGREEMENT_RUNS` (default 1). One run of either
/// path is one draw of a spread (see [`bounds`]); the comparison in
/// docs/SIMULATOR.md sets it higher and compares means.
fn real_runs() -> usize {
    std::env::var("AGREEMENT_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&n| n > 0)
        .unwrap_or(1)
}

/// The policies compared: `AGREEMENT_POLICIES` (comma-separated), else all.
fn policies() -> Vec<&'static str> {
    let only = std::env::var("AGREEMENT_POLICIES").unwrap_or_default();
    POLICIES
        .into_iter()
        .filter(|p| only.is_empty() || only.split(',').any(|o| o.trim() == *p))
        .collect()
}

/// Simulated draws per real run: the same replica addresses and scrape
/// phase, each with its own seeded arrival lateness (of the real run's mean
/// and spread).
const DRAWS_PER_RUN: u64 = 8;

/// One run of one path, in simulated time.
#[derive(Clone, Copy, Debug)]
struct Figures {
    completed: u64,
    failed: u64,
    hit: f64,
    p50_ms: f64,
    p99_ms: f64,
    tok_s: f64,
    /// Requests on the busiest replica ÷ the mean.
    busiest: f64,
    /// The worst TTFT (simulated ms).
    worst_ms: f64,
}

/// Mean, smallest and largest of `values`.
fn stats(values: &[f64]) -> (f64, f64, f64) {
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (mean, lo, hi)
}

/// Mean, smallest and largest of `f` over `runs`.
fn summary(runs: &[Figures], f: impl Fn(&Figures) -> f64) -> (f64, f64, f64) {
    stats(&runs.iter().map(f).collect::<Vec<_>>())
}

/// How late `bench` sent the requests of `real` against the trace's
/// schedule, in simulated seconds: mean and standard deviation. Its timer
/// wakes late (tokio's wheel ticks in milliseconds) and the loaded host
/// runs it late; the spread is well under the mean on a quiet host. Sends
/// and schedule are paired in time order.
fn lateness(real: &Real, workload: &SimWorkload) -> (f64, f64) {
    let late: Vec<f64> = real
        .sent_ms
        .iter()
        .zip(&workload.requests)
        .map(|(s, r)| (s - r.at * 1000.0 / sim_time_scale()).max(0.0) * sim_time_scale() / 1000.0)
        .collect();
    let n = late.len().max(1) as f64;
    let mean = late.iter().sum::<f64>() / n;
    let sd = (late.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / n).sqrt();
    (mean, sd)
}

/// `workload` with each request arriving when `bench` really sent it in
/// `real` (sends and schedule paired in time order): one simulated run with
/// the real run's own arrivals instead of a draw of its lateness.
fn replay(workload: &SimWorkload, real: &Real) -> SimWorkload {
    let mut out = workload.clone();
    for (r, s) in out.requests.iter_mut().zip(&real.sent_ms) {
        r.at = s * sim_time_scale() / 1000.0;
    }
    out
}

/// `replayed` (a [`replay`] of `schedule`) with the requests of each burst
/// (those `schedule` has at one instant; the trace's timestamps are whole
/// milliseconds and many share one) in a seeded random order, each send
/// time kept: which request of a burst reaches the proxy and its replica
/// first is not fixed on the real path.
fn shuffle_bursts(mut replayed: SimWorkload, schedule: &SimWorkload, seed: u64) -> SimWorkload {
    let mut rng = SplitMix::new(mix(seed, 0x6275_7273));
    let mut next = move |below: usize| (rng.next_u64() % below as u64) as usize;
    let times = &schedule.requests;
    let requests = &mut replayed.requests;
    let mut start = 0;
    while start < requests.len() {
        let end = (start..requests.len())
            .find(|&j| times[j].at != times[start].at)
            .unwrap_or(requests.len());
        // Fisher-Yates over the burst's requests; the send times stay put.
        for k in (start + 1..end).rev() {
            let m = start + next(k - start + 1);
            let (at_k, at_m) = (requests[k].at, requests[m].at);
            requests.swap(k, m);
            requests[k].at = at_k;
            requests[m].at = at_m;
        }
        start = end;
    }
    replayed
}

/// Each request of a real run next to the same request in its replay
/// (simulated ms).
fn print_per_request(policy: &str, real: &Real, replayed: &RunResult) {
    let scale = sim_time_scale();
    println!(
        "{policy}: request, sent ms, real replica, real TTFT ms, replay replica, replay TTFT ms"
    );
    for (i, ((s, (ttft, replica)), (sim_ttft, sim_replica))) in real
        .sent_ms
        .iter()
        .zip(&real.per_request)
        .zip(&replayed.per_request)
        .enumerate()
    {
        println!(
            "{policy}: {i} {:.2} {replica} {:.1} {sim_replica} {:.1}",
            s * scale,
            ttft.map_or(f64::NAN, |t| t * scale),
            sim_ttft.map_or(f64::NAN, |t| t * 1000.0),
        );
    }
}

fn real_figures(real: &Real) -> Figures {
    let f = &real.figures;
    // Wall milliseconds on the replicas' scaled clock → simulated ms.
    Figures {
        completed: f.completed,
        failed: f.failed,
        hit: real.cache.hit_rate().unwrap_or(0.0),
        p50_ms: f.ttft_ms.p50 * sim_time_scale(),
        p99_ms: f.ttft_ms.p99 * sim_time_scale(),
        tok_s: f.output_throughput / sim_time_scale(),
        busiest: real.busiest,
        worst_ms: f.ttft_ms.max * sim_time_scale(),
    }
}

fn sim_figures(sim: &RunResult) -> Figures {
    Figures {
        completed: sim.outcomes.completed,
        failed: sim.outcomes.errors(),
        hit: sim.prefix_hit_rate,
        p50_ms: sim.ttft_s.p50 * 1000.0,
        p99_ms: sim.ttft_s.p99 * 1000.0,
        tok_s: sim.output_tokens_per_s,
        busiest: sim.busiest_over_mean,
        worst_ms: sim.ttft_s.max * 1000.0,
    }
}

fn within(pair: (f64, f64), tolerance: f64) -> bool {
    (pair.0 / pair.1 - 1.0).abs() <= tolerance
}

/// A workload as both paths run it.
struct Case {
    name: &'static str,
    /// What `bench` sends, and when.
    bench: WorkloadSpec,
    arrivals: Arrivals,
    /// The same requests for `simulate`, arrivals in simulated seconds.
    sim: SimWorkload,
}

/// The first `REQUESTS` of the conversation trace, twelve times its rate.
fn trace_case() -> Case {
    Case {
        name: "conversation trace",
        bench: WorkloadSpec::Trace(TraceOptions {
            path: trace(),
            time_scale: 1.0 / (RATE_SCALE * sim_time_scale()),
            length_scale: LENGTH_SCALE,
            max_requests: Some(REQUESTS),
        }),
        arrivals: Arrivals::Timestamps,
        // The prompts' token ids as the replicas and the router see them
        // behind `bench`, so `hash` and `cache` rank replicas as `serve` does.
        sim: SimWorkload::trace(&trace(), LENGTH_SCALE, RATE_SCALE, Some(REQUESTS))
            .unwrap()
            .with_bench_text(),
    }
}

/// Arrivals per simulated second of the shared-prefix case: the replicas
/// batch, and a miss's 1,000-token prefill delays what shares its step.
const SHARED_PREFIX_RATE: f64 = 40.0;

/// Eight system prompts of 1,000 tokens, 15 questions each, Poisson arrivals
/// from `bench`'s own seeded generator (the same gaps on both paths): most
/// of each prompt can come from the prefix cache, so hit rates say
/// something here (the trace's first requests share little).
fn shared_prefix_case() -> Case {
    let spec = WorkloadSpec::SharedPrefix(SharedPrefixOptions {
        groups: 8,
        prompts_per_group: REQUESTS / 8,
        system_len: 1000,
        question_len: 64,
        output_len: 64,
    });
    Case {
        name: "shared prefix",
        bench: spec.clone(),
        arrivals: Arrivals::Open {
            rate: SHARED_PREFIX_RATE * sim_time_scale(),
            burstiness: 1.0,
        },
        sim: SimWorkload::builtin(&spec, REQUESTS, SHARED_PREFIX_RATE, 1.0, 0).unwrap(),
    }
}

/// The real fleets of two tests must not share the two cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulate_agrees_with_the_real_time_path() {
    let _one_at_a_time = SERIAL.lock().await;
    agrees(trace_case).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulate_agrees_with_the_real_time_path_on_shared_prefixes() {
    let _one_at_a_time = SERIAL.lock().await;
    agrees(shared_prefix_case).await;
}

/// Comparisons made before the test fails.
const ATTEMPTS: usize = 3;

/// Compares the two paths; a comparison that disagrees is made again on a
/// fresh fleet, up to [`ATTEMPTS`] in all. The real path is one draw on a
/// shared host, and a host busy with other work (builds, other tests)
/// slows the proxy and the client by more than the idle probe measured: a
/// run it disturbed says nothing of the simulator. A modelling error fails
/// every attempt; each attempt's figures and disagreements are printed.
async fn agrees(case: fn() -> Case) {
    let mut failed = Vec::new();
    for attempt in 1..=ATTEMPTS {
        let disagreements = agreement(case()).await;
        if disagreements.is_empty() {
            return;
        }
        println!("attempt {attempt} of {ATTEMPTS} disagreed: {disagreements:#?}");
        failed.push(disagreements);
    }
    panic!("the real-time path and simulate disagreed in every attempt: {failed:#?}");
}

/// One comparison: what disagreed (empty when the paths agree).
async fn agreement(case: Case) -> Vec<String> {
    println!("== {}", case.name);
    let delay = probe_network_delay().await;
    println!("network delay given to simulate: {:.1} ms", delay * 1000.0);
    let workload = &case.sim;
    let runs = real_runs();
    let policies = policies();
    let mut real: Vec<Vec<Figures>> = vec![Vec::new(); policies.len()];
    let mut sim: Vec<Vec<Figures>> = vec![Vec::new(); policies.len()];
    let mut replayed: Vec<Vec<Figures>> = vec![Vec::new(); policies.len()];
    let mut shuffled: Vec<Vec<Figures>> = vec![Vec::new(); policies.len()];
    let mut late_all = Vec::new();
    let mut phases = Vec::new();
    // Rounds of every policy, so that a slow spell of the host falls on all.
    for round in 0..runs {
        for (k, policy) in policies.iter().enumerate() {
            let one = run_real(
                policy,
                case.bench.clone(),
                case.arrivals.clone(),
                REQUESTS as u64,
            )
            .await;
            let (late, sd) = lateness(&one, workload);
            late_all.push((late, sd));
            phases.push(one.scrape_phase * 1000.0);
            real[k].push(real_figures(&one));
            let replayed_sends = replay(workload, &one);
            let again = simulate(&replayed_sends, &one, policy, delay, 0);
            for draw in 0..DRAWS_PER_RUN {
                let w = shuffle_bursts(replayed_sends.clone(), workload, draw + 1);
                shuffled[k].push(sim_figures(&simulate(&w, &one, policy, delay, draw + 1)));
            }
            if std::env::var_os("AGREEMENT_PER_REQUEST").is_some() {
                print_per_request(policy, &one, &again);
            }
            replayed[k].push(sim_figures(&again));
            for draw in 0..DRAWS_PER_RUN {
                let seed = (round as u64) * DRAWS_PER_RUN + draw + 1;
                let jittered = workload.clone().with_arrival_jitter(late, sd, seed);
                sim[k].push(sim_figures(&simulate(&jittered, &one, policy, delay, seed)));
            }
        }
    }
    let means: Vec<f64> = late_all.iter().map(|l| l.0 * 1000.0).collect();
    let sds: Vec<f64> = late_all.iter().map(|l| l.1 * 1000.0).collect();
    let span = |v: &[f64]| {
        let (_, lo, hi) = stats(v);
        format!("{lo:.2} to {hi:.2}")
    };
    println!(
        "{runs} real run(s) and {} simulated draws per policy; bench sent late by {} simulated ms \
         on average per run (standard deviation {}), given to simulate as its arrival jitter",
        runs as u64 * DRAWS_PER_RUN,
        span(&means),
        span(&sds),
    );
    println!(
        "the replicas' next scrape came {} simulated ms after the traffic started, \
         given to simulate as its scrape phase",
        span(&phases)
    );
    println!(
        "means, real/sim (simulated ms; ranges over the runs below)\n{:<18} {:>9} {:>9} {:>11} {:>17} {:>17} {:>13}",
        "policy",
        "done r/s",
        "fail r/s",
        "hit % r/s",
        "TTFT p50 ms r/s",
        "TTFT p99 ms r/s",
        "tok/s r/s"
    );
    let mut checks = Vec::new();
    for (k, policy) in policies.iter().enumerate() {
        let (r, m) = (&real[k], &sim[k]);
        let hit = (summary(r, |f| f.hit).0, summary(m, |f| f.hit).0);
        let p50 = (summary(r, |f| f.p50_ms).0, summary(m, |f| f.p50_ms).0);
        let p99 = (summary(r, |f| f.p99_ms).0, summary(m, |f| f.p99_ms).0);
        let tput = (summary(r, |f| f.tok_s).0, summary(m, |f| f.tok_s).0);
        println!(
            "{:<18} {:>4.0}/{:<4.0} {:>4.0}/{:<4.0} {:>5.1}/{:<5.1} {:>8.0}/{:<8.0} {:>8.0}/{:<8.0} {:>6.0}/{:<6.0}",
            policy,
            summary(r, |f| f.completed as f64).0,
            summary(m, |f| f.completed as f64).0,
            summary(r, |f| f.failed as f64).0,
            summary(m, |f| f.failed as f64).0,
            hit.0 * 100.0,
            hit.1 * 100.0,
            p50.0,
            p50.1,
            p99.0,
            p99.1,
            tput.0,
            tput.1
        );
        let range = |v: &[Figures], f: fn(&Figures) -> f64| {
            let (_, lo, hi) = summary(v, f);
            format!("{lo:.0}..{hi:.0}")
        };
        println!(
            "{:<18} p50 {} / {}, p99 {} / {}, worst {} / {}, tok/s {} / {}, busiest/mean {:.2} / {:.2}",
            "",
            range(r, |f| f.p50_ms),
            range(m, |f| f.p50_ms),
            range(r, |f| f.p99_ms),
            range(m, |f| f.p99_ms),
            range(r, |f| f.worst_ms),
            range(m, |f| f.worst_ms),
            range(r, |f| f.tok_s),
            range(m, |f| f.tok_s),
            summary(r, |f| f.busiest).0,
            summary(m, |f| f.busiest).0,
        );
        let se = |v: &[Figures], f: fn(&Figures) -> f64| {
            let x: Vec<f64> = v.iter().map(f).collect();
            let (mean, _, _) = stats(&x);
            let var =
                x.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / (x.len().max(2) - 1) as f64;
            (var / x.len() as f64).sqrt()
        };
        println!(
            "{:<18} standard error of the means: p50 {:.0} / {:.0}, p99 {:.0} / {:.0}, tok/s {:.0} / {:.0}",
            "",
            se(r, |f| f.p50_ms),
            se(m, |f| f.p50_ms),
            se(r, |f| f.p99_ms),
            se(m, |f| f.p99_ms),
            se(r, |f| f.tok_s),
            se(m, |f| f.tok_s),
        );
        for (label, runs) in [
            ("replayed sends", &replayed[k]),
            ("replayed, bursts shuffled", &shuffled[k]),
        ] {
            println!(
                "{:<18} {label}: p50 {:.0} ({}), p99 {:.0} ({}), tok/s {:.0} ({})",
                "",
                summary(runs, |f| f.p50_ms).0,
                range(runs, |f| f.p50_ms),
                summary(runs, |f| f.p99_ms).0,
                range(runs, |f| f.p99_ms),
                summary(runs, |f| f.tok_s).0,
                range(runs, |f| f.tok_s),
            );
        }
        checks.push((*policy, hit, p50, tput));
    }
    let mut disagreements = Vec::new();
    for (k, policy) in policies.iter().enumerate() {
        for (i, r) in real[k].iter().enumerate() {
            let draws = &sim[k][i * DRAWS_PER_RUN as usize..(i + 1) * DRAWS_PER_RUN as usize];
            for d in draws {
                if (r.completed, r.failed) != (d.completed, d.failed) {
                    disagreements.push(format!(
                        "{policy}: completed and failed requests, real run {i}: {:?} real, {:?} simulated",
                        (r.completed, r.failed),
                        (d.completed, d.failed)
                    ));
                }
            }
        }
    }
    for (p, hit, p50, tput) in checks {
        let (p50_bound, tput_bound) = bounds(p);
        for (what, pair, bound) in [
            ("prefix-hit rate", hit, 0.10),
            ("TTFT p50 ms", p50, p50_bound),
            ("output tok/s", tput, tput_bound),
        ] {
            if !within(pair, bound) {
                disagreements.push(format!(
                    "{p}: {what} real/sim {pair:?}, more than {:.0} % apart",
                    bound * 100.0
                ));
            }
        }
    }
    disagreements
}

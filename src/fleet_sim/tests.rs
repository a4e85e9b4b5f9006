//! The event loop end to end on small fleets: determinism, accounting,
//! staleness-free basics and each fault kind.

use std::time::Duration;

use super::decide::{Policy, generated_config};
use super::faults::Fault;
use super::report::RunResult;
use super::run::{RunSpec, run};
use super::workload::SimWorkload;
use crate::bench::workload::{LenRange, RandomOptions, WorkloadSpec};
use crate::replica_sim::SimConfig;

fn workload(count: usize, rate: f64) -> SimWorkload {
    let spec = WorkloadSpec::Random(RandomOptions {
        input_len: LenRange::fixed(64),
        output_len: LenRange::fixed(8),
    });
    SimWorkload::builtin(&spec, count, rate, 1.0, 7).unwrap()
}

fn simulate(w: &SimWorkload, replicas: usize, policy: &str, faults: &[Fault]) -> RunResult {
    simulate_with_delay(w, replicas, policy, faults, 0.0)
}

fn simulate_with_delay(
    w: &SimWorkload,
    replicas: usize,
    policy: &str,
    faults: &[Fault],
    network_delay: f64,
) -> RunResult {
    simulate_with(w, replicas, policy, faults, network_delay, 0.0)
}

fn simulate_with(
    w: &SimWorkload,
    replicas: usize,
    policy: &str,
    faults: &[Fault],
    network_delay: f64,
    scrape_phase: f64,
) -> RunResult {
    let profile = SimConfig::profile("fast").unwrap();
    let mut config = generated_config(&profile.model, replicas).unwrap();
    // Retry once on a refused connection, as a production pool would.
    config.pools[0].retries = 1;
    let config = policy.parse::<Policy>().unwrap().apply(&config);
    let spec = RunSpec {
        workload: w,
        config: &config,
        model: &profile.model,
        profile: &profile,
        faults,
        goodput_ttft: 1.0,
        goodput_tpot: 0.0,
        seed: 0,
        network_delay,
        scrape_phase,
        tiers: None,
        tenants: None,
        instances: crate::fleet_sim::instances::Instances::one(),
    };
    run(&spec, policy).unwrap()
}

#[test]
fn network_delay_shifts_what_the_client_sees_when_decisions_do_not_read_load() {
    // Round-robin decides the same at any timing: each engine sees the same
    // requests half the delay later, and the client its tokens half the
    // delay after that.
    let w = workload(40, 200.0);
    let a = simulate(&w, 2, "round_robin", &[]);
    let b = simulate_with_delay(&w, 2, "round_robin", &[], 0.025);
    let shifted: Vec<f64> = a.ttft_samples.iter().map(|t| t + 0.025).collect();
    assert_eq!(b.ttft_samples.len(), shifted.len());
    for (x, y) in b.ttft_samples.iter().zip(&shifted) {
        assert!((x - y).abs() < 1e-9, "{x} vs {y}");
    }
    assert!((b.e2e_s.p50 - a.e2e_s.p50 - 0.025).abs() < 1e-9);
    assert_eq!((a.itl_s.p50, a.itl_s.p99), (b.itl_s.p50, b.itl_s.p99));
    assert_eq!(a.outcomes.output_tokens, b.outcomes.output_tokens);
    // One event more per request each way.
    assert_eq!(b.events, a.events + 2 * 40);
}

#[test]
fn a_request_counts_in_flight_on_its_way_in_and_out() {
    // One replica that takes one request at a time: the second of two
    // simultaneous requests waits until the proxy sees the first one end,
    // then reaches the engine half the delay later.
    let w = workload(2, 1e6);
    let profile = SimConfig::profile("fast").unwrap();
    let mut config = generated_config(&profile.model, 1).unwrap();
    config.pools[0].replicas[0].max_inflight = Some(1);
    let limited = |delay: f64| run_fast_delayed(&w, &config, "least_connections", None, delay);
    let a = limited(0.0);
    let b = limited(0.1);
    assert_eq!(b.outcomes.completed, 2);
    let (first, second) = (
        a.ttft_samples[0].min(a.ttft_samples[1]),
        a.ttft_samples[0].max(a.ttft_samples[1]),
    );
    let (first_d, second_d) = (
        b.ttft_samples[0].min(b.ttft_samples[1]),
        b.ttft_samples[0].max(b.ttft_samples[1]),
    );
    assert!((first_d - first - 0.1).abs() < 1e-9, "{first_d} vs {first}");
    // The second waits for the first's whole round trip: one more delay.
    assert!(
        (second_d - second - 0.2).abs() < 1e-9,
        "{second_d} vs {second}"
    );
}

#[test]
fn the_scrape_phase_moves_what_reads_the_scrape_and_nothing_else() {
    let w = workload(200, 400.0);
    // Round-robin reads no scrape: the same run at any phase.
    let rr = simulate_with(&w, 3, "round_robin", &[], 0.0, 0.0);
    for phase in [0.013, 0.031] {
        let other = simulate_with(&w, 3, "round_robin", &[], 0.0, phase);
        assert_eq!(rr.ttft_samples, other.ttft_samples);
    }
    // JSQ compares the scraped queues: some phase changes its decisions.
    let jsq = simulate_with(&w, 3, "jsq", &[], 0.0, 0.0);
    let moved = [0.007, 0.013, 0.021, 0.031, 0.043].iter().any(|&phase| {
        simulate_with(&w, 3, "jsq", &[], 0.0, phase).ttft_samples != jsq.ttft_samples
    });
    assert!(moved, "no scrape phase changed jsq's run");
}

#[test]
fn every_request_completes_once_and_runs_are_deterministic() {
    let w = workload(60, 100.0);
    let a = simulate(&w, 3, "least_connections", &[]);
    let b = simulate(&w, 3, "least_connections", &[]);
    assert_eq!(a.outcomes.completed, 60);
    assert_eq!(a.outcomes.errors() + a.outcomes.unfinished, 0);
    assert_eq!(a.outcomes.output_tokens, 60 * 8);
    assert_eq!(a.ttft_samples, b.ttft_samples);
    assert_eq!(a.events, b.events);
    // A request's first token comes after a prefill step: never at once.
    assert!(a.ttft_s.p50 > 0.0 && a.ttft_s.p50 <= a.e2e_s.p50);
    // Round-robin spreads dispatches evenly.
    let rr = simulate(&w, 3, "round_robin", &[]);
    assert!(
        (rr.busiest_over_mean - 1.0).abs() < 1e-9,
        "{}",
        rr.busiest_over_mean
    );
}

#[test]
fn more_replicas_lower_the_latency_of_a_saturating_load() {
    let w = workload(300, 2_000.0);
    let one = simulate(&w, 1, "jsq", &[]);
    let four = simulate(&w, 4, "jsq", &[]);
    assert_eq!(one.outcomes.completed, 300);
    assert_eq!(four.outcomes.completed, 300);
    assert!(
        four.ttft_s.p99 < one.ttft_s.p99,
        "{:?} vs {:?}",
        four.ttft_s,
        one.ttft_s
    );
}

#[test]
fn a_killed_replica_fails_its_requests_and_traffic_moves_on() {
    let w = workload(200, 1_000.0);
    let kill: Fault = "kill:replica=0,at=100ms".parse().unwrap();
    let r = simulate(&w, 2, "round_robin", &[kill]);
    let o = &r.outcomes;
    // Some in flight on replica 0 at the kill fail; afterwards, refused
    // connections are retried on replica 1 and eject replica 0.
    assert!(o.upstream >= 1, "{o:?}");
    assert_eq!(o.completed + o.errors() + o.unfinished, 200);
    // Only the requests on replica 0 at the kill are lost (~1/2 of the few
    // in flight), not the half of all later arrivals that round-robin sends it.
    assert!(o.upstream < 40, "{o:?}");
}

#[test]
fn a_hung_replica_times_out_its_requests() {
    let w = workload(100, 100.0);
    let hang: Fault = "hang:replica=1,at=200ms".parse().unwrap();
    let r = simulate(&w, 2, "round_robin", &[hang]);
    let o = &r.outcomes;
    assert!(o.timeout >= 1, "{o:?}");
    assert_eq!(o.completed + o.timeout, 100, "{o:?}");
}

#[test]
fn a_slow_replica_slows_what_it_serves() {
    let w = workload(100, 50.0);
    let base = simulate(&w, 2, "round_robin", &[]);
    let slow: Fault = "slow:replica=0,at=0s,factor=5".parse().unwrap();
    let slowed = simulate(&w, 2, "round_robin", &[slow]);
    assert_eq!(slowed.outcomes.completed, 100);
    assert!(
        slowed.e2e_s.p99 > base.e2e_s.p99 * 2.0,
        "{:?} vs {:?}",
        slowed.e2e_s,
        base.e2e_s
    );
}

#[test]
fn a_fault_beyond_the_fleet_is_an_error() {
    let w = workload(5, 10.0);
    let profile = SimConfig::profile("fast").unwrap();
    let config = generated_config(&profile.model, 2).unwrap();
    let spec = RunSpec {
        workload: &w,
        config: &config,
        model: &profile.model,
        profile: &profile,
        faults: &["kill:replica=5,at=1s".parse().unwrap()],
        goodput_ttft: 1.0,
        goodput_tpot: 0.0,
        seed: 0,
        network_delay: 0.0,
        scrape_phase: 0.0,
        tiers: None,
        tenants: None,
        instances: crate::fleet_sim::instances::Instances::one(),
    };
    let err = run(&spec, "config").err().unwrap();
    assert!(err.to_string().contains("replica 5"), "{err}");
}

/// 8 groups of 16 prompts sharing a 512-token system prompt.
fn shared_prefixes() -> WorkloadSpec {
    WorkloadSpec::SharedPrefix(crate::bench::workload::SharedPrefixOptions {
        groups: 8,
        prompts_per_group: 16,
        system_len: 512,
        question_len: 32,
        output_len: 4,
    })
}

#[test]
fn prefix_affinity_raises_the_fleet_hit_rate_on_shared_prefixes() {
    let spec = shared_prefixes();
    let w = SimWorkload::builtin(&spec, 128, 50.0, 1.0, 1).unwrap();
    let rr = simulate(&w, 4, "round_robin", &[]);
    let cache = simulate(&w, 4, "cache", &[]);
    assert!(
        cache.prefix_hit_rate > rr.prefix_hit_rate,
        "cache {} vs round_robin {}",
        cache.prefix_hit_rate,
        rr.prefix_hit_rate
    );
}

#[test]
fn exact_mode_learns_each_engine_cache_from_its_events() {
    // A burst of shared prefixes: the second prompt of a group arrives
    // before any engine has published an event, so it counts only if the
    // record kept what was sent before it knew the block size.
    let spec = shared_prefixes();
    // Nothing is evicted here, so what the engines report is what llmlb
    // sent: `exact` decides as `cache` does, and both beat round-robin.
    for rate in [50.0, 400.0] {
        let w = SimWorkload::builtin(&spec, 128, rate, 1.0, 1).unwrap();
        let rr = simulate(&w, 4, "round_robin", &[]);
        let cache = simulate(&w, 4, "cache", &[]);
        let exact = simulate(&w, 4, "exact", &[]);
        assert_eq!(exact.outcomes.completed, 128);
        assert_eq!(
            exact.outcomes.prefix_hits, cache.outcomes.prefix_hits,
            "rate {rate}"
        );
        assert!(exact.prefix_hit_rate > rr.prefix_hit_rate, "rate {rate}");
        assert_eq!(exact.ttft_samples, cache.ttft_samples, "rate {rate}");
    }
}

#[test]
fn each_request_keeps_what_was_predicted_cached_and_what_was_found() {
    // Nothing is evicted on shared prefixes: `cache` predicts what the
    // engines find, request by request; round-robin predicts nothing.
    let w = SimWorkload::builtin(&shared_prefixes(), 128, 50.0, 1.0, 1).unwrap();
    let cache = simulate(&w, 4, "cache", &[]);
    assert_eq!(cache.per_request_cache.len(), w.requests.len());
    let found: u64 = (cache.per_request_cache.iter())
        .map(|&(_, c)| u64::from(c.expect("every request finished")))
        .sum();
    assert_eq!(found, cache.outcomes.cached_tokens);
    assert!(found > 0);
    let predicted: u64 = cache.per_request_cache.iter().map(|p| p.0.unwrap()).sum();
    assert_eq!(predicted, found);
    let rr = simulate(&w, 4, "round_robin", &[]);
    assert!(rr.per_request_cache.iter().all(|p| p.0.is_none()));
}

/// The fleet of `simulate` with every replica limited to `limit` requests,
/// the pool queue shaped by `queue`.
fn simulate_limited(
    w: &SimWorkload,
    replicas: usize,
    limit: u32,
    queue: impl Fn(&mut crate::config::QueueConfig),
) -> RunResult {
    let profile = SimConfig::profile("fast").unwrap();
    let mut config = generated_config(&profile.model, replicas).unwrap();
    config.pools[0].max_inflight = Some(limit);
    queue(&mut config.pools[0].queue);
    run_fast(w, &config, "least_connections", None)
}

/// `w` through `config` under `policy` on `fast` replicas, without faults,
/// goodput within 1 s.
pub(super) fn run_fast(
    w: &SimWorkload,
    config: &crate::config::Config,
    policy: &str,
    tiers: Option<&super::tiers::Tiers>,
) -> RunResult {
    run_fast_delayed(w, config, policy, tiers, 0.0)
}

/// [`run_fast`] with a network delay (seconds).
fn run_fast_delayed(
    w: &SimWorkload,
    config: &crate::config::Config,
    policy: &str,
    tiers: Option<&super::tiers::Tiers>,
    network_delay: f64,
) -> RunResult {
    let profile = SimConfig::profile("fast").unwrap();
    let config = policy.parse::<Policy>().unwrap().apply(config);
    let spec = RunSpec {
        workload: w,
        config: &config,
        model: &profile.model,
        profile: &profile,
        faults: &[],
        goodput_ttft: 1.0,
        goodput_tpot: 0.0,
        seed: 0,
        network_delay,
        scrape_phase: 0.0,
        tiers,
        tenants: None,
        instances: crate::fleet_sim::instances::Instances::one(),
    };
    run(&spec, policy).unwrap()
}

#[test]
fn the_pool_queue_holds_requests_until_a_slot_frees() {
    // A burst far above what two one-request replicas start at once.
    let w = workload(20, 10_000.0);
    let free = simulate(&w, 2, "least_connections", &[]);
    let limited = simulate_limited(&w, 2, 1, |q| q.max_wait = Duration::from_secs(3600));
    assert_eq!(limited.outcomes.completed, 20);
    assert_eq!(limited.outcomes.errors() + limited.outcomes.rejected_429, 0);
    // One request at a time per replica: the tenth in line waits for nine
    // to finish, where the free fleet batches them all at once.
    assert!(
        limited.ttft_s.p99 > 4.0 * free.ttft_s.p99,
        "limited {} s, free {} s",
        limited.ttft_s.p99,
        free.ttft_s.p99
    );
    assert!(limited.e2e_s.p99 > limited.e2e_s.p50);
}

#[test]
fn a_full_queue_refuses_and_a_long_wait_times_out() {
    let w = workload(20, 10_000.0);
    // Two running, two waiting: the other sixteen are refused at once.
    let shallow = simulate_limited(&w, 2, 1, |q| {
        q.max_depth = 2;
        q.max_wait = Duration::from_secs(3600);
    });
    assert_eq!(shallow.outcomes.rejected_429, 16);
    assert_eq!(shallow.outcomes.completed, 4);
    // A queue timeout shorter than one request: whoever waits gives up.
    let impatient = simulate_limited(&w, 2, 1, |q| {
        q.max_wait = Duration::from_secs(3600);
        q.timeout = Duration::from_micros(1);
    });
    assert_eq!(impatient.outcomes.completed, 2);
    assert_eq!(impatient.outcomes.slot_timeout, 18);
}

#[test]
fn each_request_keeps_its_ttft_and_replica_in_workload_order() {
    let w = workload(12, 100.0);
    let r = simulate_with_delay(&w, 3, "round_robin", &[], 0.004);
    assert_eq!(r.per_request.len(), w.requests.len());
    // Round-robin hands the requests out in arrival order, one per replica.
    let replicas: Vec<u32> = r.per_request.iter().map(|p| p.1).collect();
    let firsts: Vec<u32> = replicas[..3].to_vec();
    for (i, &at) in replicas.iter().enumerate() {
        assert_eq!(at, firsts[i % 3], "request {i}: replicas {replicas:?}");
    }
    let mut distinct = firsts.clone();
    distinct.sort();
    assert_eq!(distinct, vec![0, 1, 2]);
    // The same TTFTs as the summary's samples, network delay included.
    let mut ttfts: Vec<f64> = r.per_request.iter().map(|p| p.0.unwrap()).collect();
    ttfts.sort_by(f64::total_cmp);
    let mut samples = r.ttft_samples.clone();
    samples.sort_by(f64::total_cmp);
    assert_eq!(ttfts.len(), samples.len());
    for (a, b) in ttfts.iter().zip(&samples) {
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    }
}

#[test]
fn the_table_says_when_errors_are_prompts_over_the_context() {
    let spec = WorkloadSpec::Random(RandomOptions {
        input_len: LenRange::fixed(100_000),
        output_len: LenRange::fixed(8),
    });
    let long = SimWorkload::builtin(&spec, 3, 50.0, 1.0, 7).unwrap();
    let r = simulate(&long, 2, "round_robin", &[]);
    assert_eq!((r.outcomes.too_long, r.outcomes.errors()), (3, 3));
    let text = super::report::table(std::slice::from_ref(&r));
    assert!(
        text.contains("errors include up to 3 requests longer than the profile's context"),
        "{text}"
    );
    let fine = simulate(&workload(3, 50.0), 2, "round_robin", &[]);
    assert!(!super::report::table(&[fine]).contains("longer than"));
}

//! Several llmlb instances on the virtual clock, with and without a fleet
//! store: the shape of `docs/lab/fleet-instances.md` (four `h100-8b`
//! replicas with 1,024 KV blocks, `cache` mode, 16 system prompts × 12
//! requests, 24 closed-loop clients, requests to the instances in turn).

use std::time::Duration;

use super::decide::{Policy, generated_config};
use super::instances::Instances;
use super::report::RunResult;
use super::run::{RunSpec, run};
use super::tenants::{TenantMix, Tenants};
use super::workload::SimWorkload;
use crate::bench::workload::{SharedPrefixOptions, WorkloadSpec};
use crate::config::{Config, PrefixMode};
use crate::replica_sim::SimConfig;

fn workload(seed: u64) -> SimWorkload {
    let spec = WorkloadSpec::SharedPrefix(SharedPrefixOptions {
        groups: 16,
        prompts_per_group: 12,
        system_len: 330,
        question_len: 24,
        output_len: 64,
    });
    SimWorkload::builtin(&spec, 192, 100.0, 1.0, seed).unwrap()
}

fn profile() -> SimConfig {
    let mut p = SimConfig::profile("h100-8b").unwrap();
    p.engine.num_blocks = 1024;
    p.engine.max_model_len = 8192;
    p
}

fn config(max_inflight: Option<u32>) -> Config {
    let mut c = generated_config(&profile().model, 4).unwrap();
    c.pools[0].max_inflight = max_inflight;
    for r in &mut c.pools[0].replicas {
        r.max_inflight = max_inflight;
    }
    Policy::Prefix(PrefixMode::Cache).apply(&c)
}

fn simulate(max_inflight: Option<u32>, count: usize, store: bool, seed: u64) -> RunResult {
    let w = workload(seed);
    let mix: TenantMix = "clients=streams:24".parse().unwrap();
    let tenants = Tenants::draw(&mix, w.requests.len(), seed);
    let config = config(max_inflight);
    let profile = profile();
    let spec = RunSpec {
        workload: &w,
        config: &config,
        model: &profile.model,
        profile: &profile,
        faults: &[],
        goodput_ttft: 2.0,
        goodput_tpot: 0.0,
        seed,
        network_delay: 0.0,
        scrape_phase: 0.0,
        tiers: None,
        tenants: Some(&tenants),
        instances: Instances {
            count,
            store,
            refresh: Duration::from_millis(50),
        },
    };
    let r = run(&spec, "cache").unwrap();
    assert_eq!(r.outcomes.completed, 192, "{}: {:?}", r.policy, r.outcomes);
    r
}

fn peak(r: &RunResult) -> u32 {
    r.peak_per_replica.iter().copied().max().unwrap()
}

#[test]
fn the_store_holds_each_replicas_limit_and_separate_instances_overrun_it() {
    let one = simulate(Some(3), 1, false, 1);
    let with = simulate(Some(3), 3, true, 1);
    let without = simulate(Some(3), 3, false, 1);
    assert_eq!(with.peak_per_replica.len(), 4);
    assert!(peak(&one) <= 3, "{:?}", one.peak_per_replica);
    assert!(
        with.peak_per_replica.iter().all(|&p| p <= 3),
        "with the store: {:?}",
        with.peak_per_replica
    );
    // Each instance applies the whole limit to its own requests.
    assert!(peak(&without) > 3, "{:?}", without.peak_per_replica);
    assert!(peak(&without) <= 9, "{:?}", without.peak_per_replica);
    assert_eq!(with.policy, "cache x3+store");
    assert_eq!(without.policy, "cache x3");
}

#[test]
fn the_store_gives_three_instances_the_prefix_hits_of_one() {
    // Seeds 1–3 averaged (measured: one instance 0.800, three with the
    // store 0.800, three without 0.717; per seed with the store at least
    // 0.97 × one instance).
    let mean = |count: usize, store: bool| {
        let hits: f64 = (1..=3)
            .map(|seed| simulate(None, count, store, seed).prefix_hit_rate)
            .sum();
        hits / 3.0
    };
    let one = mean(1, false);
    let with = mean(3, true);
    let without = mean(3, false);
    assert!(with >= 0.95 * one, "with the store {with:.3}, one {one:.3}");
    assert!(
        without < 0.95 * one && without < with,
        "without the store {without:.3}, with {with:.3}, one {one:.3}"
    );
}

#[test]
fn one_queue_order_keeps_three_instances_tail_near_one_instances() {
    // Seeds 1–3, mean p99 TTFT with `max_inflight = 3` (measured: one
    // instance 0.965 s, three with the store 1.229 s; with the leases but
    // each instance ordering only its own waiters 1.939 s).
    let mean_p99 = |count: usize, store: bool| {
        let p99: f64 = (1..=3)
            .map(|seed| simulate(Some(3), count, store, seed).ttft_s.p99)
            .sum();
        p99 / 3.0
    };
    let one = mean_p99(1, false);
    let with = mean_p99(3, true);
    assert!(
        with <= 1.4 * one,
        "with the store {with:.3} s, one {one:.3} s"
    );
}

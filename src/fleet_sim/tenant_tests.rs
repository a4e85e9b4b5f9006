//! Tenants end to end on the virtual clock: the scenario of
//! `llmlb demo --scenario fairness` (two `h100-8b` replicas with
//! `max_inflight = 2`, a light tenant's one stream beside a heavy tenant's
//! twelve on one level) under FIFO and fair share, and weights 2:1
//! between two tenants that always wait.

use std::time::Duration;

use super::decide::generated_config;
use super::report::RunResult;
use super::run::{RunSpec, run};
use super::tenant_report::TenantResult;
use super::tenants::{TenantMix, Tenants};
use super::workload::SimWorkload;
use crate::bench::workload::{LenRange, RandomOptions, WorkloadSpec};
use crate::config::{Config, Fairness};
use crate::replica_sim::SimConfig;

fn workload(count: usize, rate: f64, output: (usize, usize)) -> SimWorkload {
    let spec = WorkloadSpec::Random(RandomOptions {
        input_len: LenRange::fixed(512),
        output_len: LenRange {
            min: output.0,
            max: output.1,
        },
    });
    SimWorkload::builtin(&spec, count, rate, 1.0, 5).unwrap()
}

fn config(fairness: Fairness) -> Config {
    let profile = SimConfig::profile("h100-8b").unwrap();
    let mut c = generated_config(&profile.model, 2).unwrap();
    c.pools[0].max_inflight = Some(2);
    let q = &mut c.pools[0].queue;
    q.max_depth = 10_000;
    q.max_wait = Duration::from_secs(3600);
    q.timeout = Duration::from_secs(3600);
    q.fairness = fairness;
    c
}

fn simulate(w: &SimWorkload, config: &Config, mix: &str) -> RunResult {
    let mix: TenantMix = mix.parse().unwrap();
    let tenants = Tenants::draw(&mix, w.requests.len(), 11);
    let profile = SimConfig::profile("h100-8b").unwrap();
    let spec = RunSpec {
        workload: w,
        config,
        model: &profile.model,
        profile: &profile,
        faults: &[],
        goodput_ttft: 1.0,
        goodput_tpot: 0.0,
        seed: 0,
        network_delay: 0.0,
        scrape_phase: 0.0,
        tiers: None,
        tenants: Some(&tenants),
        instances: crate::fleet_sim::instances::Instances::one(),
    };
    run(&spec, "config").unwrap()
}

fn tenant<'a>(r: &'a RunResult, name: &str) -> &'a TenantResult {
    r.tenants.iter().find(|t| t.tenant == name).unwrap()
}

#[test]
fn a_light_stream_beside_a_flood_waits_for_one_release_under_fair_share() {
    let w = workload(600, 1.0, (16, 112));
    let mix = "light=streams:1,heavy=streams:12";
    let fifo = simulate(&w, &config(Fairness::Fifo), mix);
    let fair = simulate(&w, &config(Fairness::Tenants), mix);
    let solo = simulate(
        &workload(100, 1.0, (16, 112)),
        &config(Fairness::Tenants),
        "light=streams:1",
    );
    for r in [&fifo, &fair] {
        assert_eq!(r.outcomes.completed, 600);
        assert_eq!(r.outcomes.rejected_429, 0);
    }
    let (solo_light, fifo_light, fair_light) = (
        tenant(&solo, "light"),
        tenant(&fifo, "light"),
        tenant(&fair, "light"),
    );
    // The mean time between two slot releases under the flood.
    let gap = fair.duration_s / fair.outcomes.completed as f64;
    let figures = format!(
        "light TTFT p50/p99: solo {:.3}/{:.3} s, fifo {:.3}/{:.3} s, fair {:.3}/{:.3} s; \
         {gap:.3} s between releases",
        solo_light.ttft_s.p50,
        solo_light.ttft_s.p99,
        fifo_light.ttft_s.p50,
        fifo_light.ttft_s.p99,
        fair_light.ttft_s.p50,
        fair_light.ttft_s.p99,
    );
    println!("{figures}");
    // In arrival order the light request waits behind the nine heavy ones
    // queued; with fair share its own freed slot is held for its next
    // request (`anticipate`), so it waits at most for one release
    // (docs/lab/fair-share.md).
    assert!(
        fair_light.ttft_s.p99 <= solo_light.ttft_s.p99 + gap,
        "{figures}"
    );
    assert!(
        fair_light.ttft_s.p99 * 4.0 <= fifo_light.ttft_s.p99,
        "{figures}"
    );
    // The light stream sends more often when it waits less.
    assert!(fair_light.requests > fifo_light.requests, "{figures}");
    // Work-conserving: the fleet's output rate is the same.
    let ratio = fair.output_tokens_per_s / fifo.output_tokens_per_s;
    assert!((0.95..=1.05).contains(&ratio), "{ratio}");
}

#[test]
fn weights_two_to_one_serve_two_to_one_while_both_wait() {
    // Twelve streams each on four slots: both tenants always wait.
    let w = workload(900, 1.0, (16, 112));
    let r = simulate(
        &w,
        &config(Fairness::Tenants),
        "gold=streams:12@2,plain=streams:12",
    );
    let (gold, plain) = (tenant(&r, "gold"), tenant(&r, "plain"));
    let share = gold.output_tps / plain.output_tps;
    assert!((1.8..=2.2).contains(&share), "gold:plain output {share}");
    let fifo = simulate(
        &w,
        &config(Fairness::Fifo),
        "gold=streams:12@2,plain=streams:12",
    );
    let even = tenant(&fifo, "gold").output_tps / tenant(&fifo, "plain").output_tps;
    assert!(
        (0.8..=1.25).contains(&even),
        "fifo gold:plain output {even}"
    );
}

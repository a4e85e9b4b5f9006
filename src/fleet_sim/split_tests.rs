//! Disaggregated pools (prefill replicas beside decode replicas) on the
//! virtual clock: the phases of a request's time to first token, the
//! per-request decision, failures of the prefill side, and the search for
//! the smallest split.

use super::decide::{Policy, generated_config, generated_disaggregated};
use super::faults::Fault;
use super::report::RunResult;
use super::run::{RunSpec, run};
use super::search::{Objective, find_split};
use super::workload::SimWorkload;
use crate::bench::workload::{LenRange, RandomOptions, WorkloadSpec};
use crate::config::{Config, DisaggregateWhen};
use crate::replica_sim::SimConfig;

fn random(count: usize, rate: f64, input: usize, output: usize, seed: u64) -> SimWorkload {
    let spec = WorkloadSpec::Random(RandomOptions {
        input_len: LenRange::fixed(input),
        output_len: LenRange::fixed(output),
    });
    SimWorkload::builtin(&spec, count, rate, 1.0, seed).unwrap()
}

fn profile() -> SimConfig {
    SimConfig::profile("h100-8b").unwrap()
}

fn simulate(w: &SimWorkload, config: &Config, faults: &[Fault]) -> RunResult {
    let profile = profile();
    let config = Policy::Balancer(crate::config::BalancerKind::LeastTokens).apply(config);
    let spec = RunSpec {
        workload: w,
        config: &config,
        model: &profile.model,
        profile: &profile,
        faults,
        goodput_ttft: 1.0,
        goodput_tpot: 0.02,
        seed: 0,
        network_delay: 0.0,
        scrape_phase: 0.0,
        tiers: None,
        tenants: None,
        instances: crate::fleet_sim::instances::Instances::one(),
    };
    run(&spec, "least_tokens").unwrap()
}

fn split(decode: usize, prefill: usize, when: DisaggregateWhen) -> Config {
    generated_disaggregated(&profile().model, decode, prefill, when).unwrap()
}

#[test]
fn a_lone_request_waits_for_its_prefill_the_transfer_and_one_decode_step() {
    let w = random(1, 1.0, 4096, 16, 1);
    let r = simulate(&w, &split(1, 1, DisaggregateWhen::Always), &[]);
    assert_eq!(r.outcomes.completed, 1);
    assert_eq!(r.policy, "least_tokens 1P1D");
    let s = r.split.as_ref().unwrap();
    assert_eq!(s.decisions.get("always"), Some(&1));
    // The decode replica's cache is empty: the whole prompt crosses.
    let prompt = w.requests[0].input as usize;
    let transfer = profile().disaggregation.transfer_time(prompt);
    assert!(
        (s.transfer_s.p50 - transfer).abs() < 1e-12,
        "{}",
        s.transfer_s.p50
    );
    // TTFT is exactly its three phases.
    let phases = s.prefill_s.p50 + s.transfer_s.p50 + s.first_decode_step_s.p50;
    assert!(
        (r.ttft_s.p50 - phases).abs() < 1e-9,
        "{} vs {phases}",
        r.ttft_s.p50
    );
    // The first decode step is one decode step, not a 4k-token prefill.
    assert!(
        s.first_decode_step_s.p50 < 0.05 && s.prefill_s.p50 > 0.2,
        "{s:?}"
    );
    let (prefill, decode) = (&s.roles[0], &s.roles[1]);
    assert_eq!(
        (prefill.role, prefill.dispatched, prefill.sampled_tokens),
        ("prefill", 1, 1)
    );
    assert_eq!(prefill.prefill_tokens, prompt as u64);
    // The decode replica computes only the prompt's last token.
    assert_eq!(
        (decode.role, decode.prefill_tokens, decode.sampled_tokens),
        ("decode", 1, 16)
    );
}

#[test]
fn runs_are_deterministic() {
    let w = random(120, 6.0, 2048, 64, 3);
    let c = split(2, 2, DisaggregateWhen::Auto);
    let a = simulate(&w, &c, &[]);
    let b = simulate(&w, &c, &[]);
    assert_eq!(a.ttft_samples, b.ttft_samples);
    assert_eq!(a.events, b.events);
    assert_eq!(a.split.unwrap().decisions, b.split.unwrap().decisions);
}

#[test]
fn decode_batches_without_long_prefills_keep_inter_token_latency() {
    // 4k prompts at 4 per second: the aggregated replicas stall their
    // batches on every prefill; the decode replicas never do.
    let w = random(200, 4.0, 4096, 256, 5);
    let aggregated = simulate(&w, &generated_config(&profile().model, 4).unwrap(), &[]);
    let split = simulate(&w, &split(2, 2, DisaggregateWhen::Always), &[]);
    assert_eq!(split.outcomes.completed, 200);
    assert_eq!(aggregated.outcomes.completed, 200);
    assert!(
        split.itl_s.p99 * 5.0 < aggregated.itl_s.p99,
        "ITL p99 {} vs {}",
        split.itl_s.p99,
        aggregated.itl_s.p99
    );
    let decode = &split.split.as_ref().unwrap().roles[1];
    assert_eq!(decode.prefill_tokens, 200, "one last token per request");
}

#[test]
fn auto_keeps_short_prompts_on_the_decode_replicas() {
    let short = random(160, 4.0, 128, 64, 11);
    let long = random(60, 1.5, 4096, 64, 12);
    let w = short.merged(long);
    let always = simulate(&w, &split(2, 2, DisaggregateWhen::Always), &[]);
    let auto = simulate(&w, &split(2, 2, DisaggregateWhen::Auto), &[]);
    let s = auto.split.as_ref().unwrap();
    assert_eq!(s.decisions.get("short"), Some(&160), "{:?}", s.decisions);
    assert_eq!(s.decisions.get("long"), Some(&60), "{:?}", s.decisions);
    assert_eq!(
        always.split.as_ref().unwrap().decisions.get("always"),
        Some(&220)
    );
    // The short prompts skip the hop: lower TTFT than when disaggregated.
    let short_ttft = |r: &RunResult| {
        let mut v: Vec<f64> = (w.requests.iter().zip(&r.per_request))
            .filter(|(q, _)| q.input < 1000)
            .map(|(_, (t, _))| t.unwrap())
            .collect();
        super::stats::Quantiles::of(&mut v)
    };
    let (a, b) = (short_ttft(&always), short_ttft(&auto));
    assert!(b.p50 < a.p50 && b.p99 < a.p99, "{b:?} vs {a:?}");
}

#[test]
fn a_dead_prefill_replica_falls_back_to_the_decode_replica() {
    let w = random(20, 2.0, 2048, 16, 2);
    // Position 1: the pool's one decode replica is 0, its prefill replica 1.
    let kill: Fault = "kill:replica=1,at=0s".parse().unwrap();
    let r = simulate(
        &w,
        &split(1, 1, DisaggregateWhen::Always),
        std::slice::from_ref(&kill),
    );
    assert_eq!(r.outcomes.completed, 20);
    let s = r.split.as_ref().unwrap();
    // Refused, then (once ejected as an outlier) not even tried.
    let back = |b: &str| s.decisions.get(b).copied().unwrap_or(0);
    assert_eq!(
        back("fallback") + back("no_prefill_replica"),
        20,
        "{:?}",
        s.decisions
    );
    assert!(back("fallback") >= 1 && s.prefill_failures == back("fallback"));
    let mut strict = split(1, 1, DisaggregateWhen::Always);
    strict.pools[0].disaggregation.as_mut().unwrap().fallback = false;
    let r = simulate(&w, &strict, &[kill]);
    let o = &r.outcomes;
    assert_eq!((o.completed, o.upstream + o.no_replica), (0, 20));
}

#[test]
fn a_prefill_killed_midway_moves_to_another_prefill_replica() {
    let w = random(1, 1.0, 8192, 8, 4);
    // Prefill replicas are 1 and 2; the one the request went to dies
    // during its prefill (about 0.8 s), the other one prefills it again.
    let faults: Vec<Fault> = vec![
        "kill:replica=1,at=300ms".parse().unwrap(),
        "kill:replica=2,at=300ms".parse().unwrap(),
    ];
    let mut moved = 0;
    for fault in faults {
        let r = simulate(&w, &split(1, 2, DisaggregateWhen::Always), &[fault]);
        assert_eq!(r.outcomes.completed, 1);
        let s = r.split.as_ref().unwrap();
        assert_eq!(s.decisions.get("always"), Some(&1));
        if s.prefill_failures == 1 {
            // Prefilled again from the start on the other replica.
            moved += 1;
            assert!(s.prefill_s.p50 > 0.3 + 0.7, "{}", s.prefill_s.p50);
        }
    }
    assert_eq!(moved, 1, "one of the two kills hit the request's replica");
}

#[test]
fn a_hung_prefill_replica_times_out_into_the_fallback() {
    let w = random(3, 1.0, 1024, 8, 6);
    let mut c = split(1, 1, DisaggregateWhen::Always);
    c.pools[0].disaggregation.as_mut().unwrap().prefill_timeout = std::time::Duration::from_secs(2);
    let hang: Fault = "hang:replica=1,at=0s".parse().unwrap();
    let r = simulate(&w, &c, &[hang]);
    assert_eq!(r.outcomes.completed, 3);
    let s = r.split.as_ref().unwrap();
    let back = |b: &str| s.decisions.get(b).copied().unwrap_or(0);
    assert_eq!(
        back("fallback") + back("no_prefill_replica"),
        3,
        "{:?}",
        s.decisions
    );
    // The first waited the prefill timeout before its decode replica
    // prefilled it.
    assert!(back("fallback") >= 1 && s.prefill_failures >= 1);
    assert!(r.ttft_s.max > 2.0 && r.ttft_s.max < 2.5, "{:?}", r.ttft_s);
}

#[test]
fn the_split_search_walks_the_frontier() {
    let o: Objective = "p99_ttft=1s".parse().unwrap();
    let fake = |p: usize, d: usize| {
        // Met with at least 3 prefill and 2 decode replicas.
        let ttft = if p >= 3 && d >= 2 { 0.5 } else { 2.0 };
        let mut q = [ttft];
        Ok(RunResult::new(
            "p",
            p + d,
            1,
            Default::default(),
            &mut q.clone(),
            &mut q,
            &super::stats::LogHistogram::default(),
            vec![1; d],
            1.0,
            1.0,
            1,
            0.0,
        ))
    };
    let (best, probes) = find_split(&o, 4, 64, fake).unwrap();
    assert_eq!(best.replicas, 5);
    assert!(probes.contains(&((3, 2), true)));
    assert!(probes.contains(&((3, 1), false)) || probes.contains(&((2, 2), false)));
    assert!(probes.len() <= 16, "{probes:?}");
    assert!(find_split(&o, 4, 4, fake).is_err());
}

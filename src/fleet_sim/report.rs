//! What a run produced, per policy: latency quantiles, goodput at the TTFT
//! objective, fleet prefix-hit rate, load spread, preemptions and failures,
//! as a table, JSON and an SVG of latency CDFs (drawn by `bench`'s plot);
//! with `--tiers`, each tier's figures too ([`super::tier_report`]).

use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;

use super::SimulateError;
use super::stats::{LogHistogram, Quantiles};
use super::tier_report::TierResult;

/// Counters the event loop keeps.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Outcomes {
    pub completed: u64,
    /// Completed with TTFT within the goodput objective.
    pub within_objective: u64,
    pub output_tokens: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// The replicas' prefix-cache counters summed (`vllm:prefix_cache_queries`
    /// and `_hits`, in tokens; a preempted request is looked up again).
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    pub preemptions: u64,
    /// 429: refused by the pool queue (full level, a wait estimated beyond
    /// the level's `max_wait`, or a predicted TTFT beyond its
    /// `ttft_objective`).
    pub rejected_429: u64,
    /// 503: no eligible replica.
    pub no_replica: u64,
    /// 502: the replica refused or broke the connection, attempts exhausted.
    pub upstream: u64,
    /// 504: a hung replica never answered.
    pub timeout: u64,
    /// 503: waited for a free slot (every allowed replica at its
    /// `max_inflight`) past the pool's timeout, as `serve` answers.
    pub slot_timeout: u64,
    /// 400 from the replica: prompt plus output over its context length.
    pub too_long: u64,
    /// 400 from the router.
    pub bad_request: u64,
    /// Still in flight when the events ran out (a replica stuck for cache room).
    pub unfinished: u64,
}

impl Outcomes {
    pub fn errors(&self) -> u64 {
        self.no_replica
            + self.upstream
            + self.timeout
            + self.slot_timeout
            + self.too_long
            + self.bad_request
    }
}

/// One policy's result.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub policy: String,
    pub replicas: usize,
    pub requests: usize,
    pub outcomes: Outcomes,
    pub ttft_s: Quantiles,
    pub itl_s: Quantiles,
    pub e2e_s: Quantiles,
    /// Seconds of virtual time from the first arrival to the last event.
    pub duration_s: f64,
    /// Completed requests within the TTFT objective, per second.
    pub goodput_rps: f64,
    pub goodput_ttft_s: f64,
    pub output_tokens_per_s: f64,
    /// The fleet's prefix-cache hit rate: hit tokens ÷ queried tokens, as
    /// the replicas count them.
    pub prefix_hit_rate: f64,
    /// Requests dispatched to the busiest replica ÷ the mean per replica.
    pub busiest_over_mean: f64,
    pub events: u64,
    pub wall_s: f64,
    pub ns_per_event: f64,
    /// Per tier, with `--tiers`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tiers: Vec<TierResult>,
    /// Per tenant, with `--tenants`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<super::tenant_report::TenantResult>,
    /// A disaggregated pool's decisions, TTFT phases and roles.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub split: Option<super::split_report::SplitResult>,
    /// Goodput also asks each request's mean inter-token gap (TPOT) to be
    /// at most this (0: TTFT alone).
    pub goodput_tpot_s: f64,
    /// llmlb instances sending to the fleet (`--instances`).
    pub instances: usize,
    /// Per replica of the pool, the most requests it held at once
    /// (running + waiting in its engine).
    pub peak_per_replica: Vec<u32>,
    /// The pool's largest `max_inflight`, when it has one.
    pub max_inflight: Option<u32>,
    #[serde(skip)]
    pub ttft_samples: Vec<f64>,
    #[serde(skip)]
    pub e2e_samples: Vec<f64>,
    /// Per request of the workload, in its order: the TTFT (seconds, `None`
    /// when no token came) and the replica it was sent to last.
    #[serde(skip)]
    pub per_request: Vec<(Option<f64>, u32)>,
    /// Per request of the workload, in its order: the prompt tokens llmlb
    /// predicted its replica holds (prefix modes) and those the replica
    /// found cached (`None` until it finished).
    #[serde(skip)]
    pub per_request_cache: Vec<(Option<u64>, Option<u32>)>,
    /// Per request: the time to first token the cost model expected on the
    /// replica it picked (`cache` and `exact` modes), in seconds.
    #[serde(skip)]
    pub per_request_predicted_ttft: Vec<Option<f64>>,
}

impl RunResult {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        policy: &str,
        replicas: usize,
        requests: usize,
        outcomes: Outcomes,
        ttft: &mut [f64],
        e2e: &mut [f64],
        itl: &LogHistogram,
        dispatched: Vec<u64>,
        duration: f64,
        goodput_ttft: f64,
        events: u64,
        wall: f64,
    ) -> RunResult {
        let duration = duration.max(1e-9);
        let total: u64 = dispatched.iter().sum();
        let mean = total as f64 / dispatched.len().max(1) as f64;
        let busiest = dispatched.iter().copied().max().unwrap_or(0) as f64;
        RunResult {
            policy: policy.to_string(),
            replicas,
            requests,
            ttft_s: Quantiles::of(ttft),
            itl_s: Quantiles::of_histogram(itl),
            e2e_s: Quantiles::of(e2e),
            duration_s: duration,
            goodput_rps: outcomes.within_objective as f64 / duration,
            goodput_ttft_s: goodput_ttft,
            output_tokens_per_s: outcomes.output_tokens as f64 / duration,
            prefix_hit_rate: if outcomes.prefix_queries == 0 {
                0.0
            } else {
                outcomes.prefix_hits as f64 / outcomes.prefix_queries as f64
            },
            busiest_over_mean: if mean > 0.0 { busiest / mean } else { 0.0 },
            events,
            wall_s: wall,
            ns_per_event: wall * 1e9 / events.max(1) as f64,
            tiers: Vec::new(),
            tenants: Vec::new(),
            split: None,
            goodput_tpot_s: 0.0,
            instances: 1,
            peak_per_replica: Vec::new(),
            max_inflight: None,
            ttft_samples: ttft.to_vec(),
            e2e_samples: e2e.to_vec(),
            per_request: Vec::new(),
            per_request_cache: Vec::new(),
            per_request_predicted_ttft: Vec::new(),
            outcomes,
        }
    }
}

pub(super) fn ms(s: f64) -> String {
    if s >= 10.0 {
        format!("{s:.1}s")
    } else {
        format!("{:.0}ms", s * 1000.0)
    }
}

/// The comparison table.
pub fn table(runs: &[RunResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<18} {:>5} {:>8} {:>8} {:>7} {:>7} {:>8} {:>8} {:>9} {:>6} {:>7} {:>8} {:>5} {:>6}",
        "policy",
        "N",
        "TTFT p50",
        "TTFT p99",
        "ITL p50",
        "ITL p99",
        "E2E p50",
        "E2E p99",
        "goodput/s",
        "hit %",
        "max/avg",
        "preempt",
        "429",
        "errors"
    );
    for r in runs {
        let _ = writeln!(
            out,
            "{:<18} {:>5} {:>8} {:>8} {:>7} {:>7} {:>8} {:>8} {:>9.2} {:>6.1} {:>7.2} {:>8} {:>5} {:>6}",
            r.policy,
            r.replicas,
            ms(r.ttft_s.p50),
            ms(r.ttft_s.p99),
            ms(r.itl_s.p50),
            ms(r.itl_s.p99),
            ms(r.e2e_s.p50),
            ms(r.e2e_s.p99),
            r.goodput_rps,
            r.prefix_hit_rate * 100.0,
            r.busiest_over_mean,
            r.outcomes.preemptions,
            r.outcomes.rejected_429,
            r.outcomes.errors(),
        );
    }
    if let Some(r) = runs.first() {
        let tpot = if r.goodput_tpot_s > 0.0 {
            format!(" and TPOT <= {}", ms(r.goodput_tpot_s))
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "goodput: completed requests with TTFT <= {}{tpot} per second of simulated time",
            ms(r.goodput_ttft_s)
        );
    }
    if let Some(most) = runs.iter().map(|r| r.outcomes.too_long).max()
        && most > 0
    {
        let _ = writeln!(
            out,
            "errors include up to {most} requests longer than the profile's context \
             (answered 400, as vLLM answers them; --max-model-len raises it)"
        );
    }
    out
}

/// With several instances: each run's peak per replica against the
/// limit (empty otherwise).
pub fn peaks_table(runs: &[RunResult]) -> String {
    let mut out = String::new();
    if runs.iter().all(|r| r.instances <= 1) {
        return out;
    }
    let _ = writeln!(
        out,
        "{:<18} {:>13} {:>12}  peak running + waiting per replica",
        "policy", "max_inflight", "peak"
    );
    for r in runs {
        let peaks: Vec<String> = r.peak_per_replica.iter().map(u32::to_string).collect();
        let peak = r.peak_per_replica.iter().max().copied().unwrap_or(0);
        let limit = r.max_inflight.map_or("none".to_string(), |l| l.to_string());
        let _ = writeln!(
            out,
            "{:<18} {:>13} {:>12}  {}",
            r.policy,
            limit,
            peak,
            peaks.join(" ")
        );
    }
    out
}

/// Writes `value` as pretty JSON.
pub fn write_json(path: &Path, value: &impl Serialize) -> Result<(), SimulateError> {
    let text = serde_json::to_string_pretty(value).expect("report serializes");
    std::fs::write(path, text + "\n").map_err(|e| SimulateError::Io {
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

/// Writes TTFT and end-to-end CDFs, one curve per policy.
pub fn write_svg(path: &Path, runs: &[RunResult]) -> Result<(), SimulateError> {
    let curves: Vec<crate::bench::plot::Curves> = runs
        .iter()
        .map(|r| crate::bench::plot::Curves {
            name: format!("{} (N={})", r.policy, r.replicas),
            ttft_ms: r.ttft_samples.iter().map(|s| s * 1000.0).collect(),
            e2e_ms: r.e2e_samples.iter().map(|s| s * 1000.0).collect(),
            completed: r.outcomes.completed,
        })
        .collect();
    std::fs::write(path, crate::bench::plot::svg_of(&curves)).map_err(|e| SimulateError::Io {
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

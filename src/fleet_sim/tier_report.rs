//! Figures per priority tier (with `--tiers`): what each tier's requests
//! saw under one policy (TTFT p50/p99, goodput, 429s), kept by the event
//! loop as [`TierCounts`] and reported as [`TierResult`]s, in the JSON
//! beside the policy's figures and as a second table.

use std::fmt::Write as _;

use serde::Serialize;

use super::report::{RunResult, ms};
use super::stats::Quantiles;
use super::tiers::SimTier;

/// What the event loop counts for one tier.
#[derive(Debug, Clone, Default)]
pub struct TierCounts {
    pub requests: u64,
    pub completed: u64,
    /// Completed with TTFT within the goodput objective.
    pub within_objective: u64,
    pub rejected_429: u64,
    /// TTFT of every request that produced a token, in seconds.
    pub ttft: Vec<f64>,
}

/// One tier's figures under one policy.
#[derive(Debug, Clone, Serialize)]
pub struct TierResult {
    pub tier: String,
    /// Its `[[priorities]]` level.
    pub priority: String,
    pub requests: u64,
    pub completed: u64,
    /// 429: refused by the pool queue (full level, a wait beyond the
    /// level's `max_wait`, or a predicted TTFT beyond its `ttft_objective`).
    pub rejected_429: u64,
    pub ttft_s: Quantiles,
    /// Its completed requests within the TTFT objective, per second.
    pub goodput_rps: f64,
}

impl TierResult {
    pub fn new(tier: &SimTier, mut counts: TierCounts, duration: f64) -> TierResult {
        TierResult {
            tier: tier.name.clone(),
            priority: tier.priority.clone(),
            requests: counts.requests,
            completed: counts.completed,
            rejected_429: counts.rejected_429,
            ttft_s: Quantiles::of(&mut counts.ttft),
            goodput_rps: counts.within_objective as f64 / duration.max(1e-9),
        }
    }
}

/// The per-tier table of every run that has tiers; empty when none has.
pub fn table(runs: &[RunResult]) -> String {
    let mut out = String::new();
    if runs.iter().all(|r| r.tiers.is_empty()) {
        return out;
    }
    let _ = writeln!(
        out,
        "{:<18} {:<12} {:<8} {:>8} {:>8} {:>8} {:>9} {:>6}",
        "policy", "tier", "priority", "requests", "TTFT p50", "TTFT p99", "goodput/s", "429"
    );
    for r in runs {
        for t in &r.tiers {
            let _ = writeln!(
                out,
                "{:<18} {:<12} {:<8} {:>8} {:>8} {:>8} {:>9.2} {:>6}",
                r.policy,
                t.tier,
                t.priority,
                t.requests,
                ms(t.ttft_s.p50),
                ms(t.ttft_s.p99),
                t.goodput_rps,
                t.rejected_429,
            );
        }
    }
    out
}

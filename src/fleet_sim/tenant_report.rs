//! Figures per tenant (with `--tenants`): what each tenant's requests saw
//! under one policy (TTFT p50/p99, goodput, 429s, tokens served), counted
//! by the event loop as [`TierCounts`] and reported as [`TenantResult`]s,
//! in the JSON beside the policy's figures and as a table.

use std::fmt::Write as _;

use serde::Serialize;

use super::report::{RunResult, ms};
use super::stats::Quantiles;
use super::tenants::SimTenant;
use super::tier_report::TierCounts;

/// One tenant's figures under one policy.
#[derive(Debug, Clone, Serialize)]
pub struct TenantResult {
    pub tenant: String,
    pub requests: u64,
    pub completed: u64,
    /// 429: refused by the pool queue (a full level or tenant share, a wait
    /// beyond the level's `max_wait`, a predicted TTFT beyond its
    /// `ttft_objective`).
    pub rejected_429: u64,
    pub ttft_s: Quantiles,
    /// Its completed requests within the TTFT objective, per second.
    pub goodput_rps: f64,
    /// Output tokens of its completed requests, per second.
    pub output_tps: f64,
}

impl TenantResult {
    pub fn new(
        tenant: &SimTenant,
        mut counts: TierCounts,
        output_tokens: u64,
        duration: f64,
    ) -> TenantResult {
        let d = duration.max(1e-9);
        TenantResult {
            tenant: tenant.name.to_string(),
            requests: counts.requests,
            completed: counts.completed,
            rejected_429: counts.rejected_429,
            ttft_s: Quantiles::of(&mut counts.ttft),
            goodput_rps: counts.within_objective as f64 / d,
            output_tps: output_tokens as f64 / d,
        }
    }
}

/// The per-tenant table of every run that has tenants; empty when none has.
pub fn table(runs: &[RunResult]) -> String {
    let mut out = String::new();
    if runs.iter().all(|r| r.tenants.is_empty()) {
        return out;
    }
    let _ = writeln!(
        out,
        "{:<18} {:<12} {:>8} {:>8} {:>8} {:>9} {:>9} {:>6}",
        "policy", "tenant", "requests", "TTFT p50", "TTFT p99", "goodput/s", "output/s", "429"
    );
    for r in runs {
        for t in &r.tenants {
            let _ = writeln!(
                out,
                "{:<18} {:<12} {:>8} {:>8} {:>8} {:>9.2} {:>9.0} {:>6}",
                r.policy,
                t.tenant,
                t.requests,
                ms(t.ttft_s.p50),
                ms(t.ttft_s.p99),
                t.goodput_rps,
                t.output_tps,
                t.rejected_429,
            );
        }
    }
    out
}

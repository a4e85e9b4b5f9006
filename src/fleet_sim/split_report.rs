//! What a run of a disaggregated pool (prefill replicas beside decode
//! replicas, xPyD) adds to its result: the decisions by branch (the labels
//! of `llmlb_disaggregation_decisions_total`), the time to first token of
//! the disaggregated requests split into its phases (the prefill as the
//! proxy sees it, the KV transfer, the decode replica's first step), and
//! per role the requests, tokens and busy time of its replicas.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::report::{RunResult, ms};
use super::stats::Quantiles;
use crate::pool::SplitBranch;

/// What the event loop counts for a disaggregated pool.
#[derive(Debug, Clone, Default)]
pub struct SplitCounts {
    /// Requests per [`SplitBranch`] (in `SplitBranch::ALL` order), each
    /// counted once, under the branch it ended in.
    pub branches: [u64; SplitBranch::ALL.len()],
    /// From the first prefill attempt to the prefill answer at the proxy.
    pub prefill_s: Vec<f64>,
    /// The decode replica's wait for the prompt's KV cache.
    pub transfer_s: Vec<f64>,
    /// From the KV cache's arrival to the first token at the client.
    pub first_step_s: Vec<f64>,
    /// TTFT of the requests prefilled on the prefill pool.
    pub ttft_split_s: Vec<f64>,
    /// TTFT of the requests their decode replica prefilled.
    pub ttft_local_s: Vec<f64>,
    /// Prefill attempts that failed (refused, broken, timed out).
    pub prefill_failures: u64,
}

impl SplitCounts {
    pub fn decided(&mut self, branch: SplitBranch) {
        let k = (SplitBranch::ALL.iter())
            .position(|b| *b == branch)
            .expect("every branch is listed");
        self.branches[k] += 1;
    }
}

/// One role's replicas over the run.
#[derive(Debug, Clone, Serialize)]
pub struct RoleResult {
    pub role: &'static str,
    pub replicas: usize,
    /// Requests sent to them (attempts included).
    pub dispatched: u64,
    /// Prompt tokens their engines computed (cache hits and loaded KV
    /// excluded).
    pub prefill_tokens: u64,
    /// Tokens their engines sampled (a prefill replica samples one per
    /// request).
    pub sampled_tokens: u64,
    /// Mean share of the run's time their engines spent in steps.
    pub busy: f64,
}

/// The xPyD part of a [`RunResult`].
#[derive(Debug, Clone, Serialize)]
pub struct SplitResult {
    pub prefill_replicas: usize,
    pub decode_replicas: usize,
    /// Requests per branch (branches with none left out).
    pub decisions: BTreeMap<&'static str, u64>,
    pub prefill_s: Quantiles,
    pub transfer_s: Quantiles,
    pub first_decode_step_s: Quantiles,
    pub ttft_disaggregated_s: Quantiles,
    pub ttft_local_s: Quantiles,
    pub prefill_failures: u64,
    pub roles: Vec<RoleResult>,
}

impl SplitResult {
    pub fn new(mut c: SplitCounts, roles: Vec<RoleResult>) -> SplitResult {
        let decisions = (SplitBranch::ALL.iter().zip(c.branches))
            .filter(|(_, n)| *n > 0)
            .map(|(b, n)| (b.as_str(), n))
            .collect();
        let replicas = |role| {
            (roles.iter())
                .find(|r: &&RoleResult| r.role == role)
                .map_or(0, |r| r.replicas)
        };
        SplitResult {
            prefill_replicas: replicas("prefill"),
            decode_replicas: replicas("decode"),
            decisions,
            prefill_s: Quantiles::of(&mut c.prefill_s),
            transfer_s: Quantiles::of(&mut c.transfer_s),
            first_decode_step_s: Quantiles::of(&mut c.first_step_s),
            ttft_disaggregated_s: Quantiles::of(&mut c.ttft_split_s),
            ttft_local_s: Quantiles::of(&mut c.ttft_local_s),
            prefill_failures: c.prefill_failures,
            roles,
        }
    }

    /// `2P3D`.
    pub fn name(&self) -> String {
        format!("{}P{}D", self.prefill_replicas, self.decode_replicas)
    }
}

/// One block per disaggregated run: decisions, the TTFT split, the roles.
pub fn table(runs: &[RunResult]) -> String {
    let mut out = String::new();
    for r in runs {
        let Some(s) = &r.split else { continue };
        let decisions: Vec<String> = (s.decisions.iter())
            .map(|(b, n)| format!("{b} {n}"))
            .collect();
        let _ = writeln!(
            out,
            "{}: decisions {}{}",
            r.policy,
            decisions.join(", "),
            if s.prefill_failures > 0 {
                format!(" ({} prefill attempts failed)", s.prefill_failures)
            } else {
                String::new()
            }
        );
        let _ = writeln!(
            out,
            "  TTFT disaggregated p50 {} p99 {} = prefill p50 {} p99 {} + transfer p50 {} p99 {} + first decode step p50 {} p99 {}; prefilled by the decode replica p50 {} p99 {}",
            ms(s.ttft_disaggregated_s.p50),
            ms(s.ttft_disaggregated_s.p99),
            ms(s.prefill_s.p50),
            ms(s.prefill_s.p99),
            ms(s.transfer_s.p50),
            ms(s.transfer_s.p99),
            ms(s.first_decode_step_s.p50),
            ms(s.first_decode_step_s.p99),
            ms(s.ttft_local_s.p50),
            ms(s.ttft_local_s.p99),
        );
        for role in &s.roles {
            let _ = writeln!(
                out,
                "  {:<7} {:>3} replicas: {} requests, {} prompt tokens computed, {} tokens sampled, busy {:.0} %",
                role.role,
                role.replicas,
                role.dispatched,
                role.prefill_tokens,
                role.sampled_tokens,
                role.busy * 100.0
            );
        }
    }
    out
}

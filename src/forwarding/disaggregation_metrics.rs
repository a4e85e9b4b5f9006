//! Metrics of prefill/decode disaggregation: the decision of each request
//! by branch, each prefill attempt by outcome, and the time to first token
//! split into the prefill phase and what follows it on the decode replica.

use prometheus::{HistogramVec, IntCounterVec, Registry};

use crate::pool::SplitBranch;
use crate::telemetry::Family;

/// Seconds, from a millisecond to two minutes.
const PHASE_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
];

#[derive(Debug, Clone)]
pub struct DisaggregationMetrics {
    /// `llmlb_disaggregation_decisions_total{pool, branch}`.
    pub decisions: IntCounterVec,
    /// `llmlb_prefill_attempts_total{pool, replica, outcome}`.
    pub prefill_attempts: IntCounterVec,
    /// `llmlb_disaggregation_phase_seconds{pool, phase}`.
    pub phase_seconds: HistogramVec,
}

impl DisaggregationMetrics {
    pub fn new(registry: &Registry) -> DisaggregationMetrics {
        let family = Family::new(registry);
        DisaggregationMetrics {
            decisions: family.counter(
                "llmlb_disaggregation_decisions_total",
                "Requests of disaggregated pools, by where their prompt was prefilled and why.",
                &["pool", "branch"],
            ),
            prefill_attempts: family.counter(
                "llmlb_prefill_attempts_total",
                "Prefill requests sent to prefill replicas, by outcome.",
                &["pool", "replica", "outcome"],
            ),
            phase_seconds: family.histogram(
                "llmlb_disaggregation_phase_seconds",
                "Time to first token of disaggregated requests by phase: prefill (the prefill replica's answer), decode_first_byte (from sending to the decode replica to its first byte: KV transfer, queue, first step).",
                &["pool", "phase"],
                &PHASE_BUCKETS,
            ),
        }
    }

    pub fn decided(&self, pool: &str, branch: SplitBranch) {
        self.decisions
            .with_label_values(&[pool, branch.as_str()])
            .inc();
    }

    pub fn phase(&self, pool: &str, phase: &str, seconds: f64) {
        self.phase_seconds
            .with_label_values(&[pool, phase])
            .observe(seconds);
    }
}

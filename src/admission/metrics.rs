//! Metrics of the gateway and admission stages.

use prometheus::{HistogramVec, IntCounterVec, IntGaugeVec, Registry};

use crate::telemetry::Family;

const WAIT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

#[derive(Debug, Clone)]
pub struct AdmissionMetrics {
    /// Requests waiting per pool and priority level.
    pub queue_depth: IntGaugeVec,
    /// Time from arrival at the queue to dispatch (0 when admitted at once).
    pub queue_wait: HistogramVec,
    /// Requests per tenant (keys are never labels; tenant names are).
    pub tenant_requests: IntCounterVec,
    /// Tokens per tenant, as reported by the replicas' `usage` (else estimated).
    pub tenant_tokens: IntCounterVec,
}

impl AdmissionMetrics {
    pub fn new(registry: &Registry) -> AdmissionMetrics {
        let family = Family::new(registry);
        let queue_depth = family.gauge(
            "llmlb_queue_depth",
            "Requests waiting in a pool's queue, by priority level.",
            &["pool", "level"],
        );
        let queue_wait = family.histogram(
            "llmlb_queue_wait_seconds",
            "Time a request waited in a pool's queue before dispatch.",
            &["pool", "level"],
            WAIT_BUCKETS,
        );
        let tenant_requests = family.counter(
            "llmlb_tenant_requests_total",
            "Requests admitted per tenant.",
            &["tenant"],
        );
        let tenant_tokens = family.counter(
            "llmlb_tenant_tokens_total",
            "Prompt plus completion tokens per tenant (reported usage, else the estimate).",
            &["tenant"],
        );
        AdmissionMetrics {
            queue_depth,
            queue_wait,
            tenant_requests,
            tenant_tokens,
        }
    }
}

//! Metrics of the gateway and admission stages.

use prometheus::{CounterVec, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry};

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
    /// Waiters per pool, level and tenant.
    pub tenant_queue_depth: IntGaugeVec,
    /// Queue wait per pool and tenant.
    pub tenant_queue_wait: HistogramVec,
    /// Refusals per pool, tenant and bound (`level_full`, `tenant_full`,
    /// `over_objective`, `timeout`).
    pub tenant_refusals: IntCounterVec,
    /// Weighted tokens served per pool and tenant (what fair share counts).
    pub tenant_service: CounterVec,
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
        let tenant_queue_depth = family.gauge(
            "llmlb_tenant_queue_depth",
            "Requests waiting in a pool's queue, by priority level and tenant.",
            &["pool", "level", "tenant"],
        );
        let tenant_queue_wait = family.histogram(
            "llmlb_tenant_queue_wait_seconds",
            "Time a tenant's request waited in a pool's queue before dispatch.",
            &["pool", "tenant"],
            WAIT_BUCKETS,
        );
        let tenant_refusals = family.counter(
            "llmlb_tenant_queue_refusals_total",
            "Requests a pool's queue refused or timed out, by tenant and the bound that refused.",
            &["pool", "tenant", "bound"],
        );
        // Weighted tokens are fractional (prompt_weight): a float counter.
        let tenant_service = CounterVec::new(
            Opts::new(
                "llmlb_tenant_service_tokens_total",
                "Weighted tokens a pool served per tenant, as fair share counts them (prompt tokens times prompt_weight, plus output tokens).",
            ),
            &["pool", "tenant"],
        )
        .expect("metric");
        family.collector(tenant_service.clone());
        AdmissionMetrics {
            queue_depth,
            queue_wait,
            tenant_requests,
            tenant_tokens,
            tenant_queue_depth,
            tenant_queue_wait,
            tenant_refusals,
            tenant_service,
        }
    }
}

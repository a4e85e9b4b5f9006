//! Metrics about load signals and replica health: scrapes, staleness
//! fallbacks, active checks and outlier ejections.

use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Registry};

use super::Family;

#[derive(Debug, Clone)]
pub struct SignalMetrics {
    /// Failed scrapes of a replica's `/metrics`, by kind.
    pub scrape_errors: IntCounterVec,
    /// Restarts seen in a replica's scrapes (a cumulative counter went down).
    pub restarts: IntCounterVec,
    /// Requests the replica last reported, by `state` (`running`, `waiting`).
    pub scraped_requests: GaugeVec,
    /// The share of its KV cache the replica last reported in use (0..1).
    pub scraped_kv_usage: GaugeVec,
    /// Picks that fell back to local counts because scraped load was missing or stale.
    pub stale_fallbacks: IntCounterVec,
    /// Failed active health checks, by kind.
    pub health_check_failures: IntCounterVec,
    /// 1 while active health checks hold a replica up, 0 while down.
    pub health_up: IntGaugeVec,
    /// Outlier ejections per replica.
    pub ejections: IntCounterVec,
    /// Rates learned from each replica's timing histograms.
    pub learned_prefill_rate: GaugeVec,
    pub learned_prefill_seconds: GaugeVec,
    pub learned_decode_step: GaugeVec,
    pub learned_output_tokens: GaugeVec,
}

impl SignalMetrics {
    pub fn register(registry: &Registry) -> SignalMetrics {
        let family = Family::new(registry);
        let scrape_errors = family.counter(
            "llmlb_scrape_errors_total",
            "Failed scrapes of a replica's metrics endpoint, by kind.",
            &["pool", "replica", "kind"],
        );
        let restarts = family.counter(
            "llmlb_replica_restarts_total",
            "Replica restarts seen in scrapes (its prefix-cache counter went down); llmlb forgets what it held.",
            &["pool", "replica"],
        );
        let stale_fallbacks = family.counter(
            "llmlb_stale_metrics_fallbacks_total",
            "Balancer picks that compared local counts because scraped load was missing or stale.",
            &["pool"],
        );
        let health_check_failures = family.counter(
            "llmlb_health_check_failures_total",
            "Failed active health checks, by kind.",
            &["pool", "replica", "kind"],
        );
        let ejections = family.counter(
            "llmlb_outlier_ejections_total",
            "Replicas ejected after consecutive failures.",
            &["pool", "replica"],
        );
        let scraped_requests = family.float_gauge(
            "llmlb_replica_scraped_requests",
            "Requests a replica last reported, by state (running, waiting).",
            &["pool", "replica", "state"],
        );
        let gauge = |name: &str, help: &str| family.float_gauge(name, help, &["pool", "replica"]);
        let scraped_kv_usage = gauge(
            "llmlb_replica_scraped_kv_usage_ratio",
            "Share of its KV cache a replica last reported in use (0 to 1).",
        );
        let learned_prefill_rate = gauge(
            "llmlb_replica_prefill_tokens_per_second",
            "Prompt tokens per second a replica prefills, learned from its timing histograms.",
        );
        let learned_prefill_seconds = gauge(
            "llmlb_replica_prefill_seconds_per_request",
            "Seconds a request spends in prefill on a replica, learned from its timing histograms.",
        );
        let learned_decode_step = gauge(
            "llmlb_replica_decode_step_seconds",
            "Seconds per decode step on a replica, learned from its inter-token latency histogram.",
        );
        let learned_output_tokens = gauge(
            "llmlb_replica_output_tokens_per_request",
            "Output tokens of a finished request on a replica, on average, learned from its generation-tokens histogram.",
        );
        let health_up = family.gauge(
            "llmlb_replica_health_up",
            "1 while active health checks hold a replica up, 0 while down.",
            &["pool", "replica"],
        );
        SignalMetrics {
            scrape_errors,
            restarts,
            scraped_requests,
            scraped_kv_usage,
            stale_fallbacks,
            health_check_failures,
            health_up,
            ejections,
            learned_prefill_rate,
            learned_prefill_seconds,
            learned_decode_step,
            learned_output_tokens,
        }
    }
}

//! Routing metrics: decisions by branch, and per-version request counts,
//! errors and latency so an operator can compare a canary with the rest.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus::{HistogramVec, IntCounterVec, Registry};

use super::RouteBranch;
use crate::telemetry::Family;

const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
];

#[derive(Debug, Clone)]
pub struct RoutingMetrics {
    /// Routing steps that acted, by pool and branch.
    pub decisions: IntCounterVec,
    /// Requests whose cached prefix could not be predicted, by pool and reason.
    pub unpredictable: IntCounterVec,
    /// Requests by pool, version and final status.
    pub version_requests: IntCounterVec,
    /// Requests that ended in an error (5xx, llmlb's own 502/503/504, or a
    /// stream cut short by the replica), by pool and version.
    pub version_errors: IntCounterVec,
    /// Arrival to end of response, by pool and version.
    pub version_duration: HistogramVec,
}

impl RoutingMetrics {
    pub fn new(registry: &Registry) -> RoutingMetrics {
        let family = Family::new(registry);
        let decisions = family.counter(
            "llmlb_routing_decisions_total",
            "Routing steps that acted, by pool and branch.",
            &["pool", "branch"],
        );
        let unpredictable = family.counter(
            "llmlb_prefix_unpredictable_total",
            "Requests in a prefix-routed pool whose cached prefix llmlb cannot predict exactly (routed by load), by pool and reason.",
            &["pool", "reason"],
        );
        let version_requests = family.counter(
            "llmlb_version_requests_total",
            "Requests by pool, replica version and status.",
            &["pool", "version", "status"],
        );
        let version_errors = family.counter(
            "llmlb_version_errors_total",
            "Requests that failed (5xx from a replica or from llmlb), by pool and version.",
            &["pool", "version"],
        );
        let version_duration = family.histogram(
            "llmlb_version_request_duration_seconds",
            "Request latency to the end of the response, by pool and version.",
            &["pool", "version"],
            LATENCY_BUCKETS,
        );
        RoutingMetrics {
            decisions,
            unpredictable,
            version_requests,
            version_errors,
            version_duration,
        }
    }

    /// Counts a request whose prefix could not be predicted.
    pub fn record_unpredictable(&self, pool: &str, reason: crate::tokenize::Unpredictable) {
        self.unpredictable
            .with_label_values(&[pool, reason.as_str()])
            .inc();
    }

    pub fn record_branches(&self, pool: &str, branches: &[RouteBranch]) {
        for b in branches {
            self.decisions.with_label_values(&[pool, b.as_str()]).inc();
        }
    }

    /// Records one finished request of `version` under its status
    /// `label` (the same as `llmlb_requests_total`'s); `error`: it failed
    /// on llmlb's or the replica's side.
    pub fn record_version(
        &self,
        pool: &str,
        version: &str,
        label: &str,
        error: bool,
        duration_secs: f64,
    ) {
        self.version_requests
            .with_label_values(&[pool, version, label])
            .inc();
        if error {
            self.version_errors
                .with_label_values(&[pool, version])
                .inc();
        }
        self.version_duration
            .with_label_values(&[pool, version])
            .observe(duration_secs);
    }
}

/// Set when the replica's stream broke midway (an error or the idle
/// timeout after the headers were sent). Travels in the response's
/// extensions so the records around the body (canary versions) see it.
#[derive(Debug, Clone, Default)]
pub struct StreamBroken(Arc<AtomicBool>);

impl StreamBroken {
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    pub(crate) fn set(&self) {
        self.0.store(true, Ordering::Release);
    }
}

//! llmlb's own metrics, registered in one private registry and served as
//! Prometheus text on the admin listener.

use prometheus::{Encoder, HistogramVec, IntCounterVec, IntGaugeVec, Registry, TextEncoder};

use super::Family;

/// Latency buckets in seconds, from sub-millisecond proxy work to long generations.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0,
];

#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    /// Finished requests by pool, replica and status label (every request).
    pub requests: IntCounterVec,
    /// Time from request arrival to the end of the response body.
    pub request_duration: HistogramVec,
    /// Time from request arrival to the first body byte of a replica's answer.
    pub time_to_first_byte: HistogramVec,
    /// Requests in flight per replica.
    pub in_flight: IntGaugeVec,
    /// Failures talking to a replica, by kind (`connect`, `timeout`, `stream`, ...).
    pub upstream_errors: IntCounterVec,
    /// Re-sends to another replica.
    pub retries: IntCounterVec,
    /// Requests answered by llmlb itself with an error, by reason.
    pub rejections: IntCounterVec,
    /// Balancer decisions by pool and branch.
    pub decisions: IntCounterVec,
    /// 1 while a replica is set aside by passive health.
    pub replica_down: IntGaugeVec,
    /// Prefixes kept warm on two or more replicas on purpose, by pool.
    pub prefix_replicated: IntGaugeVec,
    /// Their copies beyond the first, summed, by pool.
    pub prefix_extra_copies: IntGaugeVec,
    /// Requests for a LoRA adapter sent where it was not loaded and no
    /// adapter slot was free, by pool and replica.
    pub lora_swaps: IntCounterVec,
    /// 1 per configured (or discovered) replica, with its address: joins
    /// the `replica` label of every other metric to where it points.
    pub replica_info: IntGaugeVec,
    /// Load signals and health.
    pub signals: super::SignalMetrics,
    /// Per-model TTFT, requests and tokens; build info.
    pub models: super::ModelMetrics,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let family = Family::new(&registry);
        let requests = family.counter(
            "llmlb_requests_total",
            "Requests finished, by pool, replica and status: every request once (replica empty when none was tried, pool empty before one was known; status stream_error for a broken stream, 499 for a client that left).",
            &["pool", "replica", "status"],
        );
        let request_duration = family.histogram(
            "llmlb_request_duration_seconds",
            "End-to-end request latency seen by llmlb, to the last response byte (every request).",
            &["pool"],
            LATENCY_BUCKETS,
        );
        let time_to_first_byte = family.histogram(
            "llmlb_time_to_first_byte_seconds",
            "Time from request arrival to the first body byte of a replica's answer (every answer a replica sent a byte of, streamed or not).",
            &["pool"],
            LATENCY_BUCKETS,
        );
        let in_flight = family.gauge(
            "llmlb_replica_in_flight",
            "Requests in flight per replica.",
            &["pool", "replica"],
        );
        let upstream_errors = family.counter(
            "llmlb_upstream_errors_total",
            "Failures talking to a replica, by kind.",
            &["pool", "replica", "kind"],
        );
        let retries = family.counter(
            "llmlb_retries_total",
            "Re-sends to another replica after a connection could not be made (each re-send once).",
            &["pool"],
        );
        let rejections = family.counter(
            "llmlb_rejections_total",
            "Requests answered by llmlb itself with an error, by reason.",
            &["reason"],
        );
        let decisions = family.counter(
            "llmlb_balancer_decisions_total",
            "Balancer decisions by pool and branch.",
            &["pool", "branch"],
        );
        let replica_down = family.gauge(
            "llmlb_replica_down",
            "1 while a replica receives no new work (ejected or failing health checks).",
            &["pool", "replica"],
        );
        let prefix_replicated = family.gauge("llmlb_prefix_replicated", "Prefixes kept warm on two or more replicas because one replica cannot carry their demand, by pool.", &["pool"]);
        let prefix_extra_copies = family.gauge(
            "llmlb_prefix_extra_copies",
            "Copies of replicated prefixes beyond the first, summed, by pool.",
            &["pool"],
        );
        let lora_swaps = family.counter(
            "llmlb_lora_swaps_total",
            "Requests for a LoRA adapter sent to a replica that had not loaded it and had no free adapter slot (a swap), by pool and replica.",
            &["pool", "replica"],
        );
        let replica_info = family.gauge(
            "llmlb_replica_info",
            "1 for each replica in the running config, with its URL.",
            &["pool", "replica", "url"],
        );
        let signals = super::SignalMetrics::register(&registry);
        let models = super::ModelMetrics::register(&registry);
        Metrics {
            signals,
            models,
            registry,
            requests,
            request_duration,
            time_to_first_byte,
            in_flight,
            upstream_errors,
            retries,
            rejections,
            decisions,
            replica_down,
            prefix_replicated,
            prefix_extra_copies,
            lora_swaps,
            replica_info,
        }
    }

    /// Replaces the replica info series with `replicas` (pool, name, URL):
    /// called before each render, so replicas a reload removed disappear.
    pub fn set_replicas<'a>(&self, replicas: impl Iterator<Item = (&'a str, &'a str, String)>) {
        self.replica_info.reset();
        for (pool, name, url) in replicas {
            self.replica_info
                .with_label_values(&[pool, name, &url])
                .set(1);
        }
    }

    /// The registry, for modules that add their own metrics.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Everything in Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding into a Vec cannot fail");
        String::from_utf8(buf).expect("prometheus text is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

//! One replica's metric series, looked up by label once instead of on every
//! request: `with_label_values` hashes its labels and takes the metric
//! vector's lock each time, so the handles a finished request touches (its
//! `llmlb_requests_total{status="200"}` counter, the pool's duration and
//! time-to-first-byte histograms) are resolved the first time each is
//! needed and kept with the replica (`Replica::series` in `balancing`).
//!
//! A series still appears in `/metrics` only once something was counted in
//! it, as before. Statuses other than 200 keep the lookup by label (they
//! are rare, and their set is open).

use std::sync::{Arc, OnceLock};

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec};

use super::Metrics;

#[derive(Debug)]
pub struct ReplicaSeries {
    /// The pool's name, shared by every record that names it.
    pub pool: Arc<str>,
    /// The replica's name, shared likewise.
    pub replica: Arc<str>,
    requests: IntCounterVec,
    request_duration: HistogramVec,
    time_to_first_byte: HistogramVec,
    ok: OnceLock<IntCounter>,
    duration: OnceLock<Histogram>,
    first_byte: OnceLock<Histogram>,
}

impl ReplicaSeries {
    pub fn new(metrics: &Metrics, pool: &str, replica: &str) -> ReplicaSeries {
        ReplicaSeries {
            pool: Arc::from(pool),
            replica: Arc::from(replica),
            requests: metrics.requests.clone(),
            request_duration: metrics.request_duration.clone(),
            time_to_first_byte: metrics.time_to_first_byte.clone(),
            ok: OnceLock::new(),
            duration: OnceLock::new(),
            first_byte: OnceLock::new(),
        }
    }

    /// Counts a finished request by its status label (`200`, `499`,
    /// `stream_error`, ...).
    pub fn finished(&self, label: &str) {
        if label == "200" {
            self.ok
                .get_or_init(|| {
                    self.requests
                        .with_label_values(&[&*self.pool, &self.replica, "200"])
                })
                .inc();
        } else {
            self.requests
                .with_label_values(&[&*self.pool, &self.replica, label])
                .inc();
        }
    }

    /// `llmlb_request_duration_seconds{pool}`.
    pub fn duration(&self) -> &Histogram {
        self.duration
            .get_or_init(|| self.request_duration.with_label_values(&[&*self.pool]))
    }

    /// `llmlb_time_to_first_byte_seconds{pool}`.
    pub fn first_byte(&self) -> &Histogram {
        self.first_byte
            .get_or_init(|| self.time_to_first_byte.with_label_values(&[&*self.pool]))
    }
}

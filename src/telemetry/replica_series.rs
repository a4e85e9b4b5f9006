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

use std::sync::{Arc, Mutex, OnceLock};

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec};

use super::Metrics;
use super::model_metrics::ModelSeries;

/// Models whose series one replica keeps; a request for another model
/// looks its series up by label.
const KEPT_MODELS: usize = 32;

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
    /// The per-model series of requests this replica answered.
    models: Mutex<Vec<Arc<ModelSeries>>>,
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
            models: Mutex::default(),
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

    /// `model`'s per-model series (`llmlb_model_*`), streamed or not: kept
    /// for the first [`KEPT_MODELS`] models, made afresh for others.
    pub fn model(&self, model: &str, stream: bool) -> Arc<ModelSeries> {
        let mut kept = self.models.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = kept.iter().find(|s| s.is(model, stream)) {
            return Arc::clone(s);
        }
        let series = Arc::new(ModelSeries::new(model, stream));
        if kept.len() < KEPT_MODELS {
            kept.push(Arc::clone(&series));
        }
        series
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

//! Metrics of llmlb's KV-event subscribers: sequence gaps seen, replays
//! asked and how they ended, stores a record had no room for, and per pool
//! how many replicas' records are unknown (events missed and not refilled
//! yet, or never subscribed).
//!
//! [`CountingSink`] wraps a subscriber's sink and counts what the
//! subscriber tells it; the unknown-records gauge is set by whoever can see
//! the records (the background supervisor, each tick).

use std::sync::Arc;

use prometheus::{IntCounter, IntCounterVec, IntGaugeVec, Registry};

use crate::telemetry::Family;

use super::subscriber::EventSink;
use super::wire::EventBatch;

#[derive(Debug, Clone)]
pub struct KvEventMetrics {
    /// `llmlb_kv_events_gaps_total{pool,replica}`.
    pub gaps: IntCounterVec,
    /// `llmlb_kv_events_missed_total{pool,replica}`: events in those gaps.
    pub missed: IntCounterVec,
    /// `llmlb_kv_events_replays_total{pool,replica,outcome}`.
    pub replays: IntCounterVec,
    /// `llmlb_kv_events_stores_dropped_total{pool,replica}`.
    pub dropped: IntCounterVec,
    /// `llmlb_kv_events_unknown_replicas{pool}`.
    pub unknown: IntGaugeVec,
}

impl KvEventMetrics {
    pub fn register(registry: &Registry) -> KvEventMetrics {
        let family = Family::new(registry);
        let labels = ["pool", "replica"];
        let gaps = family.counter("llmlb_kv_events_gaps_total", "Jumps in a replica's KV-event sequence numbers (a reconnect, a late start, a slow subscriber).", &labels);
        let missed = family.counter(
            "llmlb_kv_events_missed_total",
            "KV-event messages that did not arrive live (the sum of the gaps' lengths).",
            &labels,
        );
        let replays = family.counter("llmlb_kv_events_replays_total", "Replays asked from a replica's replay endpoint, by outcome (complete, incomplete, failed, timeout).", &["pool", "replica", "outcome"]);
        let dropped = family.counter("llmlb_kv_events_stores_dropped_total", "Blocks a replica reported storing that llmlb's record of it had no room for (it keeps at most the replica's KV capacity); a steady rise means removals are being missed.", &labels);
        let unknown = family.gauge("llmlb_kv_events_unknown_replicas", "Replicas of the pool whose record of cached blocks is unknown (scored from llmlb's estimate).", &["pool"]);
        KvEventMetrics {
            gaps,
            missed,
            replays,
            dropped,
            unknown,
        }
    }

    /// `inner`, counting into this pool's and replica's series.
    pub fn counting(
        &self,
        pool: &str,
        replica: &str,
        inner: Arc<dyn EventSink>,
    ) -> Arc<dyn EventSink> {
        Arc::new(CountingSink {
            inner,
            gaps: self.gaps.with_label_values(&[pool, replica]),
            missed: self.missed.with_label_values(&[pool, replica]),
            dropped: self.dropped.with_label_values(&[pool, replica]),
            replays: self.replays.clone(),
            labels: [pool.to_string(), replica.to_string()],
        })
    }
}

/// A sink that counts gaps, replays and dropped stores, then passes
/// everything on.
struct CountingSink {
    inner: Arc<dyn EventSink>,
    gaps: IntCounter,
    missed: IntCounter,
    dropped: IntCounter,
    replays: IntCounterVec,
    labels: [String; 2],
}

impl EventSink for CountingSink {
    fn subscribed(&self) {
        self.inner.subscribed();
    }

    fn apply(&self, batch: &EventBatch) -> u64 {
        let dropped = self.inner.apply(batch);
        if dropped > 0 {
            self.dropped.inc_by(dropped);
        }
        dropped
    }

    fn restarted(&self) {
        self.inner.restarted();
    }

    fn lost(&self) {
        self.inner.lost();
    }

    fn caught_up(&self) {
        self.inner.caught_up();
    }

    fn gap_seen(&self, missed: u64) {
        self.gaps.inc();
        self.missed.inc_by(missed);
        self.inner.gap_seen(missed);
    }

    fn replay_done(&self, outcome: &'static str) {
        let [pool, replica] = &self.labels;
        self.replays
            .with_label_values(&[pool, replica, outcome])
            .inc();
        self.inner.replay_done(outcome);
    }
}

//! The fleet store's metrics, registered once per process.

use prometheus::{Histogram, IntCounter, IntGauge, IntGaugeVec, Registry};

use crate::telemetry::Family;

#[derive(Debug, Clone)]
pub struct FleetMetrics {
    /// 1 while the last call to the store succeeded.
    pub up: IntGauge,
    /// Live instances the last refresh counted.
    pub instances: IntGauge,
    /// Store calls that failed or timed out.
    pub errors: IntCounter,
    /// Times this instance fell back to its share of each replica's limit.
    pub fallbacks: IntCounter,
    /// Times the pool queues fell back to this instance's own order.
    pub queue_local: IntCounter,
    /// 1 while the fallback is in force.
    pub in_fallback: IntGauge,
    /// Refreshes that began by giving slots back (waiters held back here).
    pub released: IntCounter,
    /// Refreshes made at once because another instance gave slots back.
    pub wakes: IntCounter,
    /// Round trip of one refresh (registration and every lease).
    pub refresh_seconds: Histogram,
    /// The slot cap in force on each replica (`max_inflight` shared by the fleet).
    pub slots: IntGaugeVec,
    /// Dispatch records of other instances folded into this one's prefix view.
    pub prefix_records: IntCounter,
    /// Dispatch records of this instance not published (outbox full or store down).
    pub prefix_dropped: IntCounter,
}

impl FleetMetrics {
    pub fn new(registry: &Registry) -> FleetMetrics {
        let f = Family::new(registry);
        FleetMetrics {
            up: f.gauge_one(
                "llmlb_fleet_store_up",
                "1 while the fleet store answers (only with [fleet]).",
            ),
            instances: f.gauge_one(
                "llmlb_fleet_instances",
                "Live llmlb instances the last fleet refresh counted.",
            ),
            errors: f.counter_one(
                "llmlb_fleet_store_errors_total",
                "Fleet store calls that failed or took longer than fleet.timeout.",
            ),
            fallbacks: f.counter_one(
                "llmlb_fleet_fallbacks_total",
                "Times this instance fell back to its share of each replica's max_inflight because the store stopped answering.",
            ),
            queue_local: f.counter_one(
                "llmlb_fleet_queue_order_fallbacks_total",
                "Times this instance's pool queues fell back to ordering only its own waiters because the fleet store stopped answering.",
            ),
            in_fallback: f.gauge_one(
                "llmlb_fleet_fallback",
                "1 while this instance uses its fallback share instead of leases from the store.",
            ),
            released: f.counter_one(
                "llmlb_fleet_slot_releases_total",
                "Refreshes that gave slots back first, because this instance's waiters wait for another instance's.",
            ),
            wakes: f.counter_one(
                "llmlb_fleet_wakes_total",
                "Refreshes made at once because another instance gave slots back for this instance's waiters (the store's wake channel).",
            ),
            refresh_seconds: f
                .histogram(
                    "llmlb_fleet_refresh_seconds",
                    "Round trip of one fleet refresh (heartbeat and slot leases).",
                    &[],
                    &[0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1],
                )
                .with_label_values(&[] as &[&str]),
            slots: f.gauge(
                "llmlb_fleet_replica_slots",
                "Requests this instance may run at once on the replica (its lease of max_inflight).",
                &["pool", "replica"],
            ),
            prefix_records: f.counter_one(
                "llmlb_fleet_prefix_records_total",
                "Dispatch records of other instances folded into this instance's prefix view.",
            ),
            prefix_dropped: f.counter_one(
                "llmlb_fleet_prefix_records_dropped_total",
                "Dispatch records of this instance not published to the fleet (outbox full or store unavailable).",
            ),
        }
    }
}

//! Gauges of replicas and pools that left the topology. A gauge keeps its
//! last value until its series is removed, so a replica dropped by a reload
//! or by discovery would go on reporting itself in flight, down or scraped
//! forever. Each tick the supervisor hands the topology in force to
//! [`Series::forget_gone`], which removes the per-replica and per-pool gauge
//! series of everything that was there on the last tick and is not now.
//! Counters stay: their totals remain true for the time the replica served.
//!
//! Cost: one pass over the pools and replicas per tick (every 500 ms), a
//! hash lookup each.

use std::collections::HashSet;

use crate::kv_events::metrics::KvEventMetrics;
use crate::pool::Topology;
use crate::telemetry::Metrics;

/// The pools and replicas seen on the last tick.
#[derive(Debug, Default)]
pub struct Series {
    replicas: HashSet<(String, String)>,
    /// Replicas forgotten on the last tick: forgotten once more, in case a
    /// scrape that was under way when its loop was stopped wrote a gauge
    /// again.
    leftovers: HashSet<(String, String)>,
    /// Pools that had KV-event subscriptions (and so an unknown-replicas gauge).
    subscribed: HashSet<String>,
    /// Pools that replicate hot prefixes (and so have their gauges).
    replicating: HashSet<String>,
}

impl Series {
    /// Removes the gauge series of pools and replicas gone since the last
    /// call, and remembers what is there now.
    pub fn forget_gone(&mut self, topo: &Topology, metrics: &Metrics, kv_metrics: &KvEventMetrics) {
        let mut now = Series::default();
        for pool in topo.pools() {
            if !pool.router.kv_subscriptions().is_empty() {
                now.subscribed.insert(pool.name.clone());
            }
            if pool.router.replication().is_some() {
                now.replicating.insert(pool.name.clone());
            }
            for r in &pool.replicas {
                now.replicas.insert((pool.name.clone(), r.name.clone()));
            }
        }
        for pool in self.subscribed.difference(&now.subscribed) {
            let _ = kv_metrics.unknown.remove_label_values(&[pool]);
        }
        for pool in self.replicating.difference(&now.replicating) {
            let _ = metrics.prefix_replicated.remove_label_values(&[pool]);
            let _ = metrics.prefix_extra_copies.remove_label_values(&[pool]);
        }
        let gone: HashSet<(String, String)> =
            self.replicas.difference(&now.replicas).cloned().collect();
        for (pool, replica) in gone.iter().chain(self.leftovers.difference(&now.replicas)) {
            forget_replica(metrics, pool, replica);
        }
        now.leftovers = gone;
        *self = now;
    }
}

/// Removes one replica's gauge series (absent ones are skipped).
fn forget_replica(metrics: &Metrics, pool: &str, replica: &str) {
    let labels = [pool, replica];
    let _ = metrics.in_flight.remove_label_values(&labels);
    let _ = metrics.replica_down.remove_label_values(&labels);
    let s = &metrics.signals;
    let _ = s.health_up.remove_label_values(&labels);
    for gauge in [
        &s.scraped_kv_usage,
        &s.learned_prefill_rate,
        &s.learned_prefill_seconds,
        &s.learned_decode_step,
        &s.learned_output_tokens,
    ] {
        let _ = gauge.remove_label_values(&labels);
    }
    for state in ["running", "waiting"] {
        let _ = s
            .scraped_requests
            .remove_label_values(&[pool, replica, state]);
    }
}

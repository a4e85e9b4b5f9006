//! Background loops: one scrape loop, one health-check loop and (in `exact`
//! prefix mode) one KV-event subscriber per replica that needs them, kept in
//! step with the live topology.
//!
//! [`supervise`] is started by the daemon with a handle on the live topology,
//! the metrics and its shutdown signal (never from a constructor). When the
//! topology was swapped since its last tick it compares the loops that run
//! with the loops the new topology asks for (a reload may add or remove
//! replicas or change a pool's settings), stops the extra ones, starts the
//! missing ones and removes the gauges of replicas that left ([`series`]);
//! every tick it refreshes the per-replica eligibility gauge. On shutdown it stops every
//! loop and waits for them.

pub mod fleet;
mod series;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::health::checker::{self, CheckTarget};
use crate::kv_events::metrics::KvEventMetrics;
use crate::kv_events::subscriber::{self, EventSink};
use crate::net::stopped;
use crate::pool::Topology;
use crate::replica::ReplicaId;
use crate::signals::scraper::{self, ScrapeTarget};
use crate::telemetry::Metrics;

/// How often the supervisor reconciles loops with the topology.
const TICK: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Kind {
    Scrape,
    Health,
    KvEvents,
}

struct Loop {
    /// The settings it runs with, to notice a reload that changed them.
    fingerprint: String,
    stop: watch::Sender<bool>,
    handle: JoinHandle<()>,
}

type Key = (Kind, String, ReplicaId);

/// Starts a loop given its stop signal.
type Starter = Box<dyn FnOnce(watch::Receiver<bool>) -> JoinHandle<()>>;

/// Runs the per-replica loops until `shutdown` turns true; `topology` gives
/// the topology in force now (a reload swaps it).
pub async fn supervise(
    topology: impl Fn() -> Arc<Topology>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) {
    // The subscribers' own metrics, declared on the daemon's registry.
    let kv_metrics = KvEventMetrics::register(metrics.registry());
    let mut loops: HashMap<Key, Loop> = HashMap::new();
    let mut series = series::Series::default();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The topology last reconciled and whether the tick before changed it:
    // a topology is not changed in place (a reload or a discovery swaps in
    // a new one), so the loops and the gone replicas' series are looked at
    // when it is swapped, and once more the tick after (a loop stopped at
    // the swap may still have written a gone replica's series).
    let mut last: Option<Arc<Topology>> = None;
    let mut swapped = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stopped(&mut shutdown) => break,
        }
        let topo = topology();
        let swap = !last.as_ref().is_some_and(|t| Arc::ptr_eq(t, &topo));
        if swap {
            reconcile(&topo, &mut loops, &metrics, &kv_metrics);
        }
        refresh_gauges(&topo, &metrics, &kv_metrics);
        if swap || swapped {
            series.forget_gone(&topo, &metrics, &kv_metrics);
        }
        swapped = swap;
        last = Some(topo);
    }
    for (_, l) in loops.drain() {
        let _ = l.stop.send(true);
        let _ = l.handle.await;
    }
}

fn reconcile(
    topo: &Topology,
    loops: &mut HashMap<Key, Loop>,
    metrics: &Arc<Metrics>,
    kv_metrics: &KvEventMetrics,
) {
    let mut wanted: HashMap<Key, (String, Starter)> = HashMap::new();
    for pool in topo.pools() {
        let pool_name: Arc<str> = Arc::from(pool.name.as_str());
        // A loop keeps the prober it started with: restart it when the
        // pool's TLS settings change.
        let prober = &pool.prober;
        let tls = pool.tls.fingerprint();
        for replica in &pool.replicas {
            if let Some(scrape) = &pool.scrape {
                let target = ScrapeTarget {
                    pool: Arc::clone(&pool_name),
                    replica: Arc::clone(replica),
                    config: scrape.clone(),
                    names: crate::signals::MetricNames::from_config(scrape),
                };
                let (p, m) = (prober.clone(), Arc::clone(metrics));
                wanted.insert(
                    (Kind::Scrape, pool.name.clone(), replica.id),
                    (
                        format!("{scrape:?} tls={tls}"),
                        Box::new(move |rx| tokio::spawn(scraper::run(target, p, m, rx))),
                    ),
                );
            }
            if pool.health.enabled {
                let target = CheckTarget {
                    pool: Arc::clone(&pool_name),
                    replica: Arc::clone(replica),
                    config: pool.health.clone(),
                };
                let (p, m) = (prober.clone(), Arc::clone(metrics));
                wanted.insert(
                    (Kind::Health, pool.name.clone(), replica.id),
                    (
                        format!("{:?} tls={tls}", pool.health),
                        Box::new(move |rx| tokio::spawn(checker::run(target, p, m, rx))),
                    ),
                );
            }
        }
        // A subscriber writes into the record the router reads; a reload that
        // replaces the record (or the endpoints) restarts the subscriber.
        for (id, endpoints, held) in pool.router.kv_subscriptions() {
            let fingerprint = format!("{endpoints:?} {:p}", Arc::as_ptr(&held));
            let name = pool
                .replicas
                .iter()
                .find(|r| r.id == id)
                .map_or("", |r| &r.name);
            let sink: Arc<dyn EventSink> = kv_metrics.counting(&pool.name, name, held);
            wanted.insert(
                (Kind::KvEvents, pool.name.clone(), id),
                (
                    fingerprint,
                    Box::new(move |rx| tokio::spawn(subscriber::run(endpoints, sink, rx))),
                ),
            );
        }
    }
    loops.retain(|key, l| {
        let keep = wanted.get(key).is_some_and(|(fp, _)| *fp == l.fingerprint);
        if !keep {
            let _ = l.stop.send(true);
        }
        keep
    });
    for (key, (fingerprint, start)) in wanted {
        if loops.contains_key(&key) {
            continue;
        }
        let (stop, rx) = watch::channel(false);
        let handle = start(rx);
        loops.insert(
            key,
            Loop {
                fingerprint,
                stop,
                handle,
            },
        );
    }
}

fn refresh_gauges(topo: &Topology, metrics: &Metrics, kv_metrics: &KvEventMetrics) {
    let now = crate::telemetry::clock::now_millis();
    for pool in topo.pools() {
        let subscriptions = pool.router.kv_subscriptions();
        if !subscriptions.is_empty() {
            let unknown = subscriptions.iter().filter(|(_, _, h)| !h.known()).count();
            kv_metrics
                .unknown
                .with_label_values(&[&pool.name])
                .set(unknown as i64);
        }
        if let Some(r) = pool.router.replication() {
            let labels = [pool.name.as_str()];
            metrics
                .prefix_replicated
                .with_label_values(&labels)
                .set(r.prefixes as i64);
            metrics
                .prefix_extra_copies
                .with_label_values(&labels)
                .set(r.extra_copies as i64);
        }
        for r in &pool.replicas {
            metrics
                .replica_down
                .with_label_values(&[&pool.name, &r.name])
                .set(i64::from(!r.is_eligible_at(now)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::test_fleet::{hold_hot_prompt, pool_of};

    #[test]
    fn replicated_prefixes_are_exported_per_pool_and_forgotten_with_it() {
        let topo = pool_of(
            "[pools.prefix]\nmode = \"cache\"\nreplicate = true\nreplicate_above = 2",
            4,
        );
        let metrics = Metrics::new();
        let kv = KvEventMetrics::register(metrics.registry());
        refresh_gauges(&topo, &metrics, &kv);
        assert!(
            metrics
                .render()
                .contains("llmlb_prefix_replicated{pool=\"p\"} 0")
        );
        // One system prompt, 40 requests held: 3 copies (see routing::cache).
        let _held = hold_hot_prompt(&topo.pools()[0], 40);
        refresh_gauges(&topo, &metrics, &kv);
        let text = metrics.render();
        assert!(
            text.contains("llmlb_prefix_replicated{pool=\"p\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("llmlb_prefix_extra_copies{pool=\"p\"} 2"),
            "{text}"
        );
        // A reload that turns replication off takes the pool's series away.
        let mut series = series::Series::default();
        series.forget_gone(&topo, &metrics, &kv);
        series.forget_gone(&pool_of("", 4), &metrics, &kv);
        let text = metrics.render();
        assert!(!text.contains("llmlb_prefix_replicated{"), "{text}");
        assert!(!text.contains("llmlb_prefix_extra_copies{"), "{text}");
    }
}

//! Replica discovery by DNS: a pool with `discovery = { dns, port, interval }`
//! gets its replicas from the name's A/AAAA records (one per ready pod of a
//! Kubernetes headless Service), re-resolved every `interval`.
//!
//! A change goes through the same path as a config reload: the topology is
//! rebuilt with the new replica list, replicas that stay keep their state
//! (in-flight counts, health, load, prefix index), removed ones receive no new
//! work and finish their streams. A failed resolution keeps the last known
//! replicas (DNS trouble never empties a pool) and is counted.

pub mod names;
pub mod resolve;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::{IntCounterVec, IntGaugeVec, Registry};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::net::sleep_or_stop;

use crate::config::{Config, DiscoveryConfig, ReplicaConfig, ReplicaNames};
use names::Named;

/// How often the loop looks for pools due for resolution.
const TICK: Duration = Duration::from_millis(100);

#[derive(Debug, Clone)]
pub struct DiscoveryMetrics {
    /// Replicas currently discovered per pool.
    pub replicas: IntGaugeVec,
    /// Failed resolutions per pool (the last known replicas stay).
    pub errors: IntCounterVec,
    /// Changes of a pool's replica set applied.
    pub updates: IntCounterVec,
}

impl DiscoveryMetrics {
    pub fn new(registry: &Registry) -> DiscoveryMetrics {
        let family = crate::telemetry::Family::new(registry);
        let replicas = family.gauge(
            "llmlb_discovery_replicas",
            "Replicas discovered by DNS per pool.",
            &["pool"],
        );
        let errors = family.counter(
            "llmlb_discovery_errors_total",
            "Failed DNS resolutions per pool (the last known replicas stay).",
            &["pool"],
        );
        let updates = family.counter(
            "llmlb_discovery_updates_total",
            "Changes of a pool's discovered replica set.",
            &["pool"],
        );
        DiscoveryMetrics {
            replicas,
            errors,
            updates,
        }
    }
}

/// The last resolved addresses per pool, each with its name when one was
/// found ([`names`]). Touched by the discovery loop and by reloads, never on
/// the request path.
#[derive(Debug, Default)]
pub struct Discovered(Mutex<HashMap<String, Vec<Named>>>);

impl Discovered {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Named>>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records `replicas` for `pool`; true when they differ from what was known.
    pub fn set(&self, pool: &str, replicas: Vec<Named>) -> bool {
        let mut map = self.lock();
        if map.get(pool) == Some(&replicas) {
            return false;
        }
        map.insert(pool.to_string(), replicas);
        true
    }

    /// The name last given to `addr` in `pool`, if the address is known.
    fn known_name(&self, pool: &str, addr: SocketAddr) -> Option<Option<String>> {
        self.lock()
            .get(pool)?
            .iter()
            .find(|(a, _)| *a == addr)
            .map(|(_, n)| n.clone())
    }

    /// `config` with each discovery pool's replicas filled in from the last
    /// resolution (none yet: an empty pool, which answers 503).
    pub fn effective(&self, config: &Config) -> Config {
        let map = self.lock();
        let mut out = config.clone();
        for pool in out.pools.iter_mut() {
            let Some(discovery) = &pool.discovery else {
                continue;
            };
            let tcp = |a: &SocketAddr, port: Option<u16>| {
                port.map(|p| format!("tcp://{}", SocketAddr::new(a.ip(), p)))
            };
            pool.replicas = map
                .get(&pool.name)
                .map(|addrs| {
                    addrs
                        .iter()
                        .map(|(a, name)| ReplicaConfig {
                            name: name.clone(),
                            kv_events: tcp(a, discovery.kv_events_port),
                            kv_events_replay: tcp(a, discovery.kv_events_replay_port),
                            ..ReplicaConfig::at(&format!("http://{a}"))
                        })
                        .collect()
                })
                .unwrap_or_default();
        }
        out
    }
}

/// Names `addrs` ([`names`]): known addresses keep their name, new ones are
/// looked up (unless the pool names replicas by address).
async fn name_all(
    discovered: &Discovered,
    pool: &str,
    config: &DiscoveryConfig,
    addrs: Vec<SocketAddr>,
    timeout: Duration,
) -> Vec<Named> {
    let mut named = Vec::with_capacity(addrs.len());
    for addr in addrs {
        let name = match (config.replica_names, discovered.known_name(pool, addr)) {
            (ReplicaNames::Address, _) => None,
            (ReplicaNames::ReverseDns, Some(known)) => known,
            (ReplicaNames::ReverseDns, None) => {
                names::reverse_name(config, addr.ip(), timeout).await
            }
        };
        named.push((addr, name));
    }
    names::unique(&mut named);
    named
}

/// What the discovery loop reads and writes.
pub struct DiscoveryContext<C, R> {
    /// The config in force now.
    pub config: C,
    pub discovered: Arc<Discovered>,
    pub metrics: DiscoveryMetrics,
    /// Rebuilds the topology from the config and the discovered replicas
    /// (the reload path); called after a change.
    pub rebuild: R,
}

/// Resolves every discovery pool when due, until `shutdown` turns true.
pub async fn run<C, R>(ctx: DiscoveryContext<C, R>, mut shutdown: watch::Receiver<bool>)
where
    C: Fn() -> Arc<Config>,
    R: Fn(),
{
    let mut due: HashMap<String, Instant> = HashMap::new();
    let mut next = Instant::now();
    loop {
        if sleep_or_stop(next, &mut shutdown).await {
            return;
        }
        next += TICK;
        let config = (ctx.config)();
        let now = Instant::now();
        let mut changed = false;
        for pool in &config.pools {
            let Some(d) = &pool.discovery else { continue };
            if due.get(&pool.name).is_some_and(|t| *t > now) {
                continue;
            }
            due.insert(pool.name.clone(), now + d.interval);
            let timeout = d.interval.min(Duration::from_secs(5));
            match resolve::resolve(d, timeout).await {
                Ok(addrs) => {
                    ctx.metrics
                        .replicas
                        .with_label_values(&[&pool.name])
                        .set(addrs.len() as i64);
                    let named = name_all(&ctx.discovered, &pool.name, d, addrs, timeout).await;
                    if ctx.discovered.set(&pool.name, named.clone()) {
                        tracing::info!(pool = %pool.name, dns = %d.dns, replicas = ?named, "discovered replicas changed");
                        ctx.metrics.updates.with_label_values(&[&pool.name]).inc();
                        changed = true;
                    }
                }
                Err(e) => {
                    tracing::warn!(pool = %pool.name, error = %e, "discovery failed; keeping the last known replicas");
                    ctx.metrics.errors.with_label_values(&[&pool.name]).inc();
                }
            }
        }
        // Forget pools that left the config.
        due.retain(|name, _| config.pools.iter().any(|p| &p.name == name));
        if changed {
            (ctx.rebuild)();
        }
    }
}

//! The live topology: pools, their replicas and the model → pool index.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::balancing::{self, Balancer, BalancerParams, Replica};
use crate::config::{
    BalancingConfig, Config, HealthConfig, OutlierConfig, PoolConfig, ScrapeConfig, TimeoutConfig,
};
use crate::forwarding::UpstreamClient;
use crate::telemetry::Metrics;

/// A set of interchangeable replicas serving the same models.
#[derive(Debug)]
pub struct Pool {
    pub name: String,
    pub models: Vec<String>,
    pub balancer: Box<dyn Balancer>,
    pub replicas: Vec<Arc<Replica>>,
    pub retries: u32,
    pub timeouts: TimeoutConfig,
    pub outlier: OutlierConfig,
    pub balancing: BalancingConfig,
    /// Scrape settings when the pool's replicas are scraped.
    pub scrape: Option<ScrapeConfig>,
    pub health: HealthConfig,
    /// Whether the last pick fell back to local counts (to log transitions only).
    pub stale_fallback: AtomicBool,
    pub client: UpstreamClient,
}

impl Pool {
    /// Replicas that may receive new work now.
    pub fn eligible(&self) -> Vec<Arc<Replica>> {
        self.replicas
            .iter()
            .filter(|r| r.is_eligible())
            .cloned()
            .collect()
    }

    /// Whether at least one replica is not known to be down.
    pub fn is_ready(&self) -> bool {
        self.replicas.iter().any(|r| r.is_eligible())
    }
}

#[derive(Debug)]
pub struct Topology {
    pub pools: Vec<Arc<Pool>>,
    by_model: HashMap<String, usize>,
}

impl Topology {
    /// Builds the topology for a validated config. Replicas present in
    /// `previous` (same pool name, same address) are carried over with their
    /// in-flight counts and health.
    pub fn build(config: &Config, metrics: &Metrics, previous: Option<&Topology>) -> Topology {
        let mut pools = Vec::with_capacity(config.pools.len());
        let mut by_model = HashMap::new();
        for (i, pc) in config.pools.iter().enumerate() {
            let old = previous.and_then(|t| t.pools.iter().find(|p| p.name == pc.name));
            pools.push(Arc::new(build_pool(pc, metrics, old.map(|p| p.as_ref()))));
            for m in &pc.models {
                by_model.insert(m.clone(), i);
            }
        }
        Topology { pools, by_model }
    }

    /// The pool that serves `model`.
    pub fn pool_for(&self, model: &str) -> Option<&Arc<Pool>> {
        self.by_model.get(model).map(|&i| &self.pools[i])
    }

    /// Every model name served, with its pool, in config order.
    pub fn models(&self) -> impl Iterator<Item = (&str, &Pool)> {
        self.pools
            .iter()
            .flat_map(|p| p.models.iter().map(move |m| (m.as_str(), p.as_ref())))
    }

    /// Ready when every pool has at least one replica not known to be down.
    pub fn is_ready(&self) -> bool {
        !self.pools.is_empty() && self.pools.iter().all(|p| p.is_ready())
    }
}

fn build_pool(pc: &PoolConfig, metrics: &Metrics, old: Option<&Pool>) -> Pool {
    let replicas = pc
        .replicas
        .iter()
        .map(|rc| {
            let authority: http::uri::Authority = rc
                .url
                .parse::<http::Uri>()
                .ok()
                .and_then(|u| u.authority().cloned())
                .expect("replica URL checked by config validation");
            let name = rc.name.clone().unwrap_or_else(|| authority.to_string());
            if let Some(kept) = old.and_then(|p| {
                p.replicas
                    .iter()
                    .find(|r| r.authority == authority && r.weight == rc.weight && r.name == name)
            }) {
                return Arc::clone(kept);
            }
            let gauge = metrics.in_flight.with_label_values(&[&pc.name, &name]);
            Arc::new(Replica::new(name, authority, rc.weight, gauge))
        })
        .collect();
    Pool {
        name: pc.name.clone(),
        models: pc.models.clone(),
        balancer: balancing::build(pc.balancer, BalancerParams::from_pool(pc)),
        replicas,
        retries: pc.retries,
        timeouts: pc.timeouts.clone(),
        outlier: pc.outlier.clone(),
        balancing: pc.balancing.clone(),
        scrape: pc.scrape_enabled().then(|| pc.scrape.clone()),
        health: pc.health.clone(),
        stale_fallback: AtomicBool::new(false),
        client: crate::forwarding::client(&pc.timeouts),
    }
}

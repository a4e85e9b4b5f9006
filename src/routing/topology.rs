//! The live topology: pools, their replicas and the model → pool index.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use crate::admission::{Admission, AdmissionMetrics, Level, PoolQueue, QueueParams};
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
    /// The pool's central queue, when replicas have concurrency limits.
    pub admission: Option<Admission>,
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
    pub fn build(
        config: &Config,
        metrics: &Metrics,
        admission_metrics: &AdmissionMetrics,
        previous: Option<&Topology>,
    ) -> Topology {
        let mut pools = Vec::with_capacity(config.pools.len());
        let mut by_model = HashMap::new();
        for (i, pc) in config.pools.iter().enumerate() {
            let old = previous.and_then(|t| t.pools.iter().find(|p| p.name == pc.name));
            pools.push(Arc::new(build_pool(
                config,
                pc,
                metrics,
                admission_metrics,
                old.map(|p| p.as_ref()),
            )));
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

fn build_pool(
    config: &Config,
    pc: &PoolConfig,
    metrics: &Metrics,
    admission_metrics: &AdmissionMetrics,
    old: Option<&Pool>,
) -> Pool {
    let replicas: Vec<Arc<Replica>> = pc
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
            let limit = rc.max_inflight.or(pc.max_inflight);
            if let Some(kept) = old.and_then(|p| {
                p.replicas.iter().find(|r| {
                    r.authority == authority
                        && r.weight == rc.weight
                        && r.name == name
                        && r.max_inflight == limit
                })
            }) {
                return Arc::clone(kept);
            }
            let gauge = metrics.in_flight.with_label_values(&[&pc.name, &name]);
            Arc::new(Replica::new(name, authority, rc.weight, gauge).with_limit(limit))
        })
        .collect();
    let old_queue = old.and_then(|p| p.admission.as_ref());
    let admission = queue_for(config, pc, &replicas, admission_metrics, old_queue);
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
        admission,
    }
}

/// The pool's queue when any replica has a concurrency limit. Capacity is
/// the sum of the limits of the replicas eligible at that moment.
fn queue_for(
    config: &Config,
    pc: &PoolConfig,
    replicas: &[Arc<Replica>],
    metrics: &AdmissionMetrics,
    old: Option<&Admission>,
) -> Option<Admission> {
    if replicas.iter().all(|r| r.max_inflight.is_none()) {
        return None;
    }
    let levels = config
        .priorities
        .iter()
        .map(|p| Level {
            name: p.name.clone(),
            max_wait: p.max_wait.unwrap_or(pc.queue.max_wait),
            promote_after: p.promote_after.unwrap_or(pc.queue.promote_after),
        })
        .collect();
    let members: Vec<Arc<Replica>> = replicas.to_vec();
    let capacity = Box::new(move || {
        members
            .iter()
            .filter(|r| r.is_eligible())
            .map(|r| r.max_inflight.map_or(usize::MAX / 1024, |l| l as usize))
            .sum()
    });
    let params = QueueParams {
        levels,
        max_depth: pc.queue.max_depth,
    };
    // A reload that keeps the queue's shape keeps the queue itself: its
    // waiters and the permits of requests in flight stay counted.
    let queue = match old {
        Some(a) if a.queue.same_params(&params) => {
            a.queue.set_capacity(capacity);
            Arc::clone(&a.queue)
        }
        _ => PoolQueue::new(params, capacity),
    };
    Some(Admission::new(queue, pc.queue.timeout, &pc.name, metrics))
}

//! Pools: the per-pool stack the request path and `llmlb fleet-sim` run on.
//!
//! A [`Pool`] is a set of interchangeable replicas serving the same models,
//! with their balancer, router, queue and clients. Above `routing`,
//! `admission` and `balancing`, it ties them together: the live
//! [`Topology`] ([`topology`]) and how a model name leads to a pool
//! ([`model_map`], a request's [`Resolution`]), the model lists replicas
//! report ([`replica_models`]), the last step of a decision ([`choose`],
//! [`dispatch`]), what an attempt's outcome teaches the pool ([`outcome`]:
//! outlier ejection, branch counts) and the placement estimate the pool
//! queue's deadline admission asks for ([`placement_ttft`]).

pub mod disaggregate;
mod dispatch;
pub mod model_map;
mod name_hash;
mod outcome;
mod placement;
pub mod replica_models;
#[cfg(test)]
pub(crate) mod test_fleet;
mod topology;

pub use disaggregate::{Disaggregation, SplitBranch};
pub use dispatch::{Choice, choose};
pub use name_hash::NameMap;
pub use outcome::Failure;
pub use placement::placement_ttft;
pub use topology::{Topology, queue_capacity, queue_capacity_of_fleet};

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};

use prometheus::IntCounter;

use crate::admission::Admission;
use crate::balancing::{Balancer, Branch};
use crate::config::{BalancingConfig, HealthConfig, OutlierConfig, ScrapeConfig, TimeoutConfig};
use crate::net::Prober;
use crate::net::{UpstreamClient, UpstreamTls};
use crate::replica::Replica;
use crate::routing::{RouteBranch, Router};
use crate::telemetry::clock::now_millis;

/// A set of interchangeable replicas serving the same models.
#[derive(Debug)]
pub struct Pool {
    pub name: String,
    /// `name` needs no quoting in the access line (checked once here).
    pub name_plain: bool,
    /// `name` shared: a request's record keeps it without a copy.
    pub shared_name: Arc<str>,
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
    /// The `decisions` series of each branch, looked up on first use rather
    /// than by label on every request.
    pub decision_series: DecisionSeries,
    pub client: UpstreamClient,
    /// Certificate checks for `https://` replicas (`client` and `prober` use them).
    pub tls: UpstreamTls,
    /// The background loops' client (health checks, scrapes) for this pool.
    pub prober: Prober,
    /// The pool's central queue, when replicas have concurrency limits.
    pub admission: Option<Admission>,
    /// Canary, tier and affinity routing among the replicas.
    pub router: Router,
    /// `Authorization` value for the replicas (`upstream_api_key`).
    pub upstream_auth: Option<http::HeaderValue>,
    /// What the replicas report on `GET /v1/models`, with `models_from_replicas`.
    pub replica_models: Option<replica_models::ReplicaModels>,
    /// Ask streams for `usage` (`stream_usage`).
    pub stream_usage: bool,
    /// Send the request's level as `priority` (`send_priority`).
    pub send_priority: bool,
    /// `[pools.disaggregation]`: some requests are prefilled on another
    /// pool's replicas.
    pub disaggregation: Option<Disaggregation>,
}

/// One pool's series of the `decisions` counter, one per balancer branch,
/// each resolved from the labelled vector the first time it is counted.
#[derive(Debug, Default)]
pub struct DecisionSeries([OnceLock<IntCounter>; Branch::COUNT]);

impl DecisionSeries {
    pub fn get(&self, branch: Branch, resolve: impl FnOnce() -> IntCounter) -> &IntCounter {
        self.0[branch as usize].get_or_init(resolve)
    }
}

impl Pool {
    /// Fetches the replicas' model lists again when they are stale (only
    /// with `models_from_replicas`).
    pub async fn refresh_replica_models(&self) {
        use replica_models::{FETCH_TIMEOUT, parse_ids};
        let Some(list) = &self.replica_models else {
            return;
        };
        list.refresh(|| async {
            let replicas = self.eligible();
            let asks = replicas.iter().map(|r| async move {
                let body = self
                    .prober
                    .get_authorized(&r.scheme, &r.authority, "/v1/models", FETCH_TIMEOUT, self.upstream_auth.as_ref())
                    .await;
                match body {
                    Ok(body) => parse_ids(&body),
                    Err(e) => {
                        tracing::debug!(pool = %self.name, replica = %r.name, error = %e, "model list not fetched");
                        None
                    }
                }
            });
            futures_util::future::join_all(asks).await
        })
        .await
    }

    /// Replicas that may receive new work now.
    pub fn eligible(&self) -> Vec<Arc<Replica>> {
        self.eligible_at(now_millis())
    }

    /// Replicas that may receive new work at `now_ms` (process clock, or a
    /// simulation's virtual one).
    pub fn eligible_at(&self, now_ms: u64) -> Vec<Arc<Replica>> {
        self.replicas
            .iter()
            .filter(|r| r.is_eligible_at(now_ms))
            .cloned()
            .collect()
    }

    /// Whether at least one replica is not known to be down.
    pub fn is_ready(&self) -> bool {
        self.replicas.iter().any(|r| r.is_eligible())
    }

    /// Whether no eligible replica has room (or none is eligible).
    pub fn is_saturated(&self) -> bool {
        self.router.all_saturated(&self.replicas, now_millis())
    }
}

/// Where a request goes: its pool, the model name to write into the body
/// (aliases), and the routing steps taken so far.
#[derive(Debug)]
pub struct Resolution<'a> {
    pub pool: &'a Arc<Pool>,
    pub rewrite: Option<&'a str>,
    pub branches: Vec<RouteBranch>,
}

impl Resolution<'_> {
    /// No pool named the model: the default pool took it.
    pub fn by_default(&self) -> bool {
        self.branches.contains(&RouteBranch::DefaultPool)
    }
}

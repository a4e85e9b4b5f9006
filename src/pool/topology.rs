//! The live topology: pools, their replicas and routers, and how a model
//! name (and the caller's tier) leads to a pool.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use super::model_map::ModelMap;
use super::{Pool, Resolution};
use crate::admission::fair::{FairParams, Share};
use crate::admission::{Admission, AdmissionMetrics, Level, PoolQueue, QueueParams};
use crate::balancing::{self, BalancerParams};
use crate::config::{Config, Fairness, PoolConfig, ReplicaConfig, UpstreamTlsConfig};
use crate::net::Prober;
use crate::net::UpstreamTls;
use crate::replica::{PrefillHook, Replica};
use crate::routing::{RouteBranch, Router};
use crate::telemetry::Metrics;
use crate::telemetry::clock::now_millis;

#[derive(Debug)]
pub struct Topology {
    /// Fixed once built: the flags below are read from it.
    pools: Vec<Arc<Pool>>,
    models: ModelMap,
    /// Tier → (pool index, may overflow to the model's pool).
    tier_pools: HashMap<String, (usize, bool)>,
    /// The tier of requests that name none.
    default_tier: Option<Arc<str>>,
    /// Some pool queues its requests (`[pools.admission]`).
    queues: bool,
    /// Some pool serves the names its replicas report.
    reported: bool,
}

impl Topology {
    /// Builds the topology for a validated config. Replicas present in
    /// `previous` (same pool name, same address) are carried over with their
    /// in-flight counts and health; one whose weight or limit changed is
    /// rebuilt but keeps its id and in-flight counts.
    pub fn build(
        config: &Config,
        metrics: &Metrics,
        admission_metrics: &AdmissionMetrics,
        previous: Option<&Topology>,
    ) -> Topology {
        let mut pools = Vec::with_capacity(config.pools.len());
        for pc in &config.pools {
            let old = previous.and_then(|t| t.pools.iter().find(|p| p.name == pc.name));
            pools.push(Arc::new(build_pool(
                config,
                pc,
                metrics,
                admission_metrics,
                old.map(|p| p.as_ref()),
            )));
        }
        let tier_pools = config
            .tiers
            .iter()
            .filter_map(|t| {
                let pool = t.pool.as_ref()?;
                let i = config.pools.iter().position(|p| &p.name == pool)?;
                Some((t.name.clone(), (i, t.overflow)))
            })
            .collect();
        Topology {
            queues: pools.iter().any(|p| p.admission.is_some()),
            reported: pools.iter().any(|p| p.replica_models.is_some()),
            pools,
            models: ModelMap::build(config),
            tier_pools,
            default_tier: config.gateway.default_tier.as_deref().map(Arc::from),
        }
    }

    /// The pools, in the config's order.
    pub fn pools(&self) -> &[Arc<Pool>] {
        &self.pools
    }

    /// The pool that lists `model` (no aliases, no default pool).
    pub fn pool_for(&self, model: &str) -> Option<&Arc<Pool>> {
        self.models.served(model).map(|i| &self.pools[i])
    }

    /// The pool named `name` (a disaggregated pool's prefill pool).
    pub fn pool_named(&self, name: &str) -> Option<&Arc<Pool>> {
        self.pools.iter().find(|p| p.name == name)
    }

    /// The caller's tier, or the configured default tier.
    pub fn tier<'a>(&'a self, caller_tier: Option<&'a str>) -> Option<&'a str> {
        caller_tier.or(self.default_tier.as_deref())
    }

    /// [`Topology::tier`], shared rather than borrowed (for the request's
    /// record).
    pub fn tier_shared(&self, caller_tier: Option<&Arc<str>>) -> Option<Arc<str>> {
        caller_tier.or(self.default_tier.as_ref()).cloned()
    }

    /// Where a request for `model` from a caller of `tier` goes: the tier's
    /// pool when it has one (or, when that is saturated and the tier may
    /// overflow, the model's own pool), else the model's pool by name, alias
    /// or default pool. `None`: nothing serves the model (a tier's pool
    /// takes only models that some pool serves).
    pub fn resolve(&self, model: &str, tier: Option<&str>) -> Option<Resolution<'_>> {
        let by_model = self.models.resolve(model)?;
        let branches: Vec<RouteBranch> = by_model.branch.into_iter().collect();
        Some(self.place(by_model.pool, by_model.rewrite, branches, tier))
    }

    /// A model no pool lists, found in what a pool's replicas last reported
    /// (`models_from_replicas`); the first such pool in config order.
    pub fn resolve_reported(&self, model: &str, tier: Option<&str>) -> Option<Resolution<'_>> {
        let index = self.pools.iter().position(|p| {
            p.replica_models
                .as_ref()
                .is_some_and(|list| list.contains(model))
        })?;
        Some(self.place(index, None, Vec::new(), tier))
    }

    /// The pool a request will go to, when it is known before its body is
    /// read: the only pool, or a tier's own pool that does not overflow.
    pub fn pool_before_body(&self, tier: Option<&str>) -> Option<&Arc<Pool>> {
        if let [only] = self.pools.as_slice() {
            return Some(only);
        }
        match self.tier_pools.get(tier?) {
            Some(&(index, false)) => Some(&self.pools[index]),
            _ => None,
        }
    }

    /// Whether any pool queues its requests (`[pools.admission]`): only a
    /// queue orders callers by tenant.
    pub fn has_queue(&self) -> bool {
        self.queues
    }

    /// Whether any pool serves the names its replicas report.
    pub fn has_reported(&self) -> bool {
        self.reported
    }

    /// Fetches again every stale `models_from_replicas` list, all pools at once.
    pub async fn refresh_reported(&self) {
        let stale = self
            .pools
            .iter()
            .filter(|p| p.replica_models.is_some())
            .map(|p| p.refresh_replica_models());
        futures_util::future::join_all(stale).await;
    }

    /// Model names the replicas report that no pool lists, with their pools.
    pub fn reported_models(&self) -> Vec<(String, &Pool)> {
        let mut seen: std::collections::HashSet<String> = self
            .models()
            .map(|(m, _)| m.to_string())
            .chain(self.aliases().map(|(a, _)| a.to_string()))
            .collect();
        let mut out = Vec::new();
        for pool in &self.pools {
            for id in pool.replica_models.iter().flat_map(|l| l.ids()) {
                if seen.insert(id.clone()) {
                    out.push((id, pool.as_ref()));
                }
            }
        }
        out
    }

    /// The pool at `index`, or its tier's pool when the tier has one.
    fn place<'a>(
        &'a self,
        model_pool: usize,
        rewrite: Option<&'a str>,
        mut branches: Vec<RouteBranch>,
        tier: Option<&str>,
    ) -> Resolution<'a> {
        if let Some(&(tier_pool, overflow)) = self.tier(tier).and_then(|t| self.tier_pools.get(t)) {
            let pool = &self.pools[tier_pool];
            let spill =
                Some(model_pool).filter(|m| *m != tier_pool && overflow && pool.is_saturated());
            let (index, branch) = match spill {
                Some(m) => (m, RouteBranch::TierOverflow),
                None => (tier_pool, RouteBranch::Tier),
            };
            branches.push(branch);
            return Resolution {
                pool: &self.pools[index],
                rewrite,
                branches,
            };
        }
        Resolution {
            pool: &self.pools[model_pool],
            rewrite,
            branches,
        }
    }

    /// Aliases with their pools, in name order.
    pub fn aliases(&self) -> impl Iterator<Item = (&str, &Pool)> {
        self.models
            .aliases()
            .map(|(alias, pool)| (alias, self.pools[pool].as_ref()))
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

    /// Makes every pool publish its dispatch records through `outbox` (the
    /// other instances of a `[fleet]` fold them into their prefix index);
    /// a new topology, after a reload, is given it again.
    pub fn share_prefixes(&self, outbox: Option<&crate::fleet::PrefixOutbox>) {
        let Some(outbox) = outbox else {
            return;
        };
        for pool in &self.pools {
            pool.router.share_prefixes(outbox.for_pool(&pool.name));
        }
    }
}

/// The replica `rc` of pool `pc`: the old pool's own when nothing that
/// shapes it changed, else a new one that carries the old one's counts.
fn replica_of(
    config: &Config,
    pc: &PoolConfig,
    rc: &ReplicaConfig,
    metrics: &Metrics,
    old: Option<&Pool>,
) -> Arc<Replica> {
    let url: http::Uri = rc
        .url
        .parse()
        .expect("replica URL checked by config validation");
    let authority = url.authority().cloned().expect("checked: URL has a host");
    let scheme = url.scheme().cloned().expect("checked: URL has a scheme");
    let name = rc.name.clone().unwrap_or_else(|| authority.to_string());
    let limit = pc.limit_of(rc);
    let same = old.and_then(|p| {
        p.replicas
            .iter()
            .find(|r| r.authority == authority && r.scheme == scheme && r.name == name)
    });
    if let Some(kept) = same.filter(|r| {
        r.weight == rc.weight && r.max_inflight == limit && r.max_prefilling == pc.max_prefilling
    }) {
        return Arc::clone(kept);
    }
    let gauge = metrics.in_flight.with_label_values(&[&pc.name, &name]);
    // With a fleet store, a new replica has no slot here until the
    // store grants this instance a share of its limit.
    let fleet_cap = if config.fleet.is_some() { 0 } else { u32::MAX };
    let replica = Replica::new(name, authority, rc.weight, gauge)
        .with_scheme(scheme)
        .with_limit(limit)
        .with_prefill_limit(pc.max_prefilling)
        .with_fleet_cap(fleet_cap);
    // A new weight or limit: the requests running there still count.
    Arc::new(match same {
        Some(previous) => replica.carrying_counts_of(previous),
        None => replica,
    })
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
        .map(|rc| replica_of(config, pc, rc, metrics, old))
        .collect();
    let old_queue = old.and_then(|p| p.admission.as_ref());
    let admission = queue_for(config, pc, &replicas, admission_metrics, old_queue);
    let router = Router::build(config, pc, &replicas, old.map(|p| &p.router));
    let tls = upstream_tls(pc);
    Pool {
        name: pc.name.clone(),
        name_plain: crate::telemetry::log_line::is_plain(&pc.name),
        shared_name: Arc::from(pc.name.as_str()),
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
        decision_series: Default::default(),
        client: crate::net::tls_client(&pc.timeouts, &tls),
        prober: Prober::new(&tls),
        tls,
        admission,
        router,
        upstream_auth: pc.upstream_api_key.as_deref().and_then(|k| {
            let mut v = http::HeaderValue::from_str(&format!("Bearer {k}")).ok()?;
            v.set_sensitive(true);
            Some(v)
        }),
        replica_models: pc
            .models_from_replicas
            .then(super::replica_models::ReplicaModels::default),
        stream_usage: pc.stream_usage,
        send_priority: pc.send_priority,
        disaggregation: pc.disaggregation.clone().map(|d| {
            super::Disaggregation::carrying(d, old.and_then(|p| p.disaggregation.as_ref()))
        }),
    }
}

/// The pool's TLS settings. Validation read the CA bundle already; should it
/// have become unreadable since, the pool trusts the built-in roots only (a
/// replica signed by that CA is then refused, never trusted by mistake).
fn upstream_tls(pc: &PoolConfig) -> UpstreamTls {
    UpstreamTls::new(&pc.tls).unwrap_or_else(|e| {
        tracing::error!(pool = %pc.name, error = %e, "pools.tls: CA bundle unusable; trusting built-in roots only");
        let without_ca = UpstreamTlsConfig {
            ca_file: None,
            ..pc.tls.clone()
        };
        UpstreamTls::new(&without_ca).unwrap_or_default()
    })
}

/// The requests `replicas` may run at once at `now_ms`: the sum of the
/// eligible ones' limits (`max_inflight`, or this instance's share of it
/// under a fleet store; an unlimited one counts as very many).
pub fn queue_capacity(replicas: &[Arc<Replica>], now_ms: u64) -> usize {
    replicas
        .iter()
        .filter(|r| r.is_eligible_at(now_ms))
        .map(|r| {
            r.open_slots_limit()
                .map_or(usize::MAX / 1024, |l| l as usize)
        })
        .sum()
}

/// The requests `replicas` may run at once at `now_ms` for the whole
/// fleet of llmlb instances: the eligible ones' `max_inflight`, not this
/// instance's share of it.
pub fn queue_capacity_of_fleet(replicas: &[Arc<Replica>], now_ms: u64) -> usize {
    replicas
        .iter()
        .filter(|r| r.is_eligible_at(now_ms))
        .map(|r| r.max_inflight.map_or(usize::MAX / 1024, |l| l as usize))
        .sum()
}

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
            ttft_objective: p.ttft_objective,
        })
        .collect();
    let members: Vec<Arc<Replica>> = replicas.to_vec();
    let capacity = Box::new(move || queue_capacity(&members, now_millis()));
    let params = QueueParams {
        prefix_handoff: pc.queue.prefix_handoff,
        levels,
        max_depth: pc.queue.max_depth,
        fair: fair_params(config, pc),
    };
    let named = (config.tenants.iter().map(|t| t.name.clone()))
        .chain(config.keys.iter().map(|k| k.tenant.clone()))
        .collect();
    // A reload that keeps the queue's shape keeps the queue itself: its
    // waiters and the permits of requests in flight stay counted.
    // A reshaped queue takes the old one's place with its active count and
    // waiters, so the limit still holds across the reload.
    let queue = match old {
        Some(a) if a.queue.same_params(&params) => {
            a.queue.set_capacity(capacity);
            Arc::clone(&a.queue)
        }
        Some(a) => a.queue.replace(params, capacity),
        None => PoolQueue::new(params, capacity),
    };
    if pc.max_prefilling.is_some() {
        // A request past its first token frees a prefill slot: the queue
        // grants again (its capacity counts the bound).
        let weak = Arc::downgrade(&queue);
        let hook = Arc::new(PrefillHook(Box::new(move || {
            if let Some(q) = weak.upgrade() {
                q.poke();
            }
        })));
        for r in replicas {
            r.on_prefill_done(Arc::clone(&hook));
        }
    }
    Some(Admission::new(
        queue,
        pc.queue.timeout,
        &pc.name,
        metrics,
        named,
    ))
}

/// How `pc`'s queue shares a level among the config's tenants.
pub fn fair_params(config: &Config, pc: &PoolConfig) -> FairParams {
    FairParams {
        enabled: pc.queue.fairness == Fairness::Tenants,
        prompt_weight: pc.queue.prompt_weight,
        tenants: (config.tenants.iter())
            .map(|t| {
                let share = Share {
                    weight: t.weight,
                    max_depth: t.max_depth,
                };
                (t.name.clone(), share)
            })
            .collect(),
        tenant_max_depth: pc.queue.tenant_max_depth.unwrap_or(pc.queue.max_depth),
        anticipate: pc.queue.anticipate,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topology(text: &str) -> Topology {
        let config = crate::config::parse(text).unwrap();
        let metrics = Metrics::new();
        let admission = AdmissionMetrics::new(metrics.registry());
        Topology::build(&config, &metrics, &admission, None)
    }

    const TWO_POOLS: &str = "[[pools]]\nname = \"a\"\nmodels = [\"m\"]\n[[pools.replicas]]\nurl = \"http://127.0.0.1:1\"\n\
        [[pools]]\nname = \"b\"\nmodels = [\"m-b\"]\n[[pools.replicas]]\nurl = \"http://127.0.0.1:2\"\n";

    #[test]
    fn the_pool_is_known_before_the_body_only_when_nothing_else_can_serve() {
        let name = |t: &Topology, tier| t.pool_before_body(tier).map(|p| p.name.clone());
        let one = topology(
            "[[pools]]\nname = \"only\"\nmodels = [\"m\"]\n[[pools.replicas]]\nurl = \"http://127.0.0.1:1\"\n",
        );
        assert_eq!(name(&one, None).as_deref(), Some("only"));
        let two = topology(TWO_POOLS);
        assert_eq!(name(&two, None), None, "the model decides");
        let tiered = |overflow: bool| {
            topology(&format!(
                "[[tiers]]\nname = \"paid\"\npriority = \"high\"\npool = \"b\"\noverflow = {overflow}\n{TWO_POOLS}"
            ))
        };
        assert_eq!(name(&tiered(false), Some("paid")).as_deref(), Some("b"));
        assert_eq!(name(&tiered(false), Some("free")), None);
        // A tier that may overflow can still end in the model's pool.
        assert_eq!(name(&tiered(true), Some("paid")), None);
    }
}

//! The decision adapter: a real [`Topology`] built from a config, and for
//! each arrival the same calls `serve` makes: model → pool, the pool's
//! [`Router::route`](crate::routing::Router::route) over plain request facts,
//! then [`routing::choose`](crate::pool::choose) (eligibility, the
//! decision's allowed and preferred sets, free slots, the balancer's pick).
//! Replica state lives in the real [`Replica`] structs: the event loop holds
//! real in-flight guards and stores scraped [`LoadSnapshot`](crate::replica::LoadSnapshot)s in them, so the
//! balancers and the router read what the proxy would know.
//!
//! A policy overrides every pool's balancer and prefix mode; `config` keeps
//! the file as written. The generated fleet is one pool of N replicas at
//! placeholder loopback addresses that are never contacted.
//!
//! A pool whose replicas have a `max_inflight` keeps its queue; the run
//! loop models it on the virtual clock ([`super::pool_queue`]), since the
//! real queue's grants and estimates run on the wall clock.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use crate::admission::AdmissionMetrics;
use crate::balancing::RequestInfo;
use crate::config::{BalancerKind, Config, DisaggregateWhen, PrefixMode, ReplicaConfig};
use crate::pool::{Choice, Pool, SplitBranch, Topology};
use crate::replica::{Replica, ReplicaId};
use crate::routing::{Decision, Prompt, RouteError, RouteInput};
use crate::telemetry::Metrics;

use super::SimulateError;

/// A routing and balancing setup to compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// A balancer with prefix affinity off.
    Balancer(BalancerKind),
    /// `least_connections` behind prefix affinity (`hash` or `cache`).
    Prefix(PrefixMode),
    /// The config file as written.
    AsConfigured,
}

impl FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Policy, String> {
        let kinds = [
            BalancerKind::RoundRobin,
            BalancerKind::LeastConnections,
            BalancerKind::LeastTokens,
            BalancerKind::Jsq,
            BalancerKind::KvAware,
            BalancerKind::P2c,
        ];
        if let Some(k) = kinds.into_iter().find(|k| k.as_str() == s) {
            return Ok(Policy::Balancer(k));
        }
        match s {
            "hash" => Ok(Policy::Prefix(PrefixMode::Hash)),
            "cache" => Ok(Policy::Prefix(PrefixMode::Cache)),
            "exact" => Ok(Policy::Prefix(PrefixMode::Exact)),
            "config" => Ok(Policy::AsConfigured),
            _ => Err(format!(
                "unknown policy {s:?}: expected round_robin, least_connections, least_tokens, jsq, kv_aware, p2c, hash, cache, exact or config"
            )),
        }
    }
}

impl Policy {
    pub fn name(&self) -> String {
        match self {
            Policy::Balancer(k) => k.as_str().to_string(),
            Policy::Prefix(m) => m.as_str().to_string(),
            Policy::AsConfigured => "config".into(),
        }
    }

    /// `config` with every pool set to this policy.
    pub fn apply(&self, config: &Config) -> Config {
        let mut c = config.clone();
        // Placeholder event endpoints are numbered across pools.
        let mut seen = 0;
        for pc in &mut c.pools {
            let first = seen;
            seen += pc.replicas.len();
            match self {
                Policy::Balancer(k) => {
                    pc.balancer = *k;
                    pc.prefix.mode = PrefixMode::Off;
                }
                Policy::Prefix(m) => {
                    pc.balancer = BalancerKind::LeastConnections;
                    pc.prefix.mode = *m;
                    if *m == PrefixMode::Exact {
                        for (i, r) in pc.replicas.iter_mut().enumerate() {
                            r.kv_events
                                .get_or_insert_with(|| placeholder_events(first + i));
                        }
                    }
                }
                Policy::AsConfigured => {}
            }
        }
        c
    }
}

/// One pool serving `model` with `replicas` placeholder replicas.
pub fn generated_config(model: &str, replicas: usize) -> Result<Config, SimulateError> {
    let mut text = format!("[[pools]]\nname = \"fleet\"\nmodels = [{model:?}]\n");
    text.push_str(&placeholder_replicas(replicas, None));
    crate::config::parse(&text).map_err(|issues| SimulateError::config("(generated)", &issues))
}

/// `config` with the pool serving `model` resized to `replicas` replicas,
/// each a copy of its first replica (weight, limit, version) at a
/// placeholder address.
pub fn resized(config: &Config, model: &str, replicas: usize) -> Result<Config, SimulateError> {
    let mut c = config.clone();
    let pc = c
        .pools
        .iter_mut()
        .find(|p| p.models.iter().any(|m| m == model))
        .ok_or_else(|| SimulateError::Invalid(format!("no pool serves model {model:?}")))?;
    let first = pc.replicas.first().cloned();
    let text = format!(
        "[[pools]]\nname = \"x\"\nmodels = [\"x\"]\n{}",
        placeholder_replicas(replicas, first.as_ref())
    );
    let parsed =
        crate::config::parse(&text).map_err(|i| SimulateError::config("(generated)", &i))?;
    pc.replicas = parsed.pools[0].replicas.clone();
    Ok(c)
}

/// The KV-event endpoint of placeholder replica `i`: it only names the
/// replica's events, which `simulate` feeds in without a socket.
fn placeholder_events(i: usize) -> String {
    format!("tcp://sim-r{i}:5557")
}

fn placeholder_replicas(n: usize, like: Option<&ReplicaConfig>) -> String {
    placeholders(n, like, 0, "r")
}

/// `n` placeholder replicas named `{prefix}{i}`, at addresses from
/// position `first` on.
fn placeholders(n: usize, like: Option<&ReplicaConfig>, first: usize, prefix: &str) -> String {
    (0..n)
        .map(|i| {
            let k = first + i;
            let mut s = format!(
                "[[pools.replicas]]\nurl = \"http://127.0.0.{}:{}\"\nname = \"{prefix}{i}\"\n",
                1 + k / 50_000,
                10_000 + k % 50_000
            );
            if let Some(r) = like {
                s.push_str(&format!("weight = {}\n", r.weight));
                if let Some(m) = r.max_inflight {
                    s.push_str(&format!("max_inflight = {m}\n"));
                }
                if let Some(v) = &r.version {
                    s.push_str(&format!("version = {v:?}\n"));
                }
                if r.kv_events.is_some() {
                    s.push_str(&format!("kv_events = {:?}\n", placeholder_events(k)));
                }
            }
            s
        })
        .collect()
}

/// Where the placeholder prefill replicas' addresses start.
const PREFILL_FIRST: usize = 1_000_000;

/// A pool serving `model` on `decode` replicas whose requests may be
/// prefilled (`when`) on a pool of `prefill` replicas.
pub fn generated_disaggregated(
    model: &str,
    decode: usize,
    prefill: usize,
    when: DisaggregateWhen,
) -> Result<Config, SimulateError> {
    let mut text = format!(
        "[[pools]]\nname = \"fleet\"\nmodels = [{model:?}]\n[pools.disaggregation]\n\
         prefill_pool = \"fleet-prefill\"\nwhen = {:?}\n",
        when.as_str()
    );
    text.push_str(&placeholder_replicas(decode, None));
    text.push_str("[[pools]]\nname = \"fleet-prefill\"\nrole = \"prefill\"\n");
    text.push_str(&placeholders(prefill, None, PREFILL_FIRST, "p"));
    crate::config::parse(&text).map_err(|issues| SimulateError::config("(generated)", &issues))
}

/// The prefill pool of the pool serving `model`, when it is disaggregated.
fn prefill_pool_of(config: &Config, model: &str) -> Option<String> {
    let pc = config
        .pools
        .iter()
        .find(|p| p.models.iter().any(|m| m == model))?;
    pc.disaggregation.as_ref().map(|d| d.prefill_pool.clone())
}

/// Whether the pool serving `model` is disaggregated.
pub fn is_disaggregated(config: &Config, model: &str) -> bool {
    prefill_pool_of(config, model).is_some()
}

/// `config` with the prefill pool of the pool serving `model` resized to
/// `replicas` placeholder replicas, each a copy of its first one.
pub fn resized_prefill(
    config: &Config,
    model: &str,
    replicas: usize,
) -> Result<Config, SimulateError> {
    let name = prefill_pool_of(config, model).ok_or_else(|| {
        SimulateError::Invalid(format!(
            "the pool serving {model:?} has no [pools.disaggregation]"
        ))
    })?;
    let mut c = config.clone();
    let pc = (c.pools.iter_mut())
        .find(|p| p.name == name)
        .ok_or_else(|| SimulateError::Invalid(format!("no prefill pool {name:?}")))?;
    let first = pc.replicas.first().cloned();
    let text = format!(
        "[[pools]]\nname = \"x\"\nmodels = [\"x\"]\n{}",
        placeholders(replicas, first.as_ref(), PREFILL_FIRST, "p")
    );
    let parsed =
        crate::config::parse(&text).map_err(|i| SimulateError::config("(generated)", &i))?;
    pc.replicas = parsed.pools[0].replicas.clone();
    Ok(c)
}

/// `config` with the pool serving `model` deciding `when`.
pub fn with_when(config: &Config, model: &str, when: DisaggregateWhen) -> Config {
    let mut c = config.clone();
    for pc in &mut c.pools {
        if pc.models.iter().any(|m| m == model)
            && let Some(d) = &mut pc.disaggregation
        {
            d.when = when;
        }
    }
    c
}

/// `config` with the pool serving `model` aggregated: no
/// `[pools.disaggregation]`, its prefill pool gone.
pub fn aggregated(config: &Config, model: &str) -> Config {
    let mut c = config.clone();
    if let Some(name) = prefill_pool_of(config, model) {
        c.pools.retain(|p| p.name != name);
        for pc in &mut c.pools {
            if pc.models.iter().any(|m| m == model) {
                pc.disaggregation = None;
            }
        }
    }
    c
}

/// The real topology and the calls `serve` makes on it.
pub struct Decider {
    topology: Topology,
    pool: usize,
    /// The prefill pool of a disaggregated pool.
    prefill: Option<usize>,
    /// Every simulated replica by fleet position: the pool's, then its
    /// prefill pool's.
    members: Vec<Arc<Replica>>,
    /// How many of `members` are the pool's own (decode) replicas.
    decode: usize,
    model: String,
    metrics: Metrics,
    index: HashMap<ReplicaId, u32>,
    rng: u64,
}

impl Decider {
    pub fn new(config: &Config, model: &str, seed: u64) -> Result<Decider, SimulateError> {
        let issues = crate::config::validate(config);
        if !issues.is_empty() {
            return Err(SimulateError::config("(policy applied)", &issues));
        }
        let metrics = Metrics::new();
        let admission = AdmissionMetrics::new(metrics.registry());
        // One simulated instance decides alone: a `[fleet]` store is not
        // part of the run.
        let alone = Config {
            fleet: None,
            ..config.clone()
        };
        let topology = Topology::build(&alone, &metrics, &admission, None);
        let pool = topology
            .resolve(model, None)
            .map(|r| r.pool.name.clone())
            .and_then(|name| topology.pools().iter().position(|p| p.name == name))
            .ok_or_else(|| SimulateError::Invalid(format!("no pool serves model {model:?}")))?;
        let p = &topology.pools()[pool];
        // A disaggregated pool's prefill replicas follow its own in the
        // fleet's positions.
        let prefill = match &p.disaggregation {
            Some(d) => Some(
                (topology.pools().iter())
                    .position(|q| q.name == d.config.prefill_pool)
                    .ok_or_else(|| {
                        SimulateError::Invalid(format!(
                            "pool {:?} names prefill pool {:?}, which does not exist",
                            p.name, d.config.prefill_pool
                        ))
                    })?,
            ),
            None => None,
        };
        let mut members: Vec<Arc<Replica>> = p.replicas.clone();
        let decode = members.len();
        if let Some(q) = prefill {
            members.extend(topology.pools()[q].replicas.iter().cloned());
        }
        let index = members
            .iter()
            .enumerate()
            .map(|(i, r)| (r.id, i as u32))
            .collect();
        Ok(Decider {
            topology,
            pool,
            prefill,
            members,
            decode,
            model: model.to_string(),
            metrics,
            index,
            rng: seed ^ 0x0dec_1de5,
        })
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.topology.pools()[self.pool]
    }

    /// The prefill pool, when the pool is disaggregated.
    pub fn prefill_pool(&self) -> Option<&Arc<Pool>> {
        self.prefill.map(|q| &self.topology.pools()[q])
    }

    /// Replicas simulated: the pool's, then its prefill pool's.
    pub fn fleet_size(&self) -> usize {
        self.members.len()
    }

    /// The pool's own replicas (the decode side of a disaggregated pool).
    pub fn decode_replicas(&self) -> usize {
        self.decode
    }

    /// The replica at fleet position `at`.
    pub fn replica(&self, at: usize) -> &Arc<Replica> {
        &self.members[at]
    }

    /// The pool that replica `at` belongs to.
    pub fn pool_at(&self, at: usize) -> &Arc<Pool> {
        match self.prefill {
            Some(q) if at >= self.decode => &self.topology.pools()[q],
            _ => self.pool(),
        }
    }

    /// `serve`'s per-request choice in a disaggregated pool: prefill on
    /// the prefill pool or on the decode replica (`None`: not
    /// disaggregated).
    pub fn split(
        &self,
        decision: &Decision,
        info: &RequestInfo<'_>,
        now_ms: u64,
    ) -> Option<SplitBranch> {
        let pool = self.pool();
        let d = pool.disaggregation.as_ref()?;
        Some(d.decide(pool, decision, info, now_ms))
    }

    /// The routing stage within the prefill pool, as `serve`'s prefill
    /// step runs it.
    pub fn route_prefill(
        &mut self,
        prompt: Prompt<'_>,
        tier: Option<&str>,
        max_tokens: u32,
        now_ms: u64,
    ) -> Option<Decision> {
        let q = self.prefill?;
        self.route_in(q, prompt, tier, max_tokens, now_ms).ok()
    }

    /// The prefill step's choice of a prefill replica (the request asks
    /// for one token).
    pub fn choose_prefill(
        &self,
        route: &Decision,
        tried: &[ReplicaId],
        prompt_tokens: u32,
        now_ms: u64,
    ) -> Option<Choice> {
        let pool = self.prefill_pool()?;
        let info = self.info(prompt_tokens, 1);
        Some(crate::pool::choose(pool, route, tried, &info, now_ms))
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Publishes this instance's dispatch records through `outbox`, as
    /// `serve` does under a `[fleet]` store (`cache` and `hash` only).
    pub fn share_prefixes(&self, outbox: &crate::fleet::PrefixOutbox) {
        self.topology.share_prefixes(Some(outbox));
    }

    /// Folds another instance's dispatch record into this instance's view,
    /// as `serve` folds what it reads from the store.
    pub fn fold(&self, record: &crate::fleet::PrefixRecord, now_ms: u64) {
        if let Some(pool) = (self.topology.pools().iter()).find(|p| *p.name == *record.pool) {
            (pool.router).fold_remote(
                &pool.replicas,
                &record.replica,
                record.key,
                &record.blocks,
                now_ms,
            );
        }
    }

    /// The fleet position of a replica of the pool.
    pub fn position(&self, id: ReplicaId) -> usize {
        self.index[&id] as usize
    }

    pub fn info(&self, prompt_tokens: u32, max_tokens: u32) -> RequestInfo<'_> {
        RequestInfo {
            model: &self.model,
            prompt_tokens,
            max_tokens: Some(max_tokens),
            user: None,
        }
    }

    /// The routing stage, as `serve` runs it for a request without headers
    /// or user, of `tier` (a `[[tiers]]` name) or none, asking for
    /// `max_tokens` output tokens.
    pub fn route(
        &mut self,
        prompt: Prompt<'_>,
        tier: Option<&str>,
        max_tokens: u32,
        now_ms: u64,
    ) -> Result<Decision, RouteError> {
        self.route_in(self.pool, prompt, tier, max_tokens, now_ms)
    }

    /// The routing stage within the topology's pool `pool`.
    fn route_in(
        &mut self,
        pool: usize,
        prompt: Prompt<'_>,
        tier: Option<&str>,
        max_tokens: u32,
        now_ms: u64,
    ) -> Result<Decision, RouteError> {
        self.rng = splitmix(self.rng);
        let headers = http::HeaderMap::new();
        let input = RouteInput {
            model: &self.model,
            user: None,
            api_key: None,
            headers: &headers,
            tier,
            prompt,
            tokens: None,
            salt: None,
            unpredictable: None,
            kind: "plain",
            max_tokens: Some(max_tokens),
        };
        let pool = &self.topology.pools()[pool];
        pool.router.route(&pool.replicas, &input, self.rng, now_ms)
    }

    /// The forwarder's choice for the next attempt: a replica, or a wait
    /// for a free slot when every allowed replica is at its `max_inflight`.
    pub fn choose(
        &self,
        decision: &Decision,
        tried: &[ReplicaId],
        info: &RequestInfo<'_>,
        now_ms: u64,
    ) -> Choice {
        crate::pool::choose(self.pool(), decision, tried, info, now_ms)
    }
}

pub(super) fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_parse_and_apply() {
        assert_eq!(
            "jsq".parse::<Policy>(),
            Ok(Policy::Balancer(BalancerKind::Jsq))
        );
        assert_eq!(
            "exact".parse::<Policy>(),
            Ok(Policy::Prefix(PrefixMode::Exact))
        );
        assert!("nope".parse::<Policy>().is_err());
        let c = generated_config("m", 3).unwrap();
        let cache = Policy::Prefix(PrefixMode::Cache).apply(&c);
        assert_eq!(cache.pools[0].prefix.mode, PrefixMode::Cache);
        assert_eq!(cache.pools[0].replicas.len(), 3);
        let d = Decider::new(&cache, "m", 0).unwrap();
        assert_eq!(d.pool().replicas.len(), 3);
        assert!(Decider::new(&cache, "other", 0).is_err());
    }
}

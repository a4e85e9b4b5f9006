//! Balancing: pick one replica among the eligible candidates.
//!
//! A [`Balancer`] is a pure, synchronous choice over a slice of [`ReplicaView`]s:
//! no I/O, no `.await`, no lock held across anything. Health and draining are
//! decided before the balancer runs (the slice holds only eligible replicas), so
//! balancers never re-check them. Each pick says why it was made ([`Branch`]),
//! which becomes a metric label and a tracing field.
//!
//! The load-aware balancers are a measure and a selection kept apart
//! ([`load`]): a [`Load`] gives each candidate a comparable key (with its
//! stale-metrics fallback), and a scan ([`load::scan`]) or two random
//! choices ([`PowerOfTwo`]) compare those keys.

mod jsq;
mod kv_aware;
mod least_connections;
mod least_tokens;
pub mod load;
mod p2c;
mod params;
mod round_robin;

pub use jsq::{JoinShortestQueue, QueueLength};
pub use kv_aware::{KvAware, KvHeadroom};
pub use least_connections::{InFlight, LeastConnections};
pub use least_tokens::{LeastTokens, OutstandingTokens};
pub use load::{Load, Scan};
pub use p2c::PowerOfTwo;
pub use params::BalancerParams;
pub use round_robin::WeightedRoundRobin;

use crate::config::{BalancerKind, P2cMetric};
use crate::replica::ReplicaView;

/// What a balancer may know about the request being placed.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestInfo<'a> {
    pub model: &'a str,
    /// Prompt tokens, estimated from the request text.
    pub prompt_tokens: u32,
    /// Requested output limit, when the request set one.
    pub max_tokens: Option<u32>,
    pub user: Option<&'a str>,
}

impl RequestInfo<'_> {
    /// Output tokens to expect: `max_tokens`, else `default`.
    pub fn expected_output(&self, default: u32) -> u64 {
        u64::from(self.max_tokens.unwrap_or(default))
    }

    /// Tokens the request adds to a replica's work and KV cache.
    pub fn expected_tokens(&self, default_output: u32) -> u64 {
        u64::from(self.prompt_tokens) + self.expected_output(default_output)
    }
}

/// Why a replica was chosen (or none was).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Branch {
    RoundRobin,
    LeastConnections,
    LeastTokens,
    Jsq,
    /// KV headroom decided, among replicas under the usage threshold.
    KvAware,
    /// Every candidate was above the KV threshold: shortest queue instead.
    KvSaturated,
    P2c,
    /// Some candidate's scraped load was missing or stale: local counts
    /// were compared for all of them.
    FallbackStaleMetrics,
    /// The only candidate left.
    Single,
    /// No eligible replica.
    NoHealthy,
}

impl Branch {
    /// How many branches there are.
    pub const COUNT: usize = Branch::NoHealthy as usize + 1;

    pub fn as_str(self) -> &'static str {
        match self {
            Branch::RoundRobin => "round_robin",
            Branch::LeastConnections => "least_connections",
            Branch::LeastTokens => "least_tokens",
            Branch::Jsq => "jsq",
            Branch::KvAware => "kv_aware",
            Branch::KvSaturated => "kv_saturated",
            Branch::P2c => "p2c",
            Branch::FallbackStaleMetrics => "fallback_stale_metrics",
            Branch::Single => "single",
            Branch::NoHealthy => "no_healthy",
        }
    }
}

/// A balancer's answer: an index into the candidate slice and the reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick {
    pub index: usize,
    pub branch: Branch,
}

pub trait Balancer: Send + Sync + std::fmt::Debug {
    fn name(&self) -> &'static str;
    /// Index into `replicas`; `None` only when `replicas` is empty.
    fn pick(&self, req: &RequestInfo<'_>, replicas: &[ReplicaView]) -> Option<Pick>;
}

/// Builds the balancer a pool's config names.
pub fn build(kind: BalancerKind, params: BalancerParams) -> Box<dyn Balancer> {
    match kind {
        BalancerKind::RoundRobin => Box::new(WeightedRoundRobin::default()),
        BalancerKind::LeastConnections => Box::new(LeastConnections::default()),
        BalancerKind::LeastTokens => Box::new(LeastTokens::default()),
        BalancerKind::Jsq => Box::new(Scan::new(QueueLength::new(params))),
        BalancerKind::KvAware => Box::new(Scan::new(KvHeadroom { params })),
        BalancerKind::P2c => match params.p2c_metric {
            P2cMetric::LeastConnections => Box::new(PowerOfTwo::new(InFlight, params.seed)),
            P2cMetric::LeastTokens => Box::new(PowerOfTwo::new(OutstandingTokens, params.seed)),
            P2cMetric::Jsq => Box::new(PowerOfTwo::new(QueueLength::new(params), params.seed)),
            P2cMetric::KvAware => Box::new(PowerOfTwo::new(KvHeadroom { params }, params.seed)),
        },
    }
}

/// Picks among candidates, answering `Single` without consulting the balancer
/// when only one is left and `NoHealthy` when none is.
pub fn pick(
    balancer: &dyn Balancer,
    req: &RequestInfo<'_>,
    replicas: &[ReplicaView],
) -> Result<Pick, Branch> {
    match without_balancer(replicas.len()) {
        Some(decided) => decided,
        None => balancer.pick(req, replicas).ok_or(Branch::NoHealthy),
    }
}

/// [`pick`] among `n` replicas whose views `views` makes only when the
/// balancer weighs them (two or more).
pub fn pick_among(
    balancer: &dyn Balancer,
    req: &RequestInfo<'_>,
    n: usize,
    views: impl FnOnce() -> Vec<ReplicaView>,
) -> Result<Pick, Branch> {
    match without_balancer(n) {
        Some(decided) => decided,
        None => balancer.pick(req, &views()).ok_or(Branch::NoHealthy),
    }
}

/// The pick among `n` replicas when the balancer has nothing to weigh.
fn without_balancer(n: usize) -> Option<Result<Pick, Branch>> {
    match n {
        0 => Some(Err(Branch::NoHealthy)),
        1 => Some(Ok(Pick {
            index: 0,
            branch: Branch::Single,
        })),
        _ => None,
    }
}

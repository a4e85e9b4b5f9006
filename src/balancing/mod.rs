//! Balancing: pick one replica among the eligible candidates.
//!
//! A [`Balancer`] is a pure, synchronous choice over a slice of [`ReplicaView`]s:
//! no I/O, no `.await`, no lock held across anything. Health and draining are
//! decided before the balancer runs (the slice holds only eligible replicas), so
//! balancers never re-check them. Each pick says why it was made ([`Branch`]),
//! which becomes a metric label and a tracing field.

mod least_connections;
pub mod replica;
mod round_robin;

pub use least_connections::LeastConnections;
pub use replica::{InFlightGuard, Replica, ReplicaId};
pub use round_robin::WeightedRoundRobin;

use crate::config::BalancerKind;

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

/// A candidate replica as the balancer sees it: a copy of its numbers at pick time.
#[derive(Debug, Clone, Copy)]
pub struct ReplicaView {
    pub id: ReplicaId,
    pub weight: u32,
    /// Requests this proxy has sent to the replica that have not finished.
    pub in_flight: u64,
}

impl ReplicaView {
    pub fn of(replica: &Replica) -> ReplicaView {
        ReplicaView {
            id: replica.id,
            weight: replica.weight,
            in_flight: replica.in_flight(),
        }
    }
}

/// Why a replica was chosen (or none was).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Branch {
    RoundRobin,
    LeastConnections,
    /// The only candidate left.
    Single,
    /// No eligible replica.
    NoHealthy,
}

impl Branch {
    pub fn as_str(self) -> &'static str {
        match self {
            Branch::RoundRobin => "round_robin",
            Branch::LeastConnections => "least_connections",
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
pub fn build(kind: BalancerKind) -> Box<dyn Balancer> {
    match kind {
        BalancerKind::RoundRobin => Box::new(WeightedRoundRobin::default()),
        BalancerKind::LeastConnections => Box::new(LeastConnections::default()),
    }
}

/// Picks among candidates, answering `Single` without consulting the balancer
/// when only one is left and `NoHealthy` when none is.
pub fn pick(
    balancer: &dyn Balancer,
    req: &RequestInfo<'_>,
    replicas: &[ReplicaView],
) -> Result<Pick, Branch> {
    match replicas.len() {
        0 => Err(Branch::NoHealthy),
        1 => Ok(Pick {
            index: 0,
            branch: Branch::Single,
        }),
        _ => balancer.pick(req, replicas).ok_or(Branch::NoHealthy),
    }
}

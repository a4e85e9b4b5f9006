//! Routing: which pool, and which of its replicas, may serve a request.
//!
//! The live [`Topology`] is built from a validated config and published through
//! an `ArcSwap`, so a reload replaces it whole without stopping traffic. Model
//! names resolve to pools ([`model_map`], with aliases and a default pool, and
//! tier pools from [`tiers`]); each pool's [`Router`] then narrows the
//! replicas by canary version ([`canary`]), tier, and session or prefix
//! affinity ([`prefix`]) before the balancer picks.

pub mod branch;
pub mod canary;
mod dispatch;
pub mod metrics;
pub mod model_map;
mod outcome;
pub mod prefix;
pub mod replica_models;
mod router;
pub mod saturation;
pub mod tiers;
mod topology;

pub use branch::RouteBranch;
pub use dispatch::choose;
pub use metrics::{RoutingMetrics, VersionRecord};
pub use outcome::Failure;
pub use prefix::blocks::Prompt;
pub use router::{Decision, RouteInput, Router};
pub use topology::{Pool, Resolution, Topology};

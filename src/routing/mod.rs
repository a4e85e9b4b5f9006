//! Routing: which pool, and which of its replicas, may serve a request.
//!
//! The live topology (the pool stack's `Topology`, above this module) is
//! built from a validated config and published through an `ArcSwap`, so a
//! reload replaces it whole without stopping traffic. Model names resolve to
//! pools (the pool stack's `model_map`, with aliases and a default pool, and
//! tier pools from [`tiers`]); each pool's [`Router`] then narrows the
//! replicas step by step (canary version ([`canary`]), tier ([`tiers`]),
//! session or `hash` affinity ([`affinity`]), cache scoring) into a
//! [`Decision`] before the balancer picks. Refusals are a [`RouteError`].

pub mod affinity;
pub mod branch;
mod cache;
pub mod canary;
mod carry_over;
mod decision;
mod error;
pub mod hash_key;
mod lora;
pub mod metrics;
pub mod prefix;
mod router;
pub mod saturation;
pub mod tiers;

pub use branch::RouteBranch;
pub use decision::{Decision, Dispatched};
pub use error::RouteError;
pub use metrics::{RoutingMetrics, StreamBroken};
pub use prefix::blocks::Prompt;
pub use prefix::held::Expected;
pub use router::{RouteInput, Router};

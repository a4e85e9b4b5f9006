//! Routing: which pool (and so which replicas) may serve a request.
//!
//! The live [`Topology`] is built from a validated config and published through
//! an `ArcSwap`, so a reload replaces it whole without stopping traffic.

mod outcome;
mod topology;

pub use outcome::Failure;
pub use topology::{Pool, Topology};

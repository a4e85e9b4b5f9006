//! `llmlb fleet-sim`: a whole fleet on a virtual clock, for capacity planning
//! and policy choice.
//!
//! N pure engines ([`crate::replica_sim::engine`]) advance step by step on one
//! discrete-event clock ([`clock`]); every arrival is decided by llmlb's own
//! routing and balancing code over a real topology ([`decide`]), with the
//! proxy's in-flight counts exact and scraped load refreshed only at the
//! scrape interval ([`run`]). Faults ([`faults`]) act on the same clock.
//! A pool with `max_inflight` keeps its queue on the same clock
//! ([`pool_queue`]: levels, aging, deadline admission), each request at the
//! priority level of the tier it drew ([`tiers`], `--tiers`). Results per
//! policy ([`report`]) and per tier ([`tier_report`]); the smallest fleet
//! meeting an objective ([`search`]). No tokio, no sockets.
//!
//! Where it sits: `simulate` drives `routing`, `balancing` and the pure
//! parts of `admission` (`refusal`, `estimate`); none of them imports it.

pub mod cli;
pub mod clock;
pub mod decide;
pub mod faults;
pub mod fleet;
pub mod instances;
pub mod pool_queue;
pub mod report;
pub mod run;
pub mod search;
pub mod split_report;
pub mod stats;
pub mod tenant_report;
pub mod tenants;
pub mod tier_report;
pub mod tiers;
pub mod workload;

pub use decide::Policy;
pub use faults::Fault;
pub use report::RunResult;
pub use workload::SimWorkload;

use crate::config::ConfigIssue;

#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error("{0}")]
    Invalid(String),
    #[error("{path}:{line}: {reason}")]
    Trace {
        path: String,
        line: usize,
        reason: String,
    },
    #[error("invalid config {file}: {issues}")]
    Config { file: String, issues: String },
    #[error("cannot write {path}: {reason}")]
    Io { path: String, reason: String },
}

impl SimulateError {
    pub fn config(file: &str, issues: &[ConfigIssue]) -> SimulateError {
        SimulateError::Config {
            file: file.to_string(),
            issues: issues
                .iter()
                .map(|i| format!("{}: {}", i.key, i.reason))
                .collect::<Vec<_>>()
                .join("; "),
        }
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod instance_tests;
#[cfg(test)]
mod priority_tests;
#[cfg(test)]
mod split_tests;
#[cfg(test)]
mod tenant_tests;
#[cfg(test)]
mod tier_tests;

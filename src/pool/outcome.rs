//! What a pool learns from each attempt: outlier ejection (bounded by the
//! pool's `max_ejection_percent`) and the balancer's branch, with the
//! staleness fallback counted and logged when it starts and stops.

use std::sync::atomic::Ordering;

use super::Pool;
use crate::balancing::Branch;
use crate::replica::Replica;
use crate::replica::outlier::{Outcome, ejection_allowed};
use crate::telemetry::Metrics;
use crate::telemetry::clock::now_millis;

/// What went wrong with one attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The TCP connection could not be made.
    Connect,
    /// Connected, but no answer in time.
    Timeout,
    /// The connection broke after the request was (or may have been) sent,
    /// or a stream broke midway.
    Reset,
    /// The replica answered a 5xx other than 503.
    ServerError,
}

impl Pool {
    /// A request to `replica` failed (connect error, timeout, or a 5xx that
    /// is not 503). May eject the replica.
    ///
    /// The pool's `max_ejection_percent` guards against a systemic problem
    /// (a request pattern that makes every replica answer 500, a timeout set
    /// too short) emptying the pool. A refused connection is no such
    /// ambiguity: a replica that cannot be reached cannot serve, so
    /// [`Failure::Connect`] ejects regardless of the share.
    pub fn record_failure(&self, replica: &Replica, failure: Failure, metrics: &Metrics) {
        self.record_failure_at(replica, failure, metrics, now_millis());
    }

    /// [`Pool::record_failure`] at `now` (ms on the process clock, or a
    /// simulation's virtual clock).
    pub fn record_failure_at(
        &self,
        replica: &Replica,
        failure: Failure,
        metrics: &Metrics,
        now: u64,
    ) {
        let outcome = replica.outlier.on_failure(now, &self.outlier, || {
            if failure == Failure::Connect {
                return true;
            }
            let ejected = self
                .replicas
                .iter()
                .filter(|r| r.outlier.is_ejected_at(now))
                .count();
            ejection_allowed(
                self.replicas.len(),
                ejected,
                self.outlier.max_ejection_percent,
            )
        });
        match outcome {
            Outcome::Ejected(time) => {
                metrics
                    .signals
                    .ejections
                    .with_label_values(&[&self.name, &replica.name])
                    .inc();
                metrics
                    .replica_down
                    .with_label_values(&[&self.name, &replica.name])
                    .set(1);
                tracing::warn!(
                    pool = %self.name,
                    replica = %replica.name,
                    ejection_time = %crate::config::format_duration(time),
                    ejections = replica.outlier.ejection_count(),
                    "replica ejected after consecutive failures"
                );
            }
            Outcome::EjectionRefused => tracing::warn!(
                pool = %self.name,
                replica = %replica.name,
                max_ejection_percent = self.outlier.max_ejection_percent,
                "replica keeps failing but the pool may not eject more replicas"
            ),
            Outcome::Counted => {}
        }
    }

    /// A request to `replica` got an answer that says it is alive.
    pub fn record_success(&self, replica: &Replica) {
        // The clock is read only for a replica ejected before (rare).
        replica.outlier.on_success_at(now_millis, &self.outlier);
    }

    /// Counts a balancer decision by branch; the stale-metrics fallback is
    /// also counted on its own and logged when it starts and when it ends.
    pub fn record_branch(&self, branch: Branch, metrics: &Metrics) {
        self.decision_series
            .get(branch, || {
                metrics
                    .decisions
                    .with_label_values(&[&self.name, branch.as_str()])
            })
            .inc();
        let stale = branch == Branch::FallbackStaleMetrics;
        if stale {
            metrics
                .signals
                .stale_fallbacks
                .with_label_values(&[&self.name])
                .inc();
        }
        let uses_signals = !matches!(branch, Branch::Single | Branch::NoHealthy);
        if uses_signals && self.stale_fallback.swap(stale, Ordering::Relaxed) != stale {
            if stale {
                tracing::warn!(pool = %self.name, "scraped load missing or stale: balancing on local counts");
            } else {
                tracing::info!(pool = %self.name, "scraped load fresh again");
            }
        }
    }
}

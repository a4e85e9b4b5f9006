//! The active health-check loop of one replica: `GET /health` every
//! `health.interval`, each bounded by `health.timeout`; `fall` failures in a
//! row take the replica out of rotation and `rise` successes bring it back
//! (HAProxy's `inter 2s fall 3 rise 2` are the defaults). A replica that
//! hangs fails by timeout. Transitions are logged and shown in
//! `llmlb_replica_health_up`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::net::{sleep_or_stop, stopped};
use crate::replica::Transition;

use crate::config::HealthConfig;
use crate::net::Prober;
use crate::replica::Replica;
use crate::telemetry::Metrics;

#[derive(Debug, Clone)]
pub struct CheckTarget {
    pub pool: Arc<str>,
    pub replica: Arc<Replica>,
    pub config: HealthConfig,
}

/// Runs until `stop` turns true (or its sender goes away).
pub async fn run(
    target: CheckTarget,
    prober: Prober,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let cfg = &target.config;
    let (pool, name) = (&*target.pool, target.replica.name.as_str());
    let up_gauge = metrics.signals.health_up.with_label_values(&[pool, name]);
    up_gauge.set(i64::from(target.replica.health.is_up()));
    let mut next = Instant::now();
    loop {
        if sleep_or_stop(next, &mut stop).await {
            return;
        }
        next = later(next, cfg.interval);
        let result = tokio::select! {
            r = prober.get_from(&target.replica.scheme, &target.replica.authority, &cfg.path, cfg.timeout) => r,
            _ = stopped(&mut stop) => return,
        };
        if let Err(e) = &result {
            metrics
                .signals
                .health_check_failures
                .with_label_values(&[pool, name, e.kind()])
                .inc();
        }
        match target
            .replica
            .health
            .record(result.is_ok(), cfg.fall, cfg.rise)
        {
            Some(Transition::WentDown) => {
                let error = result.err().map(|e| e.to_string()).unwrap_or_default();
                tracing::warn!(pool, replica = name, %error, fall = cfg.fall, "replica down: health checks failing");
                up_gauge.set(0);
            }
            Some(Transition::CameUp) => {
                tracing::info!(
                    pool,
                    replica = name,
                    rise = cfg.rise,
                    "replica up: health checks passing"
                );
                up_gauge.set(1);
            }
            None => {}
        }
    }
}

/// The next deadline, skipping ahead when a check overran its slot.
fn later(prev: Instant, interval: Duration) -> Instant {
    let next = prev + interval;
    let now = Instant::now();
    if next < now { now + interval } else { next }
}

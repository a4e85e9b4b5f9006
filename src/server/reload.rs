//! Hot reload: parse and validate a new config; if it is invalid keep serving
//! with the old one, otherwise swap the topology and gateway atomically.
//!
//! Replicas that stay (same pool, address, name, weight and limit) keep their
//! `Arc` and so their in-flight counts and health; a pool queue whose shape is
//! unchanged is kept with its waiters; keys that stay keep their buckets.
//! Requests already running hold the snapshot they started with, so removed
//! replicas finish their streams and receive nothing new.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use prometheus::{IntCounterVec, IntGauge, Registry};

use super::{AppState, Generation};
use crate::config::{self, ConfigError};
use crate::gateway::Gateway;
use crate::pool::Topology;

#[derive(Debug, Clone)]
pub struct ReloadMetrics {
    /// Reload attempts by result (`success`, `failure`).
    pub reloads: IntCounterVec,
    /// 1 when the last reload attempt succeeded.
    pub last_ok: IntGauge,
}

impl ReloadMetrics {
    pub fn new(registry: &Registry) -> ReloadMetrics {
        let family = crate::telemetry::Family::new(registry);
        let reloads = family.counter(
            "llmlb_config_reloads_total",
            "Config reload attempts by result.",
            &["result"],
        );
        let last_ok = family.gauge_one(
            "llmlb_config_last_reload_successful",
            "1 when the last config reload succeeded (or none was tried).",
        );
        last_ok.set(1);
        ReloadMetrics { reloads, last_ok }
    }
}

/// What a successful reload changed.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReloadSummary {
    pub pools: usize,
    pub replicas: usize,
    /// Replicas carried over with their state.
    pub kept_replicas: usize,
    /// Settings that need a restart and were not applied.
    pub needs_restart: Vec<String>,
}

/// Reloads from `path` (or the file llmlb was started with).
pub fn reload(state: &AppState, path: Option<&Path>) -> Result<ReloadSummary, ConfigError> {
    let path: PathBuf = match path.or(state.config_path.get().map(PathBuf::as_path)) {
        Some(p) => p.to_path_buf(),
        None => {
            return Err(ConfigError {
                file: PathBuf::from("<none>"),
                issues: vec![config::ConfigIssue {
                    key: String::new(),
                    reason: "llmlb was not started from a config file".into(),
                }],
            });
        }
    };
    state
        .last_reload_content
        .store(std::fs::read(&path).ok().map(std::sync::Arc::new));
    match config::load(&path) {
        Ok(new) => Ok(apply(state, new)),
        Err(e) => {
            state
                .reload_metrics
                .reloads
                .with_label_values(&["failure"])
                .inc();
            state.reload_metrics.last_ok.set(0);
            tracing::error!(file = %path.display(), errors = %e.one_line(), "config reload rejected; keeping the running config");
            Err(e)
        }
    }
}

/// Rebuilds the topology from the running config after discovery changed a
/// pool's replicas: the same carry-over as a reload, without counting one.
pub fn rebuild(state: &AppState) {
    let writer = state.live.write();
    let current = writer.current();
    let topology = Topology::build(
        &state.discovered.effective(&current.config),
        &state.metrics,
        &state.admission_metrics,
        Some(&current.topology),
    );
    topology.share_prefixes(state.fleet_outbox.as_ref());
    writer.store(Generation {
        config: Arc::clone(&current.config),
        topology: Arc::new(topology),
        gateway: Arc::clone(&current.gateway),
    });
}

/// Swaps in a validated config.
pub fn apply(state: &AppState, new: config::Config) -> ReloadSummary {
    let writer = state.live.write();
    let current = writer.current();
    let (old_config, old_topology) = (&current.config, &current.topology);
    let topology = Topology::build(
        &state.discovered.effective(&new),
        &state.metrics,
        &state.admission_metrics,
        Some(old_topology),
    );
    topology.share_prefixes(state.fleet_outbox.as_ref());
    let gateway = Gateway::build(
        &new,
        Some(&current.gateway),
        Instant::now(),
        &state.shared_limit_metrics,
    );
    let replicas: usize = topology.pools().iter().map(|p| p.replicas.len()).sum();
    let summary = ReloadSummary {
        pools: topology.pools().len(),
        replicas,
        kept_replicas: kept_replicas(old_topology, &topology),
        needs_restart: needs_restart(old_config, &new),
    };
    state.pending.update(&new);
    writer.store(Generation {
        config: Arc::new(new),
        topology: Arc::new(topology),
        gateway: Arc::new(gateway),
    });
    drop(writer);
    state
        .reload_metrics
        .reloads
        .with_label_values(&["success"])
        .inc();
    state.reload_metrics.last_ok.set(1);
    tracing::info!(
        pools = summary.pools,
        replicas = summary.replicas,
        kept = summary.kept_replicas,
        needs_restart = ?summary.needs_restart,
        "config reloaded"
    );
    summary
}

/// The settings that changed but take effect only on a restart (listeners
/// and their limits, TLS, the trace exporter, the drain timeout).
fn needs_restart(old_config: &config::Config, new: &config::Config) -> Vec<String> {
    let mut needs_restart = Vec::new();
    for (key, changed) in [
        (
            "server.listen",
            old_config.server.listen != new.server.listen,
        ),
        (
            "server.admin_listen",
            old_config.server.admin_listen != new.server.admin_listen,
        ),
        ("server.http2", old_config.server.http2 != new.server.http2),
        // Listener limits are fixed when the listeners start.
        (
            "server.max_header_bytes",
            old_config.server.max_header_bytes != new.server.max_header_bytes,
        ),
        (
            "server.max_headers",
            old_config.server.max_headers != new.server.max_headers,
        ),
        (
            "server.header_read_timeout",
            old_config.server.header_read_timeout != new.server.header_read_timeout,
        ),
        (
            "server.client_idle_timeout",
            old_config.server.client_idle_timeout != new.server.client_idle_timeout,
        ),
        (
            "server.max_connections",
            old_config.server.max_connections != new.server.max_connections,
        ),
        ("server.tls", old_config.server.tls != new.server.tls),
        (
            "telemetry.otlp",
            old_config.telemetry.otlp != new.telemetry.otlp,
        ),
        (
            "server.drain_timeout",
            old_config.server.drain_timeout != new.server.drain_timeout,
        ),
    ] {
        if changed {
            needs_restart.push(key.to_string());
        }
    }
    needs_restart
}

/// How many of `new`'s replicas were carried over from `old` with their state.
fn kept_replicas(old_topology: &Topology, topology: &Topology) -> usize {
    let old_ids: Vec<u64> = old_topology
        .pools()
        .iter()
        .flat_map(|p| p.replicas.iter().map(|r| r.id))
        .collect();
    topology
        .pools()
        .iter()
        .flat_map(|p| p.replicas.iter())
        .filter(|r| old_ids.contains(&r.id))
        .count()
}

/// Reloads whenever the file's content changes, checking every `interval`
/// until `shutdown` turns true. Polling (rather than inotify) also sees a
/// Kubernetes ConfigMap update, which swaps a symlink.
/// `loaded` is the content the running config was read from.
pub async fn watch_file(
    state: std::sync::Arc<AppState>,
    path: PathBuf,
    loaded: Option<Vec<u8>>,
    interval: std::time::Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut last = loaded;
    let mut next = tokio::time::Instant::now() + interval;
    loop {
        if crate::net::sleep_or_stop(next, &mut shutdown).await {
            return;
        }
        next += interval;
        let now = std::fs::read(&path).ok();
        let attempted = state.last_reload_content.load();
        if now.is_some() && now.as_deref() == attempted.as_deref().map(|v| v.as_slice()) {
            // SIGHUP or the admin API already (tried to) load this content.
            last = now;
            continue;
        }
        if now.is_some() && now != last {
            last = now;
            tracing::info!(file = %path.display(), "config file changed; reloading");
            let _ = reload(&state, Some(&path));
        }
    }
}

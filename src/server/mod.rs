//! The client-facing edge of the request path: the state every connection
//! shares ([`AppState`]) and the request handler the client listener runs
//! (the daemon starts the listeners).

pub mod access_log;
mod budget;
mod disaggregate;
mod error;
pub mod generation;
mod handler;
mod limit_headers;
mod multipart;
pub mod pending;
mod prompt_tokens;
mod random;
pub mod record;
pub mod reload;
pub mod request;
pub mod scope;
mod send;
mod stage_errors;
mod stages;
pub mod surface;

pub use crate::net::error_response;
pub use error::ApiError;
pub use generation::Generation;
pub use handler::handle;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::admission::AdmissionMetrics;
use crate::config::Config;
use crate::gateway::Gateway;
use crate::pool::Topology;
use crate::telemetry::Metrics;

/// State shared by every connection. The topology is an `ArcSwap` snapshot:
/// each request loads it once and keeps it for its whole life, and a reload
/// swaps in a new one without blocking anybody.
#[derive(Debug)]
pub struct AppState {
    /// Config, topology and gateway, swapped together (see [`generation`]).
    pub live: generation::Live,
    pub metrics: Arc<Metrics>,
    /// Shared: each request's [`crate::admission::Settlement`] holds a
    /// count of it, not a copy of its eight metric families.
    pub admission_metrics: Arc<AdmissionMetrics>,
    /// `/readyz` answers 503 (SIGTERM received; the listener may still accept).
    pub draining: AtomicBool,
    /// The client listener has stopped accepting: new requests that still
    /// arrive on open connections get 503 `shutting_down`.
    pub closing: AtomicBool,
    pub reload_metrics: reload::ReloadMetrics,
    pub shared_limit_metrics: crate::gateway::shared_limits::SharedLimitMetrics,
    pub routing_metrics: crate::routing::RoutingMetrics,
    pub disaggregation_metrics: crate::forwarding::DisaggregationMetrics,
    /// Replicas found by DNS discovery, per pool.
    pub discovered: Arc<crate::discovery::Discovered>,
    pub discovery_metrics: crate::discovery::DiscoveryMetrics,
    /// Per-pool circuit breakers (`max_pending`).
    pub pending: pending::Gates,
    /// The file the config came from, when it came from one (for reloads).
    pub config_path: std::sync::OnceLock<std::path::PathBuf>,
    /// The last dispatch decisions, for the status page.
    pub recent_dispatches: crate::forwarding::RecentDispatches,
    /// The config file's content at the last reload attempt (any trigger),
    /// so the file watcher does not reload again what SIGHUP just loaded.
    pub last_reload_content: arc_swap::ArcSwapOption<Vec<u8>>,
    /// Request body bytes held now (`server.max_buffered_bytes`).
    pub body_budget: budget::BodyBudget,
    /// Request traces, when `[telemetry.otlp]` is configured (fixed at start).
    pub traces: Option<crate::telemetry::trace::Tracing>,
    /// The store shared with other instances, when `[fleet]` is configured
    /// (fixed at start; a reload that changes `[fleet]` is logged and needs
    /// a restart).
    pub fleet: Option<Arc<crate::fleet::Fleet>>,
    /// Where the pools publish their dispatch records for the other
    /// instances (`[fleet] share_prefixes`), and the end the publishing
    /// task takes at start.
    pub fleet_outbox: Option<crate::fleet::PrefixOutbox>,
    fleet_inbox: std::sync::Mutex<Option<tokio::sync::mpsc::Receiver<crate::fleet::PrefixRecord>>>,
}

impl AppState {
    pub fn new(config: Config) -> Arc<AppState> {
        Self::with_traces(config, None)
    }

    pub fn with_traces(
        config: Config,
        traces: Option<crate::telemetry::trace::Tracing>,
    ) -> Arc<AppState> {
        let metrics = Arc::new(Metrics::new());
        let admission_metrics = AdmissionMetrics::new(metrics.registry());
        let discovered = Arc::new(crate::discovery::Discovered::default());
        let discovery_metrics = crate::discovery::DiscoveryMetrics::new(metrics.registry());
        let topology = Topology::build(
            &discovered.effective(&config),
            &metrics,
            &admission_metrics,
            None,
        );
        let shared_limit_metrics =
            crate::gateway::shared_limits::SharedLimitMetrics::new(metrics.registry());
        let gateway = Gateway::build(
            &config,
            None,
            std::time::Instant::now(),
            &shared_limit_metrics,
        );
        let reload_metrics = reload::ReloadMetrics::new(metrics.registry());
        let routing_metrics = crate::routing::RoutingMetrics::new(metrics.registry());
        let disaggregation_metrics =
            crate::forwarding::DisaggregationMetrics::new(metrics.registry());
        let pending = pending::Gates::build(&config);
        let fleet = config.fleet.as_ref().and_then(|f| {
            crate::fleet::Fleet::new(f, &crate::fleet::FleetMetrics::new(metrics.registry()))
        });
        let (fleet_outbox, fleet_inbox) = match &fleet {
            Some(f) if f.config().share_prefixes => {
                let (tx, rx) = crate::fleet::prefixes::outbox(f);
                (Some(tx), Some(rx))
            }
            _ => (None, None),
        };
        topology.share_prefixes(fleet_outbox.as_ref());
        Arc::new(AppState {
            live: generation::Live::new(Generation {
                config: Arc::new(config),
                topology: Arc::new(topology),
                gateway: Arc::new(gateway),
            }),
            metrics,
            admission_metrics: Arc::new(admission_metrics),
            draining: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            reload_metrics,
            shared_limit_metrics,
            routing_metrics,
            disaggregation_metrics,
            pending,
            config_path: std::sync::OnceLock::new(),
            discovered,
            discovery_metrics,
            recent_dispatches: crate::forwarding::RecentDispatches::default(),
            last_reload_content: arc_swap::ArcSwapOption::empty(),
            body_budget: budget::BodyBudget::default(),
            traces,
            fleet,
            fleet_outbox,
            fleet_inbox: std::sync::Mutex::new(fleet_inbox),
        })
    }

    /// The generation in force: read config, topology and gateway from one.
    pub fn generation(&self) -> Arc<Generation> {
        self.live.load()
    }

    /// The config in force (for a reader that needs nothing else).
    pub fn config(&self) -> Arc<Config> {
        Arc::clone(&self.live.load().config)
    }

    /// The topology in force (for a reader that needs nothing else).
    pub fn topology(&self) -> Arc<Topology> {
        Arc::clone(&self.live.load().topology)
    }

    /// The other instances' dispatch records, for the daemon's loop that
    /// folds them into the pools (taken once, at start).
    pub fn take_fleet_inbox(
        &self,
    ) -> Option<tokio::sync::mpsc::Receiver<crate::fleet::PrefixRecord>> {
        self.fleet_inbox.lock().expect("poisoned").take()
    }

    /// Request body bytes being read or held for forwarding now.
    pub fn buffered_bytes(&self) -> usize {
        self.body_budget.used()
    }

    /// Ready to take traffic: not draining and every pool has a live replica.
    pub fn is_ready(&self) -> bool {
        !self.draining.load(Ordering::Relaxed) && self.topology().is_ready()
    }
}

//! The daemon: shared state, the client-facing listener and its request handler.

pub mod access_log;
mod budget;
mod error;
pub mod generation;
mod handler;
mod limit_headers;
mod multipart;
pub mod pending;
mod prompt_tokens;
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

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::admission::AdmissionMetrics;
use crate::config::Config;
use crate::gateway::Gateway;
use crate::net::{ConnMetrics, Limits, accept};
use crate::routing::Topology;
use crate::telemetry::Metrics;

/// State shared by every connection. The topology is an `ArcSwap` snapshot:
/// each request loads it once and keeps it for its whole life, and a reload
/// swaps in a new one without blocking anybody.
#[derive(Debug)]
pub struct AppState {
    /// Config, topology and gateway, swapped together (see [`generation`]).
    pub live: generation::Live,
    pub metrics: Arc<Metrics>,
    pub admission_metrics: AdmissionMetrics,
    /// `/readyz` answers 503 (SIGTERM received; the listener may still accept).
    pub draining: AtomicBool,
    /// The client listener has stopped accepting: new requests that still
    /// arrive on open connections get 503 `shutting_down`.
    pub closing: AtomicBool,
    pub reload_metrics: reload::ReloadMetrics,
    pub shared_limit_metrics: crate::gateway::shared_limits::SharedLimitMetrics,
    pub routing_metrics: crate::routing::RoutingMetrics,
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
        let pending = pending::Gates::build(&config);
        Arc::new(AppState {
            live: generation::Live::new(Generation {
                config: Arc::new(config),
                topology: Arc::new(topology),
                gateway: Arc::new(gateway),
            }),
            metrics,
            admission_metrics,
            draining: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            reload_metrics,
            shared_limit_metrics,
            routing_metrics,
            pending,
            config_path: std::sync::OnceLock::new(),
            discovered,
            discovery_metrics,
            recent_dispatches: crate::forwarding::RecentDispatches::default(),
            last_reload_content: arc_swap::ArcSwapOption::empty(),
            body_budget: budget::BodyBudget::default(),
            traces,
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

    /// Request body bytes being read or held for forwarding now.
    pub fn buffered_bytes(&self) -> usize {
        self.body_budget.used()
    }

    /// Ready to take traffic: not draining and every pool has a live replica.
    pub fn is_ready(&self) -> bool {
        !self.draining.load(Ordering::Relaxed) && self.topology().is_ready()
    }
}

/// A running llmlb: its bound addresses and the means to stop it.
pub struct Running {
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub state: Arc<AppState>,
    shutdown: watch::Sender<bool>,
    admin_shutdown: watch::Sender<bool>,
    client_task: JoinHandle<()>,
    admin_task: JoinHandle<()>,
    /// Scrape and health-check loops.
    background_shutdown: watch::Sender<bool>,
    background_task: JoinHandle<()>,
}

impl Running {
    /// The SIGTERM path: `/readyz` turns 503 at once, the client listener
    /// keeps accepting for `server.drain_delay` (so endpoint updates in front
    /// of llmlb can land), then [`Running::shutdown`].
    pub async fn drain(self) {
        self.state.draining.store(true, Ordering::Relaxed);
        let delay = self.state.config().server.drain_delay;
        tracing::info!(delay = %humantime::format_duration(delay), "draining: not ready; still accepting");
        tokio::time::sleep(delay).await;
        self.shutdown().await;
    }

    /// Stops accepting, lets in-flight requests finish (up to the drain
    /// timeout) and returns when both listeners are closed.
    /// The admin listener keeps answering (`/readyz` says 503) until the
    /// client listener has drained.
    pub async fn shutdown(self) {
        self.state.draining.store(true, Ordering::Relaxed);
        self.state.closing.store(true, Ordering::Relaxed);
        let _ = self.shutdown.send(true);
        let _ = self.client_task.await;
        let _ = self.admin_shutdown.send(true);
        let _ = self.admin_task.await;
        let _ = self.background_shutdown.send(true);
        let _ = self.background_task.await;
        if let Some(traces) = &self.state.traces {
            traces.shutdown().await;
        }
    }
}

/// Starts llmlb on already-bound listeners (tests bind `127.0.0.1:0`).
/// `POST /admin/reload` without a `path` needs [`start_from_file`].
pub fn start(
    config: Config,
    listener: TcpListener,
    admin: TcpListener,
) -> std::io::Result<Running> {
    start_from_file(config, None, listener, admin)
}

/// [`start`] for a config read from `path`: reloads read that file, from
/// the first request the admin listener accepts.
pub fn start_from_file(
    config: Config,
    path: Option<std::path::PathBuf>,
    listener: TcpListener,
    admin: TcpListener,
) -> std::io::Result<Running> {
    let addr = listener.local_addr()?;
    let admin_addr = admin.local_addr()?;
    let traces = match &config.telemetry.otlp {
        Some(otlp) => Some(
            crate::telemetry::trace::Tracing::start(otlp)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?,
        ),
        None => None,
    };
    let state = AppState::with_traces(config, traces);
    if let Some(path) = path {
        let _ = state.config_path.set(path);
    }
    let (shutdown, rx) = watch::channel(false);
    let (admin_shutdown, admin_rx) = watch::channel(false);
    let config = state.config();
    let server = &config.server;
    let mut limits = Limits::from_config(server);
    let admin_limits = Limits {
        http2: false,
        ..limits.clone()
    };
    if let Some(tls) = &server.tls {
        let acceptor = crate::net::client_tls::acceptor(tls, server.http2)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string()))?;
        limits.tls = Some(acceptor);
    }

    let (client_metrics, admin_metrics) = ConnMetrics::register(state.metrics.registry());
    let s = Arc::clone(&state);
    let client = tokio::spawn(accept::run(
        listener,
        move |peer, req| handler::handle(Arc::clone(&s), peer, req),
        rx,
        limits,
        Some(client_metrics),
    ));
    let s = Arc::clone(&state);
    let admin_task = tokio::spawn(accept::run(
        admin,
        move |_peer, req| crate::admin::handle(Arc::clone(&s), req),
        admin_rx,
        admin_limits,
        Some(admin_metrics),
    ));
    let (background_shutdown, background_rx) = watch::channel(false);
    let background_task = tokio::spawn({
        let s = Arc::clone(&state);
        let supervise = crate::background::supervise(
            move || s.topology(),
            Arc::clone(&state.metrics),
            background_rx.clone(),
        );
        let (s, r) = (Arc::clone(&state), Arc::clone(&state));
        let discovery = crate::discovery::run(
            crate::discovery::DiscoveryContext {
                config: move || s.config(),
                discovered: Arc::clone(&state.discovered),
                metrics: state.discovery_metrics.clone(),
                rebuild: move || reload::rebuild(&r),
            },
            background_rx,
        );
        async move {
            tokio::join!(supervise, discovery);
        }
    });
    tracing::info!(%addr, %admin_addr, "llmlb listening");
    Ok(Running {
        addr,
        admin_addr,
        state,
        shutdown,
        admin_shutdown,
        client_task: client,
        admin_task,
        background_shutdown,
        background_task,
    })
}

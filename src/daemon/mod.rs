//! The daemon: starts llmlb on its two listeners (the client listener runs
//! `server`'s request handler, the admin listener `admin`'s), the loops
//! beside the request path ([`loops`]: scrapes, health checks, KV events,
//! the `[fleet]` store; `discovery`), and stops them in order. `llmlb serve` and the tests call
//! [`start`]; nothing on the request path imports this module.

pub mod loops;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::net::{ConnMetrics, Limits, accept};
use crate::server::AppState;

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
        move |peer, req| crate::server::handle(Arc::clone(&s), peer, req),
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
    // The first line a process logs names the listeners (before any
    // loop logs: the fleet store's loop logs when it joins).
    tracing::info!(%addr, %admin_addr, "llmlb listening");
    let (background_shutdown, background_rx) = watch::channel(false);
    let background_task = tokio::spawn({
        let s = Arc::clone(&state);
        let supervise = crate::daemon::loops::supervise(
            move || s.topology(),
            Arc::clone(&state.metrics),
            background_rx.clone(),
        );
        let fleet = state.fleet.clone().map(|fleet| {
            let s = Arc::clone(&state);
            loops::fleet::run(fleet, move || s.topology(), background_rx.clone())
        });
        let prefixes = state
            .fleet
            .clone()
            .zip(state.take_fleet_inbox())
            .map(|(fleet, inbox)| {
                let s = Arc::clone(&state);
                fleet.run_prefixes(
                    inbox,
                    move |record| loops::fleet::fold(&s.topology(), record),
                    background_rx.clone(),
                )
            });
        let (s, r) = (Arc::clone(&state), Arc::clone(&state));
        let discovery = crate::discovery::run(
            crate::discovery::DiscoveryContext {
                config: move || s.config(),
                discovered: Arc::clone(&state.discovered),
                metrics: state.discovery_metrics.clone(),
                rebuild: move || crate::server::reload::rebuild(&r),
            },
            background_rx,
        );
        async move {
            let fleet = async {
                if let Some(f) = fleet {
                    f.await;
                }
            };
            let prefixes = async {
                if let Some(p) = prefixes {
                    p.await;
                }
            };
            tokio::join!(supervise, discovery, fleet, prefixes);
        }
    });
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

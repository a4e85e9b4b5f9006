//! `llmlb replica-sim`: simulated vLLM replicas, for demos, tests, benchmarks and
//! capacity planning without GPUs.
//!
//! Each replica is an HTTP server speaking vLLM's OpenAI API and metrics, in
//! front of an [`engine::Engine`]: a pure state machine that reproduces
//! vLLM's continuous batching, chunked prefill, paged KV cache with prefix
//! caching and preemption, with step times from a per-profile cost model.
//!
//! - [`config`] and [`profile`]: what a replica is (named profiles, TOML overrides);
//! - [`engine`]: the scheduler, KV cache and cost model, clock-injected;
//! - `driver`: runs the engine in scaled real time on a tokio task;
//! - `http`, `openai`, `responses`, `stream`, `server`: the HTTP side;
//! - [`metrics`] and [`exposition`]: vLLM's Prometheus metrics and their
//!   text format; [`faults`]: failure injection;
//! - [`cli`]: the `llmlb replica-sim` command.
//!
//! `docs/SIMULATOR.md` says what is modelled, what is not, and how the
//! profiles compare with a real vLLM.

pub mod cli;
pub mod config;
mod driver;
pub mod engine;
pub mod exposition;
pub mod faults;
mod http;
pub mod metrics;
mod openai;
pub mod profile;
pub mod request_faults;
mod responses;
pub mod role;
mod server;
mod stream;
pub mod text;
mod wake;

pub use config::{ConfigError, FaultConfig, SimConfig};
pub use role::{Role, RoleConfig};

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use arc_swap::ArcSwap;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use driver::{Driver, SimClock};
use engine::{Engine, EngineStats};
use faults::{FaultPatch, Faults};
use http::Replica;

/// A running simulated replica.
pub struct SimHandle {
    pub addr: SocketAddr,
    /// Where the replica publishes its KV-cache events, when it does.
    pub kv_events: Option<SocketAddr>,
    /// Its KV-event replay endpoint, when it has one.
    pub kv_replay: Option<SocketAddr>,
    kv_task: Option<JoinHandle<()>>,
    replica: Arc<Replica>,
    shutdown: watch::Sender<bool>,
    server: JoinHandle<()>,
    driver: JoinHandle<()>,
}

impl SimHandle {
    /// Stops accepting, ends open requests and waits for both tasks.
    pub async fn shutdown(self) {
        let _ = self.shutdown.send(true);
        let _ = self.driver.await;
        let _ = self.server.await;
        if let Some(t) = self.kv_task {
            let _ = t.await;
        }
    }

    /// The engine's statistics as of its last change.
    pub fn stats(&self) -> Arc<EngineStats> {
        self.replica.stats.load_full()
    }

    pub fn config(&self) -> &SimConfig {
        &self.replica.config
    }

    /// The current fault settings.
    pub fn faults(&self) -> FaultConfig {
        self.replica.faults.snapshot()
    }

    /// Changes fault settings, as `POST /sim/fault` does.
    pub fn set_faults(&self, patch: &FaultPatch) -> Result<FaultConfig, String> {
        self.replica.faults.apply(patch)
    }
}

/// Where a replica publishes KV-cache events (`llmlb replica-sim --kv-events-port`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvEventsAddrs {
    /// The PUB socket (port 0: any free port).
    pub events: SocketAddr,
    /// The replay ROUTER socket, if any.
    pub replay: Option<SocketAddr>,
}

/// Batches the replay endpoint keeps, as vLLM's default `buffer_steps`.
const KV_REPLAY_BUFFER: usize = 10_000;

/// Serves one simulated replica on an already-bound listener, on the current
/// tokio runtime.
///
/// # Panics
/// When `config` fails [`SimConfig::validate`] (the CLI validates first), or
/// when called outside a tokio runtime.
pub fn spawn(listener: TcpListener, config: SimConfig) -> SimHandle {
    spawn_inner(listener, config, None)
}

/// [`spawn`], publishing the engine's KV-cache events as vLLM does
/// (`--kv-events-config`): same frames, same msgpack layout, topic `kv`.
pub async fn spawn_with_kv_events(
    listener: TcpListener,
    config: SimConfig,
    kv: KvEventsAddrs,
) -> Result<SimHandle, crate::kv_events::publisher::PublishError> {
    let (stop, stop_rx) = watch::channel(false);
    let handle =
        crate::kv_events::publisher::start(kv.events, kv.replay, "kv", KV_REPLAY_BUFFER, stop_rx)
            .await?;
    let mut sim = spawn_inner(listener, config, Some(handle.publisher.clone()));
    sim.kv_events = Some(handle.events_addr);
    sim.kv_replay = handle.replay_addr;
    // Stop the publisher when the replica stops.
    let mut replica_stop = sim.replica.shutdown.clone();
    let task = handle.task;
    sim.kv_task = Some(tokio::spawn(async move {
        let _ = replica_stop.wait_for(|s| *s).await;
        let _ = stop.send(true);
        let _ = task.await;
    }));
    Ok(sim)
}

fn spawn_inner(
    listener: TcpListener,
    config: SimConfig,
    kv_events: Option<crate::kv_events::publisher::Publisher>,
) -> SimHandle {
    if let Err(e) = config.validate() {
        panic!("llmlb replica-sim: invalid config: {e}");
    }
    let addr = listener
        .local_addr()
        .expect("a bound listener has a local address");
    let (shutdown, shutdown_rx) = watch::channel(false);
    let (commands, commands_rx) = mpsc::unbounded_channel();
    let clock = SimClock {
        origin: tokio::time::Instant::now(),
        scale: config.time_scale,
    };
    let mut engine = Engine::new(config.engine.clone(), config.cost.clone(), config.seed);
    if kv_events.is_some() {
        engine.record_kv_events();
    }
    let stats = Arc::new(ArcSwap::from_pointee(engine.stats().clone()));
    let faults = Arc::new(Faults::new(config.faults.clone(), config.seed));
    let driver = Driver {
        engine,
        clock,
        faults: Arc::clone(&faults),
        stats: Arc::clone(&stats),
        commands: commands_rx,
        shutdown: shutdown_rx.clone(),
        kv_events,
        transfer: config.disaggregation.clone(),
        arriving: Vec::new(),
        wake: wake::Wake::for_current_clock(),
    };
    let tokenizer = config
        .tokenizer()
        .expect("the tokenizer loaded when the config was validated");
    let replica = Arc::new(Replica {
        tokenizer,
        config,
        faults,
        stats,
        commands,
        clock,
        created_unix: http::unix_now(),
        next_id: AtomicU64::new(1),
        id_salt: rand::random(),
        shutdown: shutdown_rx.clone(),
        addr,
    });
    let driver = tokio::spawn(driver.run());
    let server = tokio::spawn(server::serve(listener, Arc::clone(&replica), shutdown_rx));
    tracing::info!(%addr, model = %replica.config.model, "sim replica listening");
    SimHandle {
        addr,
        kv_events: None,
        kv_replay: None,
        kv_task: None,
        replica,
        shutdown,
        server,
        driver,
    }
}

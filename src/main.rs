//! The `llmlb` command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use llmlb::config;
use llmlb::telemetry::{LogFormat, init_logging};

/// The process's allocator: a proxied request makes tens of small, short-lived
/// allocations across two worker threads, which mimalloc's per-thread free
/// lists serve in a fraction of glibc malloc's instructions
/// (docs/BENCHMARKS.md, "Proxy overhead").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "llmlb",
    version,
    about = "A load balancer for LLM inference fleets"
)]
struct Cli {
    /// Log line format on stderr (filter with RUST_LOG; default `info`, `error` for `demo`).
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy.
    Serve {
        /// The TOML config file.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Validate a config file: print a summary and exit 0, or every error and exit 1.
    Check {
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Probe each pool's running replicas: do the tokenizer, block size, KV
    /// events and replay llmlb is configured with agree with what they do?
    /// Exits 1 when something is wrong (see docs/ROUTING.md).
    Doctor {
        #[arg(long, short)]
        config: PathBuf,
        /// Seconds to listen for the probe's KV events after sending it.
        #[arg(long, default_value_t = 5.0, value_name = "SECONDS")]
        events_wait: f64,
        /// Seconds to wait for one probe answer.
        #[arg(long, default_value_t = 60.0, value_name = "SECONDS")]
        timeout: f64,
        /// A replica-sim profile (name or file) used to plan this fleet: say
        /// when it was fitted on another host, engine version or model.
        #[arg(long)]
        profile: Option<String>,
    },
    /// Print the SHA-256 of an API key, for `[[keys]] sha256 = ...`.
    /// Reads the key from standard input when not given.
    HashKey {
        /// The key (prefer standard input: arguments end up in shell history).
        key: Option<String>,
    },
    /// Load an OpenAI-compatible server with streaming requests and report
    /// TTFT, TPOT, throughput and goodput.
    Bench(Box<llmlb::bench::cli::BenchArgs>),
    /// Run simulated vLLM replicas (see docs/SIMULATOR.md).
    Sim(Box<llmlb::sim::cli::SimArgs>),
    /// Simulate a whole fleet on a virtual clock with llmlb's own routing
    /// and balancing: compare policies, size a fleet, inject faults (see
    /// docs/SIMULATOR.md and docs/CAPACITY.md).
    Simulate(Box<llmlb::simulate::cli::SimulateArgs>),
    /// Fit a replica-sim engine profile to a running replica: probe it
    /// (bounded in requests and time), fit the step-time model, write the
    /// profile file that `--profile FILE` takes (see docs/CAPACITY.md).
    Calibrate(Box<llmlb::calibrate::CalibrateArgs>),
    /// Start a simulated fleet and the proxy, run the same short workload
    /// through each balancer, and print a comparison table.
    Demo(Box<llmlb::demo::DemoArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_filter = match cli.command {
        Command::Demo(_) => llmlb::demo::DEFAULT_LOG_FILTER,
        _ => "info",
    };
    init_logging(cli.log_format, default_filter);
    let result = match cli.command {
        Command::Serve { config } => serve(&config),
        Command::Check { config } => return check(&config),
        Command::Doctor {
            config,
            events_wait,
            timeout,
            profile,
        } => return doctor(&config, events_wait, timeout, profile),
        Command::HashKey { key } => hash_key(key),
        Command::Bench(args) => bench(*args),
        Command::Sim(args) => sim(*args),
        Command::Simulate(args) => simulate(&args),
        Command::Calibrate(args) => calibrate(&args),
        Command::Demo(args) => demo(*args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("llmlb: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn check(path: &Path) -> ExitCode {
    match config::load(path) {
        Ok(c) => {
            println!("{}: ok", path.display());
            println!(
                "  listen {} (admin {})",
                c.server.listen, c.server.admin_listen
            );
            for p in &c.pools {
                println!(
                    "  pool {:?}: {} replica(s), balancer {}, models {}",
                    p.name,
                    p.replicas.len(),
                    p.balancer.as_str(),
                    p.models.join(", ")
                );
                match &p.tokenizer {
                    Some(t) => println!("    tokenizer {}", t.dir.display()),
                    None => println!(
                        "    tokenizer: stand-in (token counts approximate; set [pools.tokenizer] dir)"
                    ),
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            eprintln!("{}: {} error(s)", path.display(), e.issues.len());
            ExitCode::FAILURE
        }
    }
}

fn doctor(path: &Path, events_wait: f64, timeout: f64, profile: Option<String>) -> ExitCode {
    let cfg = match config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let profile = match profile {
        None => None,
        Some(name) => match llmlb::sim::SimConfig::named_or_file(&name) {
            Ok(p) => Some((name, p)),
            Err(e) => {
                eprintln!("--profile: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let opts = llmlb::doctor::Options {
        events_wait: std::time::Duration::from_secs_f64(events_wait.clamp(0.0, 600.0)),
        request_timeout: std::time::Duration::from_secs_f64(timeout.clamp(0.1, 3600.0)),
        profile,
        ..Default::default()
    };
    let report = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt.block_on(llmlb::doctor::run(&cfg, &opts)),
        Err(e) => {
            eprintln!("llmlb: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", report.render());
    if report.worst() == llmlb::doctor::Severity::Error {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn hash_key(key: Option<String>) -> anyhow::Result<()> {
    let key = match key {
        Some(k) => k,
        None => {
            let mut line = String::new();
            std::io::stdin()
                .read_line(&mut line)
                .context("reading the key from standard input")?;
            line.trim_end_matches(['\r', '\n']).to_string()
        }
    };
    anyhow::ensure!(!key.is_empty(), "the key is empty");
    println!("{}", llmlb::gateway::keys::hash_key(&key));
    Ok(())
}

fn bench(args: llmlb::bench::cli::BenchArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(llmlb::bench::cli::main(args))?;
    Ok(())
}

fn serve(path: &Path) -> anyhow::Result<()> {
    let loaded = std::fs::read(path).ok();
    let cfg = config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(cfg.server.listen)
            .await
            .with_context(|| format!("binding server.listen {}", cfg.server.listen))?;
        let admin = tokio::net::TcpListener::bind(cfg.server.admin_listen)
            .await
            .with_context(|| format!("binding server.admin_listen {}", cfg.server.admin_listen))?;
        let watch_interval = cfg.server.watch_interval;
        // Before "listening" is logged: a SIGTERM right after start drains.
        let signals = Signals::install();
        let running =
            llmlb::server::start_from_file(cfg, Some(path.to_path_buf()), listener, admin)?;
        let (stop_watch, watch_rx) = tokio::sync::watch::channel(false);
        if !watch_interval.is_zero() {
            tokio::spawn(llmlb::server::reload::watch_file(
                std::sync::Arc::clone(&running.state),
                path.to_path_buf(),
                loaded,
                watch_interval,
                watch_rx,
            ));
        }
        signals.wait_for_shutdown(&running.state).await;
        let _ = stop_watch.send(true);
        tracing::info!("shutting down: draining");
        running.drain().await;
        tracing::info!("stopped");
        Ok(())
    })
}

fn demo(args: llmlb::demo::DemoArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(llmlb::demo::run(args))?;
    Ok(())
}

fn simulate(args: &llmlb::simulate::cli::SimulateArgs) -> anyhow::Result<()> {
    let text = llmlb::simulate::cli::execute(args)?;
    print!("{text}");
    Ok(())
}

fn calibrate(args: &llmlb::calibrate::CalibrateArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let cal = runtime.block_on(llmlb::calibrate::run(args))?;
    print!("{}", llmlb::calibrate::summary(&cal, &args.output));
    Ok(())
}

fn sim(args: llmlb::sim::cli::SimArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(llmlb::sim::cli::run(args, wait_for_signal()))?;
    Ok(())
}

/// Waits for SIGTERM or SIGINT.
async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
}

/// The signals `llmlb serve` answers, installed before it starts listening.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> Signals {
        use tokio::signal::unix::{SignalKind, signal};
        Signals {
            term: signal(SignalKind::terminate()).expect("install SIGTERM handler"),
            int: signal(SignalKind::interrupt()).expect("install SIGINT handler"),
            hup: signal(SignalKind::hangup()).expect("install SIGHUP handler"),
        }
    }

    /// Waits for SIGTERM or SIGINT; reloads the config on each SIGHUP meanwhile.
    async fn wait_for_shutdown(mut self, state: &llmlb::server::AppState) {
        loop {
            tokio::select! {
                _ = self.term.recv() => return,
                _ = self.int.recv() => return,
                _ = self.hup.recv() => {
                    tracing::info!("SIGHUP: reloading the config");
                    let _ = llmlb::server::reload::reload(state, None);
                }
            }
        }
    }
}

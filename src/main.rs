//! The `llmlb` command line.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use llmlb::config;
use llmlb::telemetry::{LogFormat, init_logging};

#[derive(Parser)]
#[command(
    name = "llmlb",
    version,
    about = "A load balancer for LLM inference fleets"
)]
struct Cli {
    /// Log line format on stderr (filter with RUST_LOG, default `info`).
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
    /// Run simulated vLLM replicas (see docs/SIMULATOR.md).
    Sim(Box<llmlb::sim::cli::SimArgs>),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    let result = match cli.command {
        Command::Serve { config } => serve(&config),
        Command::Check { config } => return check(&config),
        Command::Sim(args) => sim(*args),
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

fn serve(path: &Path) -> anyhow::Result<()> {
    let cfg = config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(cfg.server.listen)
            .await
            .with_context(|| format!("binding server.listen {}", cfg.server.listen))?;
        let admin = tokio::net::TcpListener::bind(cfg.server.admin_listen)
            .await
            .with_context(|| format!("binding server.admin_listen {}", cfg.server.admin_listen))?;
        let running = llmlb::server::start(cfg, listener, admin)?;
        wait_for_signal().await;
        tracing::info!("shutting down: draining in-flight requests");
        running.shutdown().await;
        tracing::info!("stopped");
        Ok(())
    })
}

fn sim(args: llmlb::sim::cli::SimArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(llmlb::sim::cli::run(args, wait_for_signal()))?;
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
    tokio::select! {
        _ = term.recv() => {},
        _ = int.recv() => {},
    }
}

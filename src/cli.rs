//! The `llmlb` command line: the subcommands, their flags, and each one's
//! start (a runtime, the call into its module, the exit code). It lives in
//! the library, not in `main.rs`, so that the async code under each
//! subcommand is compiled once, with the library, and the binary stays a
//! thin shell that links (docs/lab/build-time.md).

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::config;
use crate::telemetry::{LogFormat, init_logging};

#[derive(Parser)]
#[command(
    name = "llmlb",
    version,
    about = "A load balancer for LLM inference fleets"
)]
struct Cli {
    /// Log line format on stderr (the filter is RUST_LOG's).
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy.
    Serve {
        /// The TOML config file (docs/CONFIG.md).
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Validate a config file: print a summary and exit 0, or every error and exit 1.
    Check {
        /// The TOML config file to validate.
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Probe each pool's running replicas: do the model names, tokenizer,
    /// block size, KV events and replay llmlb is configured with agree with
    /// what they serve? Exits 1 when something is wrong.
    Doctor {
        /// The TOML config file whose replicas to probe.
        #[arg(long, short)]
        config: PathBuf,
        /// How long to listen for the probe's KV events after sending it.
        #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
        events_wait: Duration,
        /// Longest wait for one probe answer.
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        timeout: Duration,
        /// A replica-sim profile (name or file) used to plan this fleet: say
        /// when it was fitted on another host, engine version or model.
        /// [default: none]
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
    Bench(Box<crate::bench::cli::BenchArgs>),
    /// Serve simulated vLLM replicas over HTTP: the OpenAI API, /metrics,
    /// KV events (docs/SIMULATOR.md).
    #[command(name = "replica-sim", alias = "sim")]
    ReplicaSim(Box<crate::replica_sim::cli::SimArgs>),
    /// Simulate a whole fleet on a virtual clock with llmlb's own routing
    /// and balancing: compare policies, size a fleet, inject faults
    /// (docs/CAPACITY.md).
    #[command(name = "fleet-sim", alias = "simulate")]
    FleetSim(Box<crate::fleet_sim::cli::SimulateArgs>),
    /// Fit a replica-sim engine profile to a running replica: probe it
    /// (bounded in requests and time), fit the step-time model, write the
    /// profile file that `--profile FILE` takes (docs/CAPACITY.md).
    Calibrate(Box<crate::calibrate::CalibrateArgs>),
    /// Start a simulated fleet and the proxy, run the same short workload
    /// through each balancer, and print a comparison table.
    Demo(Box<crate::demo::DemoArgs>),
}

/// Parses the command line, runs the subcommand, and returns its exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let default_filter = match cli.command {
        Command::Demo(_) => crate::demo::DEFAULT_LOG_FILTER,
        _ => "info",
    };
    let log = init_logging(cli.log_format, default_filter);
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
        Command::ReplicaSim(args) => replica_sim(*args),
        Command::FleetSim(args) => fleet_sim(&args),
        Command::Calibrate(args) => calibrate(&args),
        Command::Demo(args) => demo(*args),
    };
    // Every log line out before the last word.
    drop(log);
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
                if p.role == config::PoolRole::Prefill {
                    println!("    role prefill: prefills for the pools that name it");
                }
                if let Some(d) = &p.disaggregation {
                    println!(
                        "    disaggregated: prefill pool {:?}, protocol {}, when {} (min {} uncached tokens)",
                        d.prefill_pool,
                        d.protocol.as_str(),
                        d.when.as_str(),
                        d.min_uncached_tokens
                    );
                }
                match &p.tokenizer {
                    Some(t) => println!("    tokenizer {}", t.dir.display()),
                    None => println!(
                        "    tokenizer: stand-in (token counts approximate; set [pools.tokenizer] dir)"
                    ),
                }
                let priority = config::priority_hint(c.tiers.len(), p);
                let hints = config::prefix_hints(p).into_iter().chain(priority);
                let objectives = c.priorities.iter().any(|l| l.ttft_objective.is_some());
                for hint in hints.chain(config::prefill_hints(objectives, p)) {
                    println!("    hint: {hint}");
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

fn doctor(
    path: &Path,
    events_wait: Duration,
    timeout: Duration,
    profile: Option<String>,
) -> ExitCode {
    let cfg = match config::load(path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let profile = match profile {
        None => None,
        Some(name) => match crate::replica_sim::SimConfig::named_or_file(&name) {
            Ok(p) => Some(crate::doctor::profile::Planned {
                name,
                fitted: p.fitted.map(|f| crate::doctor::profile::FittedOn {
                    date: f.date,
                    url: f.url,
                    model: f.model,
                    engine: f.engine,
                    engine_version: f.engine_version,
                    host: f.host,
                    cpu: f.cpu,
                }),
                host: crate::calibrate::this_host(),
                cpu: crate::calibrate::this_cpu(),
            }),
            Err(e) => {
                eprintln!("--profile: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    let opts = crate::doctor::Options {
        events_wait: events_wait.min(Duration::from_secs(600)),
        request_timeout: timeout.clamp(Duration::from_millis(100), Duration::from_secs(3600)),
        profile,
        ..Default::default()
    };
    let report = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt.block_on(crate::doctor::run(&cfg, &opts)),
        Err(e) => {
            eprintln!("llmlb: starting the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", report.render());
    if report.worst() == crate::doctor::Severity::Error {
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
    println!("{}", crate::gateway::keys::hash_key(&key));
    Ok(())
}

fn bench(args: crate::bench::cli::BenchArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(crate::bench::cli::main(args))?;
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
            crate::daemon::start_from_file(cfg, Some(path.to_path_buf()), listener, admin)?;
        let (stop_watch, watch_rx) = tokio::sync::watch::channel(false);
        if !watch_interval.is_zero() {
            tokio::spawn(crate::server::reload::watch_file(
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

fn demo(args: crate::demo::DemoArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(crate::demo::run(args))?;
    Ok(())
}

fn fleet_sim(args: &crate::fleet_sim::cli::SimulateArgs) -> anyhow::Result<()> {
    let text = crate::fleet_sim::cli::execute(args)?;
    print!("{text}");
    Ok(())
}

fn calibrate(args: &crate::calibrate::CalibrateArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    let cal = runtime.block_on(crate::calibrate::run(args))?;
    print!("{}", crate::calibrate::summary(&cal, &args.output));
    Ok(())
}

fn replica_sim(args: crate::replica_sim::cli::SimArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(crate::replica_sim::cli::run(args, wait_for_signal()))?;
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
    async fn wait_for_shutdown(mut self, state: &crate::server::AppState) {
        loop {
            tokio::select! {
                _ = self.term.recv() => return,
                _ = self.int.recv() => return,
                _ = self.hup.recv() => {
                    tracing::info!("SIGHUP: reloading the config");
                    let _ = crate::server::reload::reload(state, None);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::{ArgAction, CommandFactory};

    /// Every flag of every subcommand says what it does and what it is
    /// when not given: clap's `[default: ...]`, or one written in its help.
    #[test]
    fn every_flag_has_help_and_a_default() {
        let mut missing = Vec::new();
        let root = Cli::command();
        let mut commands = vec![(String::from("llmlb"), root)];
        while let Some((path, cmd)) = commands.pop() {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
                let long = arg
                    .get_long_help()
                    .map(|h| h.to_string())
                    .unwrap_or_default();
                let text = format!("{help} {long}");
                if text.trim().is_empty() {
                    missing.push(format!("{path} --{id}: no help"));
                    continue;
                }
                let is_switch = matches!(arg.get_action(), ArgAction::SetTrue);
                let has_default = !arg.get_default_values().is_empty()
                    || text.contains("[default:")
                    || text.contains("required")
                    || arg.is_required_set()
                    || arg.is_positional()
                    || is_switch;
                if !has_default {
                    missing.push(format!("{path} --{id}: no default shown"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_name() != "help" {
                    commands.push((format!("{path} {}", sub.get_name()), sub.clone()));
                }
            }
        }
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }

    /// The old names of the two simulators still parse, as hidden aliases.
    #[test]
    fn old_simulator_names_still_parse() {
        use clap::Parser;
        for argv in [
            ["llmlb", "sim", "--replicas", "2"].as_slice(),
            ["llmlb", "replica-sim", "--replicas", "2"].as_slice(),
        ] {
            let cli = Cli::try_parse_from(argv).unwrap();
            assert!(matches!(cli.command, super::Command::ReplicaSim(_)));
        }
        for argv in [
            ["llmlb", "simulate", "--workload", "random"].as_slice(),
            ["llmlb", "fleet-sim", "--workload", "random"].as_slice(),
        ] {
            let cli = Cli::try_parse_from(argv).unwrap();
            assert!(matches!(cli.command, super::Command::FleetSim(_)));
        }
        let help = Cli::command().render_help().to_string();
        assert!(help.contains("replica-sim") && help.contains("fleet-sim"));
        assert!(!help.contains(" sim ") && !help.contains("simulate "));
    }
}

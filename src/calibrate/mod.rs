//! `llmlb calibrate`: fits a replica-sim engine profile to a running replica.
//!
//! Pointed at one idle replica (vLLM or any OpenAI-compatible server that
//! takes token-id prompts), it reads the served model and its context
//! length (`/v1/models`), the engine version (`/version`) and the KV-cache
//! shape (`vllm:cache_config_info`), refuses a replica that is already
//! serving requests (its running and waiting counts) unless forced, sends
//! the probes of [`probes::plan`] (single prefills of growing length, decode
//! batches of growing size, a burst of one-token requests, decodes over a
//! long context) with a progress line, in three rounds by default (each
//! probe's figures are its median over them), within a bound on requests
//! and on time, fits the step-time model ([`fit`]), and writes a complete profile
//! file: the host, model, engine version and date in its `[fitted]` table,
//! the fitted-against-measured table in its header comment.
//!
//! The file is what `--profile FILE` takes in `llmlb replica-sim`,
//! `llmlb fleet-sim` and `llmlb demo`; `llmlb doctor --profile FILE` says
//! when it was fitted on another host or engine version.
//!
//! A tool beside the proxy: it uses the load generator's client and the
//! simulator's profile types, and nothing of the request path.

pub mod fit;
pub mod probes;
pub mod replica;
mod write;

use std::io::{IsTerminal, Write as _};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use clap::Args;
use tokio::time::Instant;

use crate::bench::client::{BenchClient, parse_target};
use crate::bench::text::SplitMix;
use crate::replica_sim::config::{FaultConfig, Fitted, SimConfig};
use crate::replica_sim::engine::EngineParams;

pub use fit::{Fit, Measured, ProbeKind, Row};

#[derive(Args, Debug, Clone)]
pub struct CalibrateArgs {
    /// The replica's base URL (`http://host:port`).
    #[arg(long)]
    pub url: String,
    /// The model to probe. [default: the first the replica serves]
    #[arg(long)]
    pub model: Option<String>,
    /// Sent as `Authorization: Bearer KEY`. [default: none]
    #[arg(long)]
    pub api_key: Option<String>,
    /// Where to write the profile (TOML).
    #[arg(long, short)]
    pub output: PathBuf,
    /// Also write the probes' measurements and the fit as JSON. [default: none]
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// The replica's `--max-num-seqs` (it does not export it).
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: usize,
    /// The replica's `--max-num-batched-tokens` (it does not export it).
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: usize,
    /// The context length. [default: what `/v1/models` says]
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Tokens per KV block. [default: `vllm:cache_config_info`'s]
    #[arg(long)]
    pub block_size: Option<usize>,
    /// KV blocks, null block included. [default: `vllm:cache_config_info`'s]
    #[arg(long)]
    pub num_blocks: Option<usize>,
    /// Times the plan is sent, one whole round after another. Each probe's
    /// figures are its median over the rounds, so that a slow spell of a
    /// shared machine moves one round of a probe, not the fit.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=9))]
    pub rounds: u32,
    /// Most probe requests to send, all rounds together.
    #[arg(long, default_value_t = 2000)]
    pub requests: usize,
    /// Longest the probes may take; groups not sent by then are skipped.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub time_limit: Duration,
    /// Longest one probe request may take.
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Probe a replica that is already serving requests (the fit then
    /// measures that traffic too).
    #[arg(long)]
    pub force: bool,
    /// Allow a replica that is not on this machine.
    #[arg(long)]
    pub allow_remote: bool,
    /// A model directory whose tokenizer the profile names (`tokenizer_dir`).
    /// [default: none, the stand-in tokenizer]
    #[arg(long)]
    pub tokenizer_dir: Option<PathBuf>,
    /// Seeds the probes' random prompts.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    #[error("{0}")]
    Target(String),
    #[error(
        "the replica is serving other requests ({running} running, {waiting} waiting): \
         the probes would measure that traffic too. Calibrate an idle replica, or pass --force"
    )]
    Busy { running: f64, waiting: f64 },
    #[error("{0}")]
    Fit(#[from] fit::FitError),
    #[error("writing {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("the fitted profile is invalid: {0}")]
    Invalid(String),
}

/// What a run produced.
#[derive(Debug, serde::Serialize)]
pub struct Calibration {
    pub fitted: Fitted,
    pub probes: Vec<Measured>,
    pub fit: Fit,
    /// Requests the replica finished that the probes did not send.
    pub foreign_requests: f64,
    /// Groups of the plan not sent (the bound on requests or time).
    pub skipped_groups: usize,
    #[serde(skip)]
    pub profile: SimConfig,
}

pub async fn run(args: &CalibrateArgs) -> Result<Calibration, CalibrateError> {
    let base = parse_target(&args.url, args.allow_remote)
        .map_err(|e| CalibrateError::Target(e.to_string()))?;
    let replica =
        replica::Replica::new(&base, args.api_key.as_deref()).map_err(CalibrateError::Target)?;
    let target = |e: String| CalibrateError::Target(format!("{base}: {e}"));
    let models = replica.models().await.map_err(target)?;
    let (model, served_len) = match &args.model {
        Some(m) => (
            m.clone(),
            models.iter().find(|(id, _)| id == m).and_then(|(_, l)| *l),
        ),
        None => models
            .first()
            .cloned()
            .ok_or_else(|| target("GET /v1/models lists no model; pass --model".into()))?,
    };
    let max_model_len = args.max_model_len.or(served_len).ok_or_else(|| {
        target(format!(
            "the replica does not say the context length of {model}; pass --max-model-len"
        ))
    })?;
    let before = replica.metrics().await.map_err(target)?;
    if !args.force && before.running + before.waiting > 0.0 {
        return Err(CalibrateError::Busy {
            running: before.running,
            waiting: before.waiting,
        });
    }
    let block_size = args.block_size.or(before.block_size).ok_or_else(|| {
        target("the replica does not export vllm:cache_config_info; pass --block-size".into())
    })?;
    let num_blocks = args.num_blocks.or(before.num_gpu_blocks).ok_or_else(|| {
        target("the replica does not export vllm:cache_config_info; pass --num-blocks".into())
    })?;
    let version = replica.version().await;
    let shape = probes::Shape {
        max_model_len,
        max_num_seqs: args.max_num_seqs,
        kv_tokens: Some(num_blocks.saturating_sub(1) * block_size),
        block_size,
    };
    let plan = probes::plan(&shape);
    let client = Arc::new(
        BenchClient::new(
            &args.url,
            args.allow_remote,
            &model,
            &[],
            args.api_key.as_deref(),
            args.timeout,
        )
        .map_err(|e| CalibrateError::Target(e.to_string()))?,
    );

    let start = Instant::now();
    let (measured, sent, skipped) = send_rounds(args, &client, &replica, &plan).await;
    let seconds = start.elapsed().as_secs_f64();
    let after = replica.metrics().await.ok();
    let ours: usize = measured.iter().map(|m| m.ok).sum();
    let foreign_requests = after
        .map(|a| (a.finished - before.finished - ours as f64).max(0.0))
        .unwrap_or(0.0);

    let fit = fit::fit(&measured, args.max_num_seqs)?;
    let fitted = Fitted {
        date: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        url: base.clone(),
        model: model.clone(),
        engine: if before.vllm { "vllm" } else { "unknown" }.into(),
        engine_version: version,
        host: this_host(),
        cpu: this_cpu(),
        requests: sent as u64,
        seconds,
    };
    let profile = SimConfig {
        model,
        time_scale: 1.0,
        seed: 0,
        default_max_tokens: 16,
        startup_delay: 0.0,
        engine: EngineParams {
            block_size,
            num_blocks,
            max_num_seqs: args.max_num_seqs,
            max_num_batched_tokens: args.max_num_batched_tokens,
            max_model_len,
            enable_prefix_caching: true,
            priority_scheduling: false,
        },
        cost: fit.cost.clone(),
        faults: FaultConfig::default(),
        tokenizer_dir: args.tokenizer_dir.clone(),
        fitted: Some(fitted.clone()),
        disaggregation: Default::default(),
    };
    profile.validate().map_err(CalibrateError::Invalid)?;
    let cal = Calibration {
        fitted,
        probes: measured,
        fit,
        foreign_requests,
        skipped_groups: skipped,
        profile,
    };
    let text = write::profile_text(&cal);
    std::fs::write(&args.output, text).map_err(|source| CalibrateError::Write {
        path: args.output.display().to_string(),
        source,
    })?;
    if let Some(path) = &args.out {
        let json = serde_json::to_string_pretty(&cal).expect("the report serializes");
        std::fs::write(path, json).map_err(|source| CalibrateError::Write {
            path: path.display().to_string(),
            source,
        })?;
    }
    Ok(cal)
}

/// Sends the plan `args.rounds` times, within the bounds on requests and
/// time, and returns each probe's rounds merged ([`Measured::merge`]), the
/// requests sent, and the probes no round of which was sent.
async fn send_rounds(
    args: &CalibrateArgs,
    client: &Arc<BenchClient>,
    replica: &replica::Replica,
    plan: &[probes::Group],
) -> (Vec<Measured>, usize, usize) {
    let rounds = args.rounds.max(1) as usize;
    let planned: usize = plan.iter().map(|g| g.requests).sum::<usize>() * rounds;
    let progress = Progress::new(
        planned.min(args.requests),
        plan.len() * rounds,
        args.time_limit,
    );
    let deadline = Instant::now() + args.time_limit;
    let mut rng = SplitMix::new(args.seed ^ 0x00ca_11b7);
    let mut by_probe: Vec<Vec<Measured>> = vec![Vec::new(); plan.len()];
    let mut sent = 0;
    for round in 0..rounds {
        for (i, g) in plan.iter().enumerate() {
            if sent + g.requests > args.requests || Instant::now() >= deadline {
                continue;
            }
            progress.group(round * plan.len() + i, g);
            let m = probes::run_group(client, replica, g, &mut rng, deadline, &|| progress.done())
                .await;
            sent += m.ok + m.failed;
            if m.failed > 0 {
                progress.note(&format!(
                    "{} at batch {}: {} of {} requests failed ({})",
                    g.kind.label(),
                    g.concurrency,
                    m.failed,
                    m.ok + m.failed,
                    m.error.as_deref().unwrap_or("no message")
                ));
            }
            by_probe[i].push(m);
            probes::settle().await;
        }
    }
    progress.finish();
    let skipped = by_probe.iter().filter(|r| r.is_empty()).count();
    let measured = by_probe.iter().filter_map(|r| Measured::merge(r)).collect();
    (measured, sent, skipped)
}

/// The summary printed after a run: the table, and what to look at.
pub fn summary(cal: &Calibration, output: &std::path::Path) -> String {
    let mut s = write::table(&cal.fit.rows);
    s.push_str(&format!(
        "\n{} probe requests in {:.0} s; profile written to {}\n",
        cal.fitted.requests,
        cal.fitted.seconds,
        output.display()
    ));
    if cal.skipped_groups > 0 {
        s.push_str(&format!(
            "{} probe groups were not sent (--requests or --time-limit): the fit rests on fewer points\n",
            cal.skipped_groups
        ));
    }
    if cal.foreign_requests > 0.0 {
        s.push_str(&format!(
            "warning: the replica finished {} requests the probes did not send: the fit measured that traffic too\n",
            cal.foreign_requests
        ));
    }
    s.push_str(&format!(
        "use it: llmlb fleet-sim --profile {0} ...   llmlb replica-sim --profile {0}\n",
        output.display()
    ));
    s
}

/// This machine's host name.
pub fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

/// This machine's CPU model (Linux), if it says.
pub fn this_cpu() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    info.lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, v)| v.trim().to_owned())
}

/// The progress line on stderr: redrawn in place on a terminal, one line
/// per group otherwise.
struct Progress {
    total: usize,
    groups: usize,
    limit: Duration,
    done: AtomicUsize,
    start: std::time::Instant,
    tty: bool,
    label: std::sync::Mutex<String>,
}

impl Progress {
    fn new(total: usize, groups: usize, limit: Duration) -> Progress {
        Progress {
            total,
            groups,
            limit,
            done: AtomicUsize::new(0),
            start: std::time::Instant::now(),
            tty: std::io::stderr().is_terminal(),
            label: std::sync::Mutex::new(String::new()),
        }
    }

    fn group(&self, i: usize, g: &probes::Group) {
        let label = format!(
            "[{}/{}] {} at batch {}, {} prompt tokens",
            i + 1,
            self.groups,
            g.kind.label(),
            g.concurrency,
            g.prompt_len
        );
        if !self.tty {
            eprintln!("{label}");
        }
        *self.label.lock().expect("not poisoned") = label;
        self.draw();
    }

    fn done(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
        self.draw();
    }

    fn draw(&self) {
        if !self.tty {
            return;
        }
        let done = self.done.load(Ordering::Relaxed);
        let label = self.label.lock().expect("not poisoned").clone();
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r\x1b[2K{label}: {done}/{} requests, {:.0}/{:.0} s",
            self.total,
            self.start.elapsed().as_secs_f64(),
            self.limit.as_secs_f64()
        );
        let _ = err.flush();
    }

    fn note(&self, text: &str) {
        if self.tty {
            eprint!("\r\x1b[2K");
        }
        eprintln!("{text}");
    }

    fn finish(&self) {
        if self.tty {
            eprintln!();
        }
    }
}

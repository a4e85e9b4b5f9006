//! The flags of `llmlb bench`, as clap parses them.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::Slo;
use super::workload::LenRange;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WorkloadKind {
    Random,
    SharedPrefix,
    Chat,
    Trace,
}

/// Flags of `llmlb bench`.
#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Base URL of the OpenAI-compatible server (llmlb, vLLM, ...); a
    /// comma-separated list spreads the requests over several (in turn).
    #[arg(
        long,
        visible_alias = "base-url",
        default_value = "http://127.0.0.1:8080"
    )]
    pub target: String,
    /// Model name sent in every request (one of the target's models;
    /// required unless --self-test or --only-compare).
    #[arg(long, required_unless_present_any = ["self_test", "only_compare"])]
    pub model: Option<String>,
    /// What to send: random prompts, groups sharing a system prompt,
    /// multi-turn chat sessions, or a replayed trace.
    #[arg(
        long,
        visible_alias = "dataset-name",
        value_enum,
        default_value = "random"
    )]
    pub workload: WorkloadKind,
    /// Requests to send (a chat turn is one request). [default: the
    /// workload's size (shared-prefix, trace), otherwise 200]
    #[arg(long, visible_alias = "num-prompts", alias = "num-requests")]
    pub requests: Option<u64>,
    /// Stop sending after this long, e.g. `30s`, `2m`. [default: no limit]
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Open loop: new requests (sessions, for chat) per second; `inf` sends
    /// them all at once (bounded by --max-concurrency or --max-in-flight).
    /// [default: closed loop, see --concurrency]
    #[arg(long, visible_alias = "request-rate", value_parser = parse_rate, conflicts_with = "concurrency")]
    pub rate: Option<f64>,
    /// Gamma shape of the gaps: 1 = Poisson, below 1 burstier.
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// Closed loop with this many clients. [default: 1 when no --rate is
    /// given; a trace without either replays its own timestamps]
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Open loop: most requests in flight at once.
    #[arg(long, default_value_t = 1024)]
    pub max_in_flight: usize,
    /// As in `vllm bench serve`: with a finite --request-rate, the most
    /// requests in flight; otherwise a closed loop of this many clients.
    /// [default: unset]
    #[arg(long, conflicts_with_all = ["concurrency", "max_in_flight"])]
    pub max_concurrency: Option<usize>,
    /// Seed of the workload's prompts, lengths and arrival gaps.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Sent as `Authorization: Bearer KEY`. [default: none]
    #[arg(long)]
    pub api_key: Option<String>,
    /// Extra request header `K:V` (repeatable). [default: none]
    #[arg(long = "header", value_name = "K:V")]
    pub headers: Vec<String>,
    /// Goodput SLOs in ms, e.g. `ttft=500,tpot=50` (also `e2e=`), or
    /// vLLM's `--goodput ttft:500 tpot:50`. [default: none, goodput not
    /// reported]
    #[arg(long, visible_alias = "goodput", num_args = 1..)]
    pub slo: Vec<Slo>,
    /// Per-request timeout, whole stream included.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "300s")]
    pub timeout: Duration,
    /// Write the report (every figure and request) as JSON. [default: none]
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// As in `vllm bench serve`: write the JSON report to
    /// `--result-dir`/`--result-filename`.
    #[arg(long)]
    pub save_result: bool,
    /// With --save-result: the directory. [default: the current one]
    #[arg(long, requires = "save_result")]
    pub result_dir: Option<PathBuf>,
    /// With --save-result: the file name. [default:
    /// `llmlb-bench-NAME-TIMESTAMP.json`]
    #[arg(long, requires = "save_result")]
    pub result_filename: Option<String>,
    /// Percentiles shown for each latency, e.g. `25,50,99`. [default:
    /// 50,90,99]
    #[arg(long, value_delimiter = ',', value_parser = parse_percentile)]
    pub metric_percentiles: Vec<f64>,
    /// Write latency CDFs as SVG (with --compare, one curve per run).
    /// [default: none]
    #[arg(long, alias = "plot")]
    pub svg: Option<PathBuf>,
    /// Name of this run in the table and the plot.
    #[arg(long, default_value = "run")]
    pub name: String,
    /// Earlier `--out` reports to show next to this run (repeatable).
    /// [default: none]
    #[arg(long)]
    pub compare: Vec<PathBuf>,
    /// Send nothing: only print the table (and --svg) of the --compare reports.
    #[arg(long, requires = "compare", conflicts_with = "self_test")]
    pub only_compare: bool,
    /// Allow a target that is not on this machine.
    #[arg(long)]
    pub allow_remote: bool,
    /// Never draw the progress bar.
    #[arg(long, visible_alias = "disable-tqdm")]
    pub no_progress: bool,
    /// Measure the load generator's own ceiling against an instant
    /// in-process backend (default: concurrency 64, 20000 requests).
    #[arg(long)]
    pub self_test: bool,

    /// random: prompt tokens, `N` or `MIN..MAX`. [default: 1024]
    #[arg(long, visible_alias = "random-input-len")]
    pub input_len: Option<LenRange>,
    /// Output tokens, `N` or `MIN..MAX`. [default: random 128,
    /// shared-prefix 256, chat 64..256, trace: its own]
    #[arg(long, visible_alias = "random-output-len")]
    pub output_len: Option<LenRange>,
    /// shared-prefix: groups sharing one system prompt.
    #[arg(long, default_value_t = 64)]
    pub groups: usize,
    /// shared-prefix: prompts per group.
    #[arg(long, default_value_t = 16)]
    pub prompts_per_group: usize,
    /// System prompt tokens. [default: shared-prefix 2048, chat 256]
    #[arg(long)]
    pub system_len: Option<usize>,
    /// shared-prefix: question tokens after the system prompt.
    #[arg(long, default_value_t = 128)]
    pub question_len: usize,
    /// chat: turns per session.
    #[arg(long, default_value = "2..6")]
    pub turns: LenRange,
    /// chat: tokens per user message.
    #[arg(long, default_value = "32..128")]
    pub user_len: LenRange,
    /// chat: pause between a turn's answer and the next turn.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub think_time: Duration,
    /// trace: Mooncake-format JSONL file (required with `--workload trace`).
    /// [default: none]
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// trace: multiply arrival times (0.1 = ten times faster).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// trace: multiply block size, input and output lengths.
    #[arg(long, default_value_t = 1.0)]
    pub length_scale: f64,
    /// trace: replay only the first N records. [default: all]
    #[arg(long)]
    pub max_requests: Option<usize>,
}

fn parse_rate(s: &str) -> Result<f64, String> {
    if s.eq_ignore_ascii_case("inf") {
        return Ok(f64::INFINITY);
    }
    s.parse::<f64>()
        .map_err(|_| format!("`{s}` is not a number of requests per second (or `inf`)"))
}

fn parse_percentile(s: &str) -> Result<f64, String> {
    s.trim()
        .parse::<f64>()
        .ok()
        .filter(|p| (0.0..=100.0).contains(p))
        .ok_or_else(|| format!("`{s}` is not a percentile between 0 and 100"))
}

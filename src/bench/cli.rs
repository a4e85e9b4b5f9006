//! The `llmlb bench` command line: flags → [`BenchSpec`], run, print the
//! table, write JSON and SVG. `--self-test` measures the client's own
//! ceiling against an [`InstantBackend`].

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::instant::InstantBackend;
use super::workload::{
    ChatOptions, LenRange, RandomOptions, SharedPrefixOptions, TraceOptions, WorkloadSpec,
};
use super::{
    Arrivals, BenchError, BenchSpec, Limits, RunReport, Slo, render_table, run, write_svg,
};

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
    /// Base URL of the OpenAI-compatible server (llmlb, vLLM, ...).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub target: String,
    /// Model name sent in every request.
    #[arg(long, required_unless_present_any = ["self_test", "only_compare"])]
    pub model: Option<String>,
    #[arg(long, value_enum, default_value = "random")]
    pub workload: WorkloadKind,
    /// Requests to send (a chat turn is one request). Default: the
    /// workload's size (shared-prefix, trace) or 200.
    #[arg(long)]
    pub num_requests: Option<u64>,
    /// Stop sending after this long (e.g. `30s`, `2m`).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub duration: Option<Duration>,
    /// Open loop: new requests (sessions, for chat) per second.
    #[arg(long, conflicts_with = "concurrency")]
    pub rate: Option<f64>,
    /// Gamma shape of the gaps: 1 = Poisson, below 1 burstier.
    #[arg(long, default_value_t = 1.0)]
    pub burstiness: f64,
    /// Closed loop with this many clients (default 1 when no --rate is
    /// given; a trace without either replays its own timestamps).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Open loop: most requests in flight at once.
    #[arg(long, default_value_t = 1024)]
    pub max_in_flight: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Sent as `Authorization: Bearer KEY`.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Extra request header `K:V` (repeatable).
    #[arg(long = "header", value_name = "K:V")]
    pub headers: Vec<String>,
    /// Goodput SLOs in ms, e.g. `ttft=500,tpot=50` (also `e2e=`).
    #[arg(long)]
    pub slo: Option<Slo>,
    /// Per-request timeout, whole stream included.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "300s")]
    pub timeout: Duration,
    /// Write the report (every figure and request) as JSON.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Write latency CDFs as SVG (with --compare, one curve per run).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Name of this run in the table and the plot.
    #[arg(long, default_value = "run")]
    pub name: String,
    /// Earlier `--out` reports to show next to this run (repeatable).
    #[arg(long)]
    pub compare: Vec<PathBuf>,
    /// Send nothing: only print the table (and --plot) of the --compare reports.
    #[arg(long, requires = "compare", conflicts_with = "self_test")]
    pub only_compare: bool,
    /// Allow a target that is not on this machine.
    #[arg(long)]
    pub allow_remote: bool,
    /// Never draw the progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// Measure the load generator's own ceiling against an instant
    /// in-process backend (default: concurrency 64, 20000 requests).
    #[arg(long)]
    pub self_test: bool,

    /// random: prompt tokens, `N` or `MIN..MAX` (default 1024).
    #[arg(long)]
    pub input_len: Option<LenRange>,
    /// Output tokens, `N` or `MIN..MAX` (default: random 128,
    /// shared-prefix 256, chat 64..256).
    #[arg(long)]
    pub output_len: Option<LenRange>,
    /// shared-prefix: groups sharing one system prompt.
    #[arg(long, default_value_t = 64)]
    pub groups: usize,
    /// shared-prefix: prompts per group.
    #[arg(long, default_value_t = 16)]
    pub prompts_per_group: usize,
    /// System prompt tokens (default: shared-prefix 2048, chat 256).
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
    /// trace: Mooncake-format JSONL file.
    #[arg(long, default_value = "../shared/traces/conversation_trace.jsonl")]
    pub trace: PathBuf,
    /// trace: multiply arrival times (0.1 = ten times faster).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// trace: multiply block size, input and output lengths.
    #[arg(long, default_value_t = 1.0)]
    pub length_scale: f64,
    /// trace: replay only the first N records.
    #[arg(long)]
    pub max_requests: Option<usize>,
}

fn workload(a: &BenchArgs) -> WorkloadSpec {
    let out = |default: LenRange| a.output_len.unwrap_or(default);
    match a.workload {
        WorkloadKind::Random => WorkloadSpec::Random(RandomOptions {
            input_len: a.input_len.unwrap_or(LenRange::fixed(1024)),
            output_len: out(LenRange::fixed(128)),
        }),
        WorkloadKind::SharedPrefix => WorkloadSpec::SharedPrefix(SharedPrefixOptions {
            groups: a.groups,
            prompts_per_group: a.prompts_per_group,
            system_len: a.system_len.unwrap_or(2048),
            question_len: a.question_len,
            output_len: out(LenRange::fixed(256)).max,
        }),
        WorkloadKind::Chat => WorkloadSpec::Chat(ChatOptions {
            turns: a.turns,
            system_len: a.system_len.unwrap_or(256),
            user_len: a.user_len,
            output_len: out(LenRange { min: 64, max: 256 }),
            think_time: a.think_time,
        }),
        WorkloadKind::Trace => WorkloadSpec::Trace(TraceOptions {
            path: a.trace.clone(),
            time_scale: a.time_scale,
            length_scale: a.length_scale,
            max_requests: a.max_requests,
        }),
    }
}

/// Turns the flags into a spec.
pub fn spec(a: &BenchArgs) -> Result<BenchSpec, BenchError> {
    let headers = a
        .headers
        .iter()
        .map(|h| {
            h.split_once(':')
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .ok_or_else(|| BenchError::InvalidSpec(format!("--header `{h}`: expected K:V")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let arrivals = match (a.rate, a.concurrency) {
        (Some(rate), _) => Arrivals::Open {
            rate,
            burstiness: a.burstiness,
        },
        (None, Some(concurrency)) => Arrivals::Closed { concurrency },
        (None, None) if a.workload == WorkloadKind::Trace => Arrivals::Timestamps,
        (None, None) => Arrivals::Closed { concurrency: 1 },
    };
    Ok(BenchSpec {
        target: a.target.clone(),
        model: a.model.clone().unwrap_or_else(|| "instant".into()),
        workload: workload(a),
        arrivals,
        limits: Limits {
            num_requests: a.num_requests,
            duration: a.duration,
            request_timeout: a.timeout,
            max_in_flight: a.max_in_flight,
        },
        seed: a.seed,
        headers,
        api_key: a.api_key.clone(),
        slo: a.slo.unwrap_or_default(),
        allow_remote: a.allow_remote,
        progress: !a.no_progress,
    })
}

/// Runs `llmlb bench` and prints its table on stdout.
pub async fn main(args: BenchArgs) -> Result<(), BenchError> {
    let mut runs = Vec::new();
    for path in &args.compare {
        let name = path.file_stem().map_or_else(
            || path.display().to_string(),
            |s| s.to_string_lossy().into_owned(),
        );
        runs.push((name, RunReport::read_json(path)?));
    }
    if args.only_compare {
        print!("{}", render_table(&runs));
        if let Some(path) = &args.plot {
            write_svg(path, &runs)?;
        }
        return Ok(());
    }
    let mut spec = spec(&args)?;
    let backend = if args.self_test {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| {
                BenchError::InvalidSpec(format!("cannot bind the instant backend: {e}"))
            })?;
        let tokens = args.output_len.map_or(16, |r| r.max);
        let b = InstantBackend::start(listener, tokens).map_err(|source| BenchError::Io {
            what: "starting the instant backend".into(),
            source,
        })?;
        spec.target = b.url();
        spec.allow_remote = false;
        spec.workload = WorkloadSpec::Random(RandomOptions {
            input_len: args.input_len.unwrap_or(LenRange::fixed(16)),
            output_len: LenRange::fixed(tokens),
        });
        if args.rate.is_none() {
            spec.arrivals = Arrivals::Closed {
                concurrency: args.concurrency.unwrap_or(64),
            };
        }
        if args.num_requests.is_none() && args.duration.is_none() {
            spec.limits.num_requests = Some(20_000);
        }
        Some(b)
    } else {
        None
    };
    let result = run(&spec).await;
    if let Some(b) = backend {
        b.stop().await;
    }
    let report = result?;
    runs.push((args.name.clone(), report));
    print!("{}", render_table(&runs));
    if args.self_test {
        let f = &runs[runs.len() - 1].1.figures;
        println!(
            "load generator ceiling: {:.0} requests/s ({:.0} streamed chunks/s) against an instant backend",
            f.request_throughput, f.output_throughput
        );
    }
    let (_, report) = &runs[runs.len() - 1];
    if let Some(path) = &args.out {
        report.write_json(path)?;
    }
    if let Some(path) = &args.plot {
        write_svg(path, &runs)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cmd {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn parse(flags: &[&str]) -> Result<BenchSpec, String> {
        let cmd = Cmd::try_parse_from(std::iter::once("bench").chain(flags.iter().copied()))
            .map_err(|e| e.to_string())?;
        spec(&cmd.args).map_err(|e| e.to_string())
    }

    #[test]
    fn flags_build_the_spec() {
        let s = parse(&[
            "--model",
            "m",
            "--workload",
            "shared-prefix",
            "--groups",
            "4",
            "--rate",
            "8",
            "--burstiness",
            "0.5",
            "--duration",
            "30s",
            "--header",
            "x-a: b",
            "--slo",
            "ttft=300",
            "--output-len",
            "32",
        ])
        .unwrap();
        assert_eq!(
            s.arrivals,
            Arrivals::Open {
                rate: 8.0,
                burstiness: 0.5
            }
        );
        assert_eq!(s.limits.duration, Some(Duration::from_secs(30)));
        assert_eq!(s.headers, vec![("x-a".to_string(), "b".to_string())]);
        assert_eq!(s.slo.ttft_ms, Some(300.0));
        match s.workload {
            WorkloadSpec::SharedPrefix(o) => {
                assert_eq!((o.groups, o.system_len, o.output_len), (4, 2048, 32))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn arrivals_default_by_workload() {
        let trace = parse(&["--model", "m", "--workload", "trace"]).unwrap();
        assert_eq!(trace.arrivals, Arrivals::Timestamps);
        let closed = parse(&["--model", "m", "--concurrency", "8"]).unwrap();
        assert_eq!(closed.arrivals, Arrivals::Closed { concurrency: 8 });
        assert_eq!(
            parse(&["--model", "m"]).unwrap().arrivals,
            Arrivals::Closed { concurrency: 1 }
        );
        assert!(parse(&["--model", "m", "--rate", "1", "--concurrency", "2"]).is_err());
        assert!(
            parse(&["--workload", "random"]).is_err(),
            "--model is required"
        );
        assert!(parse(&["--model", "m", "--header", "novalue"]).is_err());
    }
}

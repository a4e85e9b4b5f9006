//! The `llmlb bench` command line: flags → [`BenchSpec`], run, print the
//! table, write JSON and SVG. `--self-test` measures the client's own
//! ceiling against an [`InstantBackend`].

pub use super::args::{BenchArgs, WorkloadKind};
use super::instant::InstantBackend;
use super::workload::{
    ChatOptions, LenRange, RandomOptions, SharedPrefixOptions, TraceOptions, WorkloadSpec,
};
use super::{
    Arrivals, BenchError, BenchSpec, Limits, RunReport, Slo, render_table, run, write_svg,
};

/// The command line with the values of `--api-key` and `--header` masked.
fn masked_args(args: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out = Vec::new();
    let mut hide_next: Option<bool> = None;
    for arg in args {
        if let Some(header) = hide_next.take() {
            out.push(match arg.split_once(':') {
                Some((k, _)) if header => format!("{k}:***"),
                _ => "***".into(),
            });
            continue;
        }
        match arg.split_once('=') {
            Some(("--api-key", _)) => out.push("--api-key=***".into()),
            Some(("--header", v)) => out.push(format!(
                "--header={}:***",
                v.split_once(':').map_or(v, |(k, _)| k)
            )),
            _ => {
                match arg.as_str() {
                    "--api-key" => hide_next = Some(false),
                    "--header" => hide_next = Some(true),
                    _ => {}
                }
                out.push(arg);
            }
        }
    }
    out
}

fn workload(a: &BenchArgs) -> Result<WorkloadSpec, BenchError> {
    let out = |default: LenRange| a.output_len.unwrap_or(default);
    Ok(match a.workload {
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
            path: a.trace.clone().ok_or_else(|| {
                BenchError::InvalidSpec("--workload trace needs --trace FILE".into())
            })?,
            time_scale: a.time_scale,
            length_scale: a.length_scale,
            max_requests: a.max_requests,
        }),
    })
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
    let finite_rate = a.rate.filter(|r| r.is_finite());
    let mut max_in_flight = a.max_in_flight;
    let concurrency = match (finite_rate, a.max_concurrency) {
        (Some(_), Some(m)) => {
            max_in_flight = m;
            a.concurrency
        }
        (None, Some(m)) => Some(m),
        (_, None) => a.concurrency,
    };
    let arrivals = match (finite_rate, a.rate, concurrency) {
        (Some(rate), _, _) => Arrivals::Open {
            rate,
            burstiness: a.burstiness,
        },
        (None, _, Some(concurrency)) => Arrivals::Closed { concurrency },
        // `--request-rate inf`: everything at once, as far as the bound allows.
        (None, Some(_), None) => Arrivals::Closed {
            concurrency: max_in_flight,
        },
        (None, None, None) if a.workload == WorkloadKind::Trace => Arrivals::Timestamps,
        (None, None, None) => Arrivals::Closed { concurrency: 1 },
    };
    let slo = a.slo.iter().fold(Slo::default(), |acc, s| Slo {
        ttft_ms: s.ttft_ms.or(acc.ttft_ms),
        tpot_ms: s.tpot_ms.or(acc.tpot_ms),
        e2e_ms: s.e2e_ms.or(acc.e2e_ms),
    });
    Ok(BenchSpec {
        target: a.target.clone(),
        model: a.model.clone().unwrap_or_else(|| "instant".into()),
        workload: workload(a)?,
        arrivals,
        limits: Limits {
            num_requests: a.requests,
            duration: a.duration,
            request_timeout: a.timeout,
            max_in_flight,
        },
        seed: a.seed,
        headers,
        api_key: a.api_key.clone(),
        slo,
        allow_remote: a.allow_remote,
        progress: !a.no_progress,
    })
}

/// Printed when no response named its replica, so the report's
/// `"replicas"` (and the table's spread column) stay empty.
pub const PER_REPLICA_HINT: &str = "no per-replica figures: no response carried an \
`x-llmlb-replica` header. When the target is llmlb, set `replica_header = true` under \
[server] in its config (docs/CONFIG.md) to count requests per replica.";

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
        if let Some(path) = &args.svg {
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
        if args.requests.is_none() && args.duration.is_none() {
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
    let mut report = result?;
    report.args = masked_args(std::env::args());
    if !args.metric_percentiles.is_empty() {
        report
            .figures
            .add_percentiles(&report.requests, &args.metric_percentiles);
    }
    let first_error = report
        .requests
        .iter()
        .filter(|r| !r.outcome.is_ok())
        .min_by(|a, b| a.start_ms.total_cmp(&b.start_ms))
        .and_then(|r| r.failure());
    let (sent, completed) = (report.figures.sent, report.figures.completed);
    let no_replica_names = completed > 0 && report.figures.replicas.is_empty();
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
    if args.save_result {
        let name = args.result_filename.clone().unwrap_or_else(|| {
            let stamp: String = report.date.chars().filter(char::is_ascii_digit).collect();
            format!("llmlb-bench-{}-{stamp}.json", args.name)
        });
        let path = args.result_dir.clone().unwrap_or_default().join(name);
        report.write_json(&path)?;
        eprintln!("wrote {}", path.display());
    }
    if let Some(path) = &args.svg {
        write_svg(path, &runs)?;
    }
    if no_replica_names && !args.self_test {
        eprintln!("{PER_REPLICA_HINT}");
    }
    if let Some(first) = first_error {
        eprintln!(
            "{} of {sent} requests failed; the first: {first}",
            sent - completed
        );
        if completed == 0 {
            return Err(BenchError::NothingSucceeded { sent, first });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::time::Duration;

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
        let trace = parse(&["--model", "m", "--workload", "trace", "--trace", "t.jsonl"]).unwrap();
        assert_eq!(trace.arrivals, Arrivals::Timestamps);
        let no_file = parse(&["--model", "m", "--workload", "trace"]).unwrap_err();
        assert!(no_file.contains("--trace FILE"), "{no_file}");
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

    #[test]
    fn vllm_flag_names_map_onto_the_spec() {
        let s = parse(&[
            "--base-url",
            "http://127.0.0.1:8000",
            "--model",
            "m",
            "--num-prompts",
            "50",
            "--request-rate",
            "4",
            "--max-concurrency",
            "8",
            "--random-input-len",
            "100",
            "--goodput",
            "ttft:500",
            "tpot:50",
        ])
        .unwrap();
        assert_eq!(s.target, "http://127.0.0.1:8000");
        assert_eq!(s.limits.num_requests, Some(50));
        assert_eq!(s.limits.max_in_flight, 8);
        assert_eq!(s.slo.ttft_ms, Some(500.0));
        assert_eq!(s.slo.tpot_ms, Some(50.0));
        assert!(matches!(s.arrivals, Arrivals::Open { rate, .. } if rate == 4.0));
        let burst = parse(&[
            "--model",
            "m",
            "--request-rate",
            "inf",
            "--max-concurrency",
            "3",
        ]);
        assert_eq!(burst.unwrap().arrivals, Arrivals::Closed { concurrency: 3 });
        assert!(parse(&["--model", "m", "--metric-percentiles", "50,101"]).is_err());
    }

    #[test]
    fn secrets_are_masked_in_the_recorded_arguments() {
        let args = [
            "bench",
            "--api-key",
            "k1",
            "--header",
            "x-auth: t",
            "--api-key=k2",
        ];
        let masked = masked_args(args.iter().map(|s| s.to_string()));
        assert_eq!(
            masked,
            [
                "bench",
                "--api-key",
                "***",
                "--header",
                "x-auth:***",
                "--api-key=***"
            ]
        );
    }
}

//! The instant backend behind `llmlb bench --self-test`, and the command's
//! file outputs (JSON report, SVG, comparison of saved reports).

use clap::Parser;

use llmlb::bench::cli::{BenchArgs, main};
use llmlb::bench::instant::InstantBackend;
use llmlb::bench::workload::{LenRange, RandomOptions, WorkloadSpec};
use llmlb::bench::{Arrivals, BenchSpec, RunReport, run};

#[derive(Parser)]
struct Cmd {
    #[command(flatten)]
    args: BenchArgs,
}

fn args(flags: &[&str]) -> BenchArgs {
    Cmd::try_parse_from(std::iter::once("bench").chain(flags.iter().copied()))
        .unwrap()
        .args
}

#[tokio::test]
async fn instant_backend_serves_complete_streams() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = InstantBackend::start(listener, 7).unwrap();
    let workload = WorkloadSpec::Random(RandomOptions {
        input_len: LenRange::fixed(16),
        output_len: LenRange::fixed(7),
    });
    let mut spec = BenchSpec::new(backend.url(), "m", workload);
    spec.arrivals = Arrivals::Closed { concurrency: 8 };
    spec.limits.num_requests = Some(500);
    let report = run(&spec).await.unwrap();
    backend.stop().await;
    let f = &report.figures;
    assert_eq!((f.sent, f.completed), (500, 500));
    assert_eq!(f.output_tokens, 500 * 7);
    assert_eq!(f.itl_ms.count, 500 * 6);
    assert!(
        report
            .requests
            .iter()
            .all(|r| r.ttft_ms.unwrap() <= r.e2e_ms)
    );
}

#[tokio::test]
async fn self_test_writes_json_and_svg_and_compares_them() {
    let dir = std::env::temp_dir().join(format!("llmlb-bench-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("first.json");
    let svg = dir.join("cdf.svg");
    let path = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    main(args(&[
        "--self-test",
        "--requests",
        "300",
        "--concurrency",
        "4",
        "--no-progress",
        "--out",
        &path(&json),
    ]))
    .await
    .unwrap();
    let first = RunReport::read_json(&json).unwrap();
    assert_eq!(first.figures.completed, 300);
    assert_eq!(first.requests.len(), 300);

    main(args(&[
        "--only-compare",
        "--compare",
        &path(&json),
        "--compare",
        &path(&json),
        "--svg",
        &path(&svg),
    ]))
    .await
    .unwrap();
    let text = std::fs::read_to_string(&svg).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    // Two runs, two panels: four curves.
    assert_eq!(text.matches("<polyline").count(), 4);
    assert!(text.contains("first (300 completed)"));
}

/// Against a server that names no replica (here the instant backend), the
/// command says how to get per-replica counts from llmlb.
#[tokio::test]
async fn missing_replica_names_are_explained() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = InstantBackend::start(listener, 4).unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_llmlb"))
        .args(["bench", "--model", "m", "--requests", "5", "--no-progress"])
        .args(["--input-len", "16", "--target", &backend.url()])
        .output()
        .await
        .unwrap();
    backend.stop().await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("replica_header = true"), "{stderr}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("5 / 5"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

//! `llmlb bench` as a process: exit status when nothing succeeds, the first
//! error on stderr, the `vllm bench serve` flag names, and what the JSON
//! report records. The target is a simulated replica on loopback.

use crate::common;
use crate::sim_support;

use std::process::Output;

use serde_json::Value;

async fn bench(args: Vec<String>) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_llmlb"))
        .arg("bench")
        .args(args)
        .output()
        .await
        .expect("run llmlb bench")
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

/// Three prompts of `model` against `addr` that must all fail: checks the
/// exit status and returns stderr.
async fn three_failing(addr: std::net::SocketAddr, model: &str) -> String {
    let out = bench(strings(&[
        "--base-url",
        &format!("http://{addr}"),
        "--model",
        model,
        "--num-prompts",
        "3",
        "--disable-tqdm",
    ]))
    .await;
    assert!(!out.status.success(), "exit status {:?}", out.status);
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn nothing_listening_exits_non_zero_with_the_first_error() {
    let addr = common::refused_addr().await;
    let stderr = three_failing(addr, "m").await;
    assert!(
        stderr.contains("none of the 3 requests succeeded") && stderr.contains("transport error"),
        "{stderr}"
    );
}

#[tokio::test]
async fn unknown_model_exits_non_zero_and_says_why() {
    let sim = sim_support::start(sim_support::fast()).await;
    let stderr = three_failing(sim.addr, "no-such-model").await;
    assert!(
        stderr.contains("HTTP 404") && stderr.contains("does not exist"),
        "{stderr}"
    );
}

#[tokio::test]
async fn vllm_flag_names_run_and_the_report_records_the_run() {
    let sim = sim_support::start(sim_support::fast()).await;
    let model = sim_support::fast().model;
    let dir = std::env::temp_dir().join(format!("llmlb-bench-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let out = bench(strings(&[
        "--base-url",
        &format!("http://{}/v1", sim.addr),
        "--model",
        &model,
        "--dataset-name",
        "random",
        "--num-prompts",
        "6",
        "--request-rate",
        "inf",
        "--max-concurrency",
        "2",
        "--random-input-len",
        "32",
        "--random-output-len",
        "4",
        "--goodput",
        "ttft:600000",
        "tpot:600000",
        "--metric-percentiles",
        "25,75",
        "--save-result",
        "--result-dir",
        dir.to_str().unwrap(),
        "--result-filename",
        "r.json",
        "--api-key",
        "secret-key",
        "--disable-tqdm",
    ]))
    .await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("TTFT p25 (ms)") && stdout.contains("TTFT p75 (ms)"));
    assert!(
        stdout.contains("6 ok"),
        "goodput counts every request:\n{stdout}"
    );
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("r.json")).unwrap()).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(report["completed"], 6);
    assert_eq!(report["arrivals"], "closed loop, concurrency 2");
    assert_eq!(report["version"], env!("CARGO_PKG_VERSION"));
    assert!(report["date"].as_str().unwrap().starts_with("20"));
    let args: Vec<&str> = report["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(args.contains(&"--num-prompts") && args.contains(&"***"));
    assert!(!args.contains(&"secret-key"), "the API key is masked");
    assert!(report["percentiles"]["ttft_ms"]["p25"].is_number());
    // The simulator's usage reports 32 prompt tokens per request.
    assert_eq!(report["input_tokens"], 6 * 32);
}

#[test]
fn help_lists_the_vllm_aliases() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_llmlb"))
        .args(["bench", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--base-url",
        "--num-prompts",
        "--request-rate",
        "--max-concurrency",
        "--random-input-len",
        "--random-output-len",
        "--goodput",
        "--save-result",
        "--metric-percentiles",
    ] {
        assert!(help.contains(flag), "{flag} missing from:\n{help}");
    }
}

//! `llmlb doctor` against simulated replicas on loopback: a correct setup
//! passes (and the command exits 0), a tokenizer that is not the replicas'
//! is named in both directions (and the command exits 1), and event
//! endpoints that publish nothing, or nothing at all, are named.

use crate::common;
use crate::kv_support;

use std::path::PathBuf;
use std::time::Duration;

use llmlb::doctor::{Options, Report, Severity, Topic};
use llmlb::replica_sim::{SimConfig, SimHandle};
use tokio::net::TcpListener;

use kv_support::sim_with_events;

const TINY_LLAMA: &str = "../shared/tokenizers/tiny-llama";

fn opts() -> Options {
    Options {
        events_wait: Duration::from_secs(2),
        request_timeout: Duration::from_secs(30),
        zmq_timeout: Duration::from_secs(2),
        profile: None,
    }
}

/// A pool over `sims`; `replica_extra(i)` adds lines to replica i.
fn config(
    sims: &[&SimHandle],
    mode: &str,
    pool_extra: &str,
    replica_extra: impl Fn(usize) -> String,
) -> String {
    let mut s = format!(
        "[[pools]]\nname = \"p\"\nmodels = [{:?}]\n{pool_extra}\n[pools.prefix]\nmode = \"{mode}\"\n",
        sims[0].config().model
    );
    for (i, r) in sims.iter().enumerate() {
        s.push_str(&format!(
            "[[pools.replicas]]\nurl = \"http://{}\"\nname = \"r{i}\"\n{}\n",
            r.addr,
            replica_extra(i)
        ));
    }
    s
}

/// A `cache` pool over `sim` with the model tokenizer of the fixture.
fn with_model_tokenizer(sim: &SimHandle) -> String {
    let tokenizer = format!("[pools.tokenizer]\ndir = {TINY_LLAMA:?}");
    config(&[sim], "cache", &tokenizer, |_| String::new())
}

fn events_of(sim: &SimHandle) -> String {
    format!(
        "kv_events = \"tcp://{}\"\nkv_events_replay = \"tcp://{}\"",
        sim.kv_events.unwrap(),
        sim.kv_replay.unwrap()
    )
}

async fn doctor(text: &str) -> Report {
    let config = llmlb::config::parse(text).unwrap();
    llmlb::doctor::run(&config, &opts()).await
}

/// Runs the `llmlb doctor` binary on `text`: (exit code, stdout).
async fn doctor_cli(text: &str) -> (i32, String) {
    let dir = std::env::temp_dir().join(format!("llmlb-doctor-{}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let path: PathBuf = dir.join("llmlb.toml");
    std::fs::write(&path, text).unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_llmlb"))
        .args(["doctor", "--events-wait", "2s", "--config"])
        .arg(&path)
        .output()
        .await
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

async fn sim_with_tokenizer() -> SimHandle {
    let mut config = SimConfig::profile("fast").unwrap();
    config.tokenizer_dir = Some(PathBuf::from(TINY_LLAMA));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    llmlb::replica_sim::spawn(listener, config)
}

fn severity(report: &Report, topic: Topic) -> Option<Severity> {
    report
        .replicas
        .iter()
        .flat_map(|r| &r.findings)
        .filter(|f| f.topic == topic)
        .map(|f| f.severity)
        .max()
}

fn assert_ok(report: &Report, topic: Topic) {
    assert_eq!(
        severity(report, topic),
        Some(Severity::Ok),
        "{topic:?}: {}",
        report.render()
    );
}

#[tokio::test]
async fn a_correct_setup_passes() {
    let a = sim_with_events(true, 400, None).await;
    let b = sim_with_events(true, 400, None).await;
    let sims = [&a, &b];
    let text = config(&sims, "exact", "", |i| events_of(sims[i]));
    let (code, out) = doctor_cli(&text).await;
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("everything agrees"), "{out}");
    let report = doctor(&text).await;
    assert_eq!(report.replicas.len(), 2);
    for topic in [
        Topic::Tokenizer,
        Topic::BlockSize,
        Topic::PrefixCache,
        Topic::Events,
        Topic::Replay,
    ] {
        assert_ok(&report, topic);
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn a_wrong_tokenizer_is_named_both_ways() {
    // Replicas with the model's tokenizer, llmlb with the stand-in.
    let real = sim_with_tokenizer().await;
    let text = config(&[&real], "cache", "", |_| String::new());
    let (code, out) = doctor_cli(&text).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("wrong tokenizer"), "{out}");
    assert!(out.contains("set [pools.tokenizer] dir"), "{out}");
    // The reverse: llmlb with the model's tokenizer, replicas with the stand-in.
    let stand_in = sim_with_events(false, 400, None).await;
    let text = with_model_tokenizer(&stand_in);
    let report = doctor(&text).await;
    assert!(report.has_error(Topic::Tokenizer), "{}", report.render());
    assert_ok(&report, Topic::PrefixCache);
    // And with the right one on both sides, the tokenizer agrees.
    let text = with_model_tokenizer(&real);
    let report = doctor(&text).await;
    assert_ok(&report, Topic::Tokenizer);
    real.shutdown().await;
    stand_in.shutdown().await;
}

#[tokio::test]
async fn events_that_do_not_arrive_are_named() {
    // r0 names an endpoint nothing listens on; r1 names r2's endpoint,
    // which publishes nothing while r1 is probed; neither has replay.
    let a = sim_with_events(false, 400, None).await;
    let b = sim_with_events(false, 400, None).await;
    let silent = sim_with_events(false, 400, None).await;
    let nowhere = common::refused_addr().await;
    let endpoints = [nowhere, silent.kv_events.unwrap()];
    let text = config(&[&a, &b], "exact", "", |i| {
        format!("kv_events = \"tcp://{}\"", endpoints[i])
    });
    let (code, out) = doctor_cli(&text).await;
    assert_eq!(code, 1, "{out}");
    let report = doctor(&text).await;
    for r in &report.replicas {
        let events: Vec<_> = r
            .findings
            .iter()
            .filter(|f| f.topic == Topic::Events)
            .collect();
        assert!(
            events
                .iter()
                .any(|f| f.severity == Severity::Error && f.message.starts_with("events off")),
            "{}",
            report.render()
        );
    }
    assert_eq!(severity(&report, Topic::Tokenizer), Some(Severity::Ok));
    assert_eq!(severity(&report, Topic::Replay), Some(Severity::Warning));
    for s in [a, b, silent] {
        s.shutdown().await;
    }
}

#[tokio::test]
async fn a_model_name_the_replica_does_not_serve_is_named() {
    let sim = sim_with_events(false, 400, None).await;
    let served = sim.config().model.clone();
    // The pool routes a name the replica does not serve: every request
    // would be a 404, and the doctor says which name it does serve.
    let text = config(&[&sim], "cache", "", |_| String::new()).replacen(
        &format!("models = [{served:?}]"),
        "models = [\"llama-3-8b\"]",
        1,
    );
    let (code, out) = doctor_cli(&text).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("\"llama-3-8b\""), "{out}");
    assert!(out.contains(&format!("serves {served:?}")), "{out}");
    assert!(out.contains("--served-model-name"), "{out}");
    // One of two names served: a warning naming the other, and the probe
    // runs with the served one.
    let text = config(&[&sim], "cache", "", |_| String::new()).replacen(
        &format!("models = [{served:?}]"),
        &format!("models = [{served:?}, \"other\"]"),
        1,
    );
    let report = doctor(&text).await;
    assert_eq!(
        severity(&report, Topic::Model),
        Some(Severity::Warning),
        "{}",
        report.render()
    );
    assert_ok(&report, Topic::Tokenizer);
    // The right name: the model check passes.
    let report = doctor(&config(&[&sim], "cache", "", |_| String::new())).await;
    assert_ok(&report, Topic::Model);
    sim.shutdown().await;
}

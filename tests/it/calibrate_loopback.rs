//! `llmlb calibrate` against a simulated replica on loopback: it fits back
//! the cost model the replica runs, writes a profile that `--profile FILE`
//! takes, and refuses a replica that is busy.

use crate::sim_support;

use std::time::Duration;

use llmlb::calibrate::{CalibrateArgs, CalibrateError, run};
use llmlb::replica_sim::SimConfig;
use serde_json::json;

fn args(addr: std::net::SocketAddr, output: &std::path::Path) -> CalibrateArgs {
    CalibrateArgs {
        url: format!("http://{addr}"),
        model: None,
        api_key: None,
        output: output.to_path_buf(),
        out: None,
        max_num_seqs: 32,
        max_num_batched_tokens: 2048,
        max_model_len: None,
        block_size: None,
        num_blocks: None,
        rounds: 1,
        requests: 1000,
        time_limit: Duration::from_secs(120),
        timeout: Duration::from_secs(60),
        force: false,
        allow_remote: false,
        tokenizer_dir: None,
        seed: 1,
    }
}

/// A replica whose steps are long enough to measure on a busy machine.
fn replica() -> SimConfig {
    let mut c = SimConfig::profile("fast").unwrap();
    c.cost.step_overhead = 0.004;
    c.cost.decode_per_seq = 0.000_2;
    c.cost.prefill_per_token = 0.000_01;
    c.engine.max_model_len = 2048;
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fits_the_replica_it_probes_and_writes_a_usable_profile() {
    let sim = sim_support::start(replica()).await;
    let dir = std::env::temp_dir().join(format!("llmlb-calibrate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("fitted.toml");
    let cal = run(&args(sim.addr, &path)).await.unwrap();

    // The shape is read from the replica, not assumed.
    let p = SimConfig::named_or_file(path.to_str().unwrap()).unwrap();
    assert_eq!(p.engine.block_size, replica().engine.block_size);
    assert_eq!(p.engine.num_blocks, replica().engine.num_blocks);
    assert_eq!(p.engine.max_model_len, 2048);
    assert_eq!(p.model, replica().model);
    let fitted = p.fitted.as_ref().expect("a [fitted] table");
    assert_eq!(fitted.url, format!("http://{}", sim.addr));
    assert_eq!(fitted.requests, cal.fitted.requests);
    assert!(fitted.requests > 100 && fitted.requests <= 1000);
    // The step times come back within a factor of two (the client's own
    // timing and a shared machine add noise, never a 2x).
    let near = |name: &str, got: f64, want: f64| {
        assert!(
            got > want / 2.0 && got < want * 2.0,
            "{name}: fitted {got:e}, the replica runs {want:e}"
        );
    };
    near("step_overhead", p.cost.step_overhead, 0.004);
    near("decode_per_seq", p.cost.decode_per_seq, 0.000_2);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("# Replica-sim engine profile fitted by `llmlb calibrate`"));
    assert!(
        text.contains("token gap"),
        "the fitted-against-measured table"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_replica_is_refused_unless_forced() {
    let sim = sim_support::start(replica()).await;
    // One long request keeps the replica busy (2,000 steps of 4 ms).
    let addr = sim.addr;
    let busy = tokio::spawn(async move {
        sim_support::post(
            addr,
            "/v1/completions",
            json!({"model": "llmlb-sim", "prompt": "hello", "max_tokens": 2000}),
        )
        .await
    });
    for _ in 0..100 {
        let (_, text) = sim_support::request(addr, "GET", "/metrics", None).await;
        let running = text
            .lines()
            .filter(|l| l.starts_with("vllm:num_requests_running"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>();
        if running >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let path =
        std::env::temp_dir().join(format!("llmlb-calibrate-busy-{}.toml", std::process::id()));
    let err = run(&args(addr, &path)).await.unwrap_err();
    assert!(
        matches!(err, CalibrateError::Busy { running, .. } if running >= 1.0),
        "{err}"
    );
    assert!(err.to_string().contains("--force"));
    assert!(!path.exists(), "nothing written");
    busy.abort();
}

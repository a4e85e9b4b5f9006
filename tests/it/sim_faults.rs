//! Fault injection over real HTTP: error rate, hang, slowdown, queue limit,
//! startup delay, and `/sim/fault` itself.

use crate::sim_support;

use std::time::Duration;

use serde_json::json;
use sim_support::*;

#[tokio::test]
async fn error_rate_one_fails_every_request_until_reset() {
    let sim = start(fast()).await;
    let (status, text) = post(sim.addr, "/sim/fault", json!({"error_rate": 1.0})).await;
    assert_eq!(status, 200);
    let state: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(state["error_rate"], 1.0);
    for _ in 0..3 {
        let (status, text) = complete(sim.addr, json!({"prompt": "hi", "max_tokens": 2})).await;
        assert_eq!(status, 500);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["type"], "InternalServerError");
    }
    let (status, _) = request(sim.addr, "GET", "/health", None).await;
    assert_eq!(status, 200, "errors hit inference only");
    post(sim.addr, "/sim/fault", json!({"reset": true})).await;
    let (status, _) = complete(sim.addr, json!({"prompt": "hi", "max_tokens": 2})).await;
    assert_eq!(status, 200);
    sim.shutdown().await;
}

#[tokio::test]
async fn half_error_rate_is_seeded_and_roughly_half() {
    let mut cfg = fast();
    cfg.faults.error_rate = 0.5;
    cfg.seed = 42;
    let sim = start(cfg).await;
    let mut failed = 0;
    for _ in 0..40 {
        let (status, _) = complete(sim.addr, json!({"prompt": "hi", "max_tokens": 1})).await;
        assert!(status == 200 || status == 500);
        failed += usize::from(status == 500);
    }
    assert!((8..=32).contains(&failed), "{failed} of 40 failed");
    sim.shutdown().await;
}

#[tokio::test]
async fn hang_accepts_and_never_answers_until_cleared() {
    let sim = start(fast()).await;
    post(sim.addr, "/sim/fault", json!({"hang": true})).await;
    let addr = sim.addr;
    let pending = tokio::spawn(async move { request(addr, "GET", "/health", None).await });
    let (status, text) = request(sim.addr, "GET", "/sim/fault", None).await;
    assert_eq!(status, 200);
    assert!(text.contains("\"hang\":true"));
    // /metrics still answers while hung, and no request reached the engine.
    let m = scrape(sim.addr).await;
    assert_eq!(metric(&m, "vllm:num_requests_waiting", &[]), 0.0);
    assert!(!pending.is_finished());
    // Stopping the replica ends the hung request with a 503.
    sim.shutdown().await;
    let (status, _) = pending.await.unwrap();
    assert_eq!(status, 503);
}

#[tokio::test]
async fn max_waiting_refuses_with_503_when_queue_is_full() {
    let mut cfg = fast();
    cfg.engine.max_num_seqs = 1;
    cfg.time_scale = 0.5; // slow enough that the queue stays full
    let sim = start(cfg).await;
    post(sim.addr, "/sim/fault", json!({"max_waiting": 1})).await;
    let addr = sim.addr;
    let long = spawn_complete(addr, json!({"prompt": "first", "max_tokens": 200}));
    eventually("the first request runs", || sim.stats().num_running == 1).await;
    let queued = spawn_complete(addr, json!({"prompt": "second", "max_tokens": 1}));
    eventually("the second request waits", || sim.stats().num_waiting == 1).await;
    let (status, text) = complete(sim.addr, json!({"prompt": "third", "max_tokens": 1})).await;
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("queue"));
    let m = scrape(sim.addr).await;
    assert_eq!(
        metric(
            &m,
            "vllm:admission_rejections_total",
            &[("reason", "max_num_queued_reqs")]
        ),
        1.0
    );
    post(sim.addr, "/sim/fault", json!({"max_waiting": null})).await;
    sim.shutdown().await;
    let _ = long.await;
    let _ = queued.await;
}

#[tokio::test]
async fn startup_delay_keeps_health_503_then_200() {
    let mut cfg = fast();
    cfg.startup_delay = 0.3;
    let sim = start(cfg).await;
    let (status, _) = request(sim.addr, "GET", "/health", None).await;
    assert_eq!(status, 503);
    let (status, _) = complete(sim.addr, json!({"prompt": "hi"})).await;
    assert_eq!(status, 503);
    let mut ready = false;
    for _ in 0..400 {
        if request(sim.addr, "GET", "/health", None).await.0 == 200 {
            ready = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(ready, "health turned 200 after the delay");
    sim.shutdown().await;
}

#[tokio::test]
async fn slowdown_stretches_simulated_step_time() {
    let sim = start(fast()).await;
    let body = json!({"prompt": "measure me", "max_tokens": 20});
    complete_json(sim.addr, body.clone()).await;
    let normal = sim.stats().busy_time;
    post(sim.addr, "/sim/fault", json!({"slowdown": 4.0})).await;
    complete_json(
        sim.addr,
        json!({"prompt": "measure me too", "max_tokens": 20}),
    )
    .await;
    let slowed = sim.stats().busy_time - normal;
    // Engine time, not wall time: the same work costs four times as much.
    assert!(
        slowed > 3.5 * normal && slowed < 4.5 * normal,
        "{normal} vs {slowed}"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn bad_fault_patches_are_rejected() {
    let sim = start(fast()).await;
    let (status, _) = post(sim.addr, "/sim/fault", json!({"error_rate": 7})).await;
    assert_eq!(status, 400);
    let (status, _) = post(sim.addr, "/sim/fault", json!({"hung": true})).await;
    assert_eq!(status, 400);
    assert_eq!(sim.faults(), llmlb::replica_sim::FaultConfig::default());
    sim.shutdown().await;
}

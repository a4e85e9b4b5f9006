//! Per-model metrics on the admin listener: TTFT by `stream`, requests and
//! tokens by model, build info, process metrics, the replica info series,
//! and no rate-limit backend gauge without a backend.

use crate::common;
use crate::sim_support;

use common::{metric_value, metrics_text, start_llmlb};
use serde_json::json;

#[tokio::test]
async fn ttft_requests_and_tokens_by_model_and_stream() {
    let sim = sim_support::start(sim_support::fast()).await;
    let model = sim_support::fast().model;
    let lb = start_llmlb(&format!(
        "[[pools]]\nname = \"chat\"\nmodels = [\"{model}\"]\n[[pools.replicas]]\nname = \"gpu-a\"\nurl = \"http://{}\"\n",
        sim.addr
    ))
    .await;
    let plain = json!({"model": model, "prompt": "a b c", "max_tokens": 3});
    assert_eq!(sim_support::complete(lb.addr, plain).await.0, 200);
    let stream = json!({"model": model, "prompt": "a b c", "max_tokens": 5, "stream": true,
                        "stream_options": {"include_usage": true}});
    for _ in 0..2 {
        assert_eq!(sim_support::complete(lb.addr, stream.clone()).await.0, 200);
    }
    let unknown = json!({"model": "nope", "prompt": "x"});
    assert_eq!(sim_support::complete(lb.addr, unknown).await.0, 404);

    let text = metrics_text(lb.admin_addr).await;
    let m = model.as_str();
    let ttft = "llmlb_time_to_first_token_seconds_count";
    assert_eq!(
        metric_value(&text, ttft, &[("model", m), ("stream", "true")]),
        2.0,
        "{text}"
    );
    assert_eq!(
        metric_value(&text, ttft, &[("model", m), ("stream", "false")]),
        1.0
    );
    let requests = "llmlb_model_requests_total";
    assert_eq!(
        metric_value(
            &text,
            requests,
            &[("pool", "chat"), ("model", m), ("status", "200")]
        ),
        3.0
    );
    assert!(
        !text.contains("model=\"nope\""),
        "client-sent names make no series"
    );
    let tokens = "llmlb_model_tokens_total";
    assert_eq!(
        metric_value(&text, tokens, &[("model", m), ("kind", "completion")]),
        13.0
    );
    assert!(metric_value(&text, tokens, &[("model", m), ("kind", "prompt")]) > 0.0);
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        metric_value(&text, "llmlb_build_info", &[("version", version)]),
        1.0
    );
    assert!(metric_value(&text, "process_resident_memory_bytes", &[]) > 0.0);
    assert!(
        !text.contains("llmlb_rate_limit_backend_up{"),
        "no backend configured, no backend gauge"
    );
    // The replica's configured name, joined to its address by an info series.
    let url = format!("http://{}", sim.addr);
    assert_eq!(
        metric_value(
            &text,
            "llmlb_replica_info",
            &[("pool", "chat"), ("replica", "gpu-a"), ("url", &url)]
        ),
        1.0,
        "{text}"
    );
    assert_eq!(text.matches("llmlb_replica_info{").count(), 1);
}

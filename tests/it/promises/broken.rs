//! A stream that breaks midway is a failure: its own status label, and a
//! failure toward the replica's outlier ejection.

use std::time::Duration;

use super::raw::{Misbehaviour, RawUpstream};
use crate::common::*;

#[tokio::test]
async fn a_stream_broken_midway_counts_as_a_failure() {
    let breaker = RawUpstream::start(Misbehaviour::BreakMidStream).await;
    let lb = start_llmlb(&format!(
        "[[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\n\
         [pools.outlier]\nconsecutive_failures = 1\n\
         [pools.canary]\nweights = {{ v1 = 100 }}\n\
         [[pools.replicas]]\nurl = \"{}\"\nname = \"b\"\nversion = \"v1\"\n",
        breaker.url()
    ))
    .await;
    let (_c, resp) = open_stream(lb.addr).await;
    assert_eq!(resp.status(), 200);
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("\"error\""), "a readable error event: {text}");
    let mut metrics = String::new();
    for _ in 0..200 {
        metrics = metrics_text(lb.admin_addr).await;
        if metric_value(&metrics, "llmlb_requests_total", &[]) >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        metric_value(
            &metrics,
            "llmlb_requests_total",
            &[("status", "stream_error")]
        ),
        1.0,
        "{metrics}"
    );
    assert_eq!(
        metric_value(&metrics, "llmlb_requests_total", &[("status", "200")]),
        0.0
    );
    assert_eq!(
        metric_value(&metrics, "llmlb_outlier_ejections_total", &[]),
        1.0,
        "one broken stream with consecutive_failures = 1 ejects: {metrics}"
    );
    assert_eq!(
        metric_value(&metrics, "llmlb_version_errors_total", &[("version", "v1")]),
        1.0,
        "the canary version's errors count it: {metrics}"
    );
}

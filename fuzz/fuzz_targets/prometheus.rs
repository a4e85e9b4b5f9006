//! The Prometheus text reader and the load snapshot built from it, on
//! arbitrary pages: never panics; sums and means are finite when present.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llmlb::replica::LoadSnapshot;
use llmlb::signals::{MetricNames, parse};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for s in parse::samples(text) {
        let _ = s.label("engine");
    }
    if let Some(v) = parse::sum(text, "vllm:num_requests_running") {
        assert!(v.is_finite());
    }
    if let Some(v) = parse::mean(text, "vllm:kv_cache_usage_perc") {
        assert!(v.is_finite());
    }
    let _ = LoadSnapshot::from_text(text, &MetricNames::vllm(), 0);
    let _ = LoadSnapshot::from_text(text, &MetricNames::sglang(), 0);
});

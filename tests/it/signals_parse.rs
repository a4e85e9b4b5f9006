//! The Prometheus reader and the metric presets on replica-shaped pages:
//! vLLM with two engines (lines reordered, HELP/TYPE, histograms, `_created`
//! gauges, NaN), SGLang, the older vLLM KV name, garbage and truncation.

use llmlb::config::{CustomMetricNames, MetricsPreset, ScrapeConfig};
use llmlb::replica::LoadSnapshot;
use llmlb::signals::{MetricNames, parse};
use proptest::prelude::*;

const VLLM: &str = include_str!("../fixtures/vllm_two_engines.txt");
const SGLANG: &str = include_str!("../fixtures/sglang_metrics.txt");
/// Captured from a real vLLM 0.32 CPU replica (tiny random-weight model) in
/// just after a burst of ten 200-token completions.
const VLLM_REAL: &str = include_str!("../fixtures/vllm_cpu_real_metrics.txt");

#[test]
fn real_vllm_page() {
    let s = LoadSnapshot::from_text(VLLM_REAL, &MetricNames::vllm(), 3);
    assert_eq!(s.running, Some(0));
    // `vllm:num_requests_waiting_by_reason` must not be mistaken for the queue.
    assert_eq!(s.waiting, Some(0));
    assert_eq!(s.kv_usage, Some(0.0));
    // num_gpu_blocks 32 × block_size 128, as the page's kv_cache_size_tokens says.
    assert_eq!(s.kv_capacity_tokens, Some(4096));
    assert!(!s.is_empty());
    assert_eq!(
        parse::sum(VLLM_REAL, "vllm:generation_tokens_total"),
        Some(2019.0)
    );
    // Change the live values the way a loaded replica would report them.
    let loaded = VLLM_REAL
        .replace(
            "vllm:num_requests_waiting{engine=\"0\",model_name=\"tiny-llama\"} 0.0",
            "vllm:num_requests_waiting{engine=\"0\",model_name=\"tiny-llama\"} 6.0",
        )
        .replace(
            "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"tiny-llama\"} 0.0",
            "vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"tiny-llama\"} 0.8125",
        );
    let s = LoadSnapshot::from_text(&loaded, &MetricNames::vllm(), 3);
    assert_eq!(s.waiting, Some(6));
    assert_eq!(s.kv_usage, Some(0.8125));
}

#[test]
fn vllm_two_engines_summed_and_averaged() {
    let s = LoadSnapshot::from_text(VLLM, &MetricNames::vllm(), 7);
    assert_eq!(s.running, Some(11)); // 8 + 3
    assert_eq!(s.waiting, Some(7)); // 5 + 2, block printed last
    assert_eq!(s.kv_usage, Some(0.25)); // mean of 0.4375 and 0.0625
    assert_eq!(s.kv_capacity_tokens, Some(2 * 2048 * 16));
    assert_eq!(s.taken_at_ms, 7);
}

#[test]
fn vllm_other_series_are_readable_by_name() {
    assert_eq!(
        parse::sum(VLLM, "vllm:prompt_tokens_total"),
        Some(188_456.0)
    );
    assert_eq!(parse::sum(VLLM, "vllm:request_success_total"), Some(42.0));
    assert_eq!(
        parse::sum(VLLM, "vllm:time_to_first_token_seconds_count"),
        Some(42.0)
    );
    // The histogram's +Inf bucket is a sample like any other.
    let inf = parse::samples(VLLM)
        .find(|s| {
            s.name == "vllm:time_to_first_token_seconds_bucket"
                && s.label("le").as_deref() == Some("+Inf")
        })
        .unwrap();
    assert_eq!(inf.value, 42.0);
    // NaN-only series reads as absent.
    assert_eq!(parse::sum(VLLM, "vllm:spec_decode_acceptance"), None);
    assert_eq!(
        parse::sum(VLLM, "vllm:num_preemptions_created"),
        Some(1.7562345678901e9 + 1.7562345679e9)
    );
}

#[test]
fn line_order_does_not_matter() {
    let mut lines: Vec<&str> = VLLM.lines().collect();
    lines.reverse();
    let reversed = lines.join("\n");
    let a = LoadSnapshot::from_text(VLLM, &MetricNames::vllm(), 1);
    let b = LoadSnapshot::from_text(&reversed, &MetricNames::vllm(), 1);
    assert_eq!(a, b);
}

#[test]
fn older_vllm_kv_name() {
    let old = VLLM.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc");
    let s = LoadSnapshot::from_text(&old, &MetricNames::vllm(), 1);
    assert_eq!(s.kv_usage, Some(0.25));
}

#[test]
fn sglang_preset() {
    let s = LoadSnapshot::from_text(SGLANG, &MetricNames::sglang(), 1);
    assert_eq!(s.running, Some(17));
    assert_eq!(s.waiting, Some(4));
    assert_eq!(s.kv_usage, Some(0.61));
    assert_eq!(s.kv_capacity_tokens, None);
    // The vLLM preset finds nothing on an SGLang page.
    assert!(LoadSnapshot::from_text(SGLANG, &MetricNames::vllm(), 1).is_empty());
}

#[test]
fn custom_names_in_order_of_preference() {
    let cfg = ScrapeConfig {
        preset: MetricsPreset::Custom,
        metrics: CustomMetricNames {
            waiting: vec!["absent:queue".into(), "sglang:num_queue_reqs".into()],
            ..CustomMetricNames::default()
        },
        ..ScrapeConfig::default()
    };
    let s = LoadSnapshot::from_text(SGLANG, &MetricNames::from_config(&cfg), 1);
    assert_eq!(s.waiting, Some(4));
    assert_eq!(s.running, None);
}

#[test]
fn truncated_page_keeps_what_is_whole() {
    // Cut in the middle of the last waiting line: that line is dropped,
    // the complete one before it still counts.
    let cut = VLLM
        .rfind("vllm:num_requests_waiting{engine=\"1\"")
        .unwrap();
    let truncated = &VLLM[..cut + 30];
    let s = LoadSnapshot::from_text(truncated, &MetricNames::vllm(), 1);
    assert_eq!(s.waiting, Some(5));
    assert_eq!(s.running, Some(11));
}

#[test]
fn garbage_reads_as_nothing() {
    for text in [
        "",
        "\n\n\n",
        "}{}{}{",
        "vllm:num_requests_waiting{engine=\"0\" 5",
        "vllm:num_requests_waiting{engine=\"0\"} five",
        "\u{0}\u{1}\u{fffd}",
        "<html><body>502 Bad Gateway</body></html>",
    ] {
        assert!(
            LoadSnapshot::from_text(text, &MetricNames::vllm(), 1).is_empty(),
            "{text:?}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn never_panics_on_arbitrary_text(text in "\\PC*") {
        let s = LoadSnapshot::from_text(&text, &MetricNames::vllm(), 1);
        prop_assert!(s.kv_usage.is_none_or(|u| (0.0..=1.0).contains(&u)));
        let _ = parse::samples(&text).count();
    }

    #[test]
    fn never_panics_on_metric_shaped_text(
        lines in proptest::collection::vec(
            "(vllm:num_requests_waiting|vllm:kv_cache_usage_perc|x)(\\{[a-z_=\",\\\\{} ]{0,30}\\}?)? ?(NaN|\\+Inf|-Inf|[-+0-9.e]{0,12}|\\PC{0,5})( [0-9]{0,13})?",
            0..20,
        )
    ) {
        let text = lines.join("\n");
        let s = LoadSnapshot::from_text(&text, &MetricNames::vllm(), 1);
        prop_assert!(s.kv_usage.is_none_or(|u| (0.0..=1.0).contains(&u)));
        for sample in parse::samples(&text) {
            let _ = sample.label("engine");
        }
    }

    #[test]
    fn any_cut_of_the_fixture_is_safe(cut in 0usize..4000) {
        let cut = cut.min(VLLM.len());
        let cut = (0..=cut).rev().find(|&i| VLLM.is_char_boundary(i)).unwrap_or(0);
        let s = LoadSnapshot::from_text(&VLLM[..cut], &MetricNames::vllm(), 1);
        prop_assert!(s.waiting.is_none_or(|w| w <= 7));
    }
}

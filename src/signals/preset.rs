//! Which metric names carry a replica's load, per server kind.
//!
//! `vllm` reads both `vllm:kv_cache_usage_perc` and the name it had before
//! vLLM 0.9.2, `vllm:gpu_cache_usage_perc`; `sglang` reads SGLang's names;
//! `custom` takes the lists from the pool's config (and leaves the
//! prefix-cache names empty). The prefix-cache hit and lookup counters count
//! prompt tokens; SGLang exports a hit-rate gauge instead. Each list is tried in
//! order and the first name present in a scrape wins.

use crate::config::{MetricsPreset, ScrapeConfig};

/// Metric names to read, in order of preference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricNames {
    /// Requests in the replica's running batch (summed over engines).
    pub running: Vec<String>,
    /// Requests queued inside the replica (summed over engines).
    pub waiting: Vec<String>,
    /// KV-cache usage as a 0..1 fraction (averaged over engines).
    pub kv_usage: Vec<String>,
    /// An info gauge whose `num_gpu_blocks` and `block_size` labels give the
    /// KV capacity in tokens.
    pub cache_info: Option<String>,
    /// The cumulative prefix-cache lookup counter (restart detection).
    pub prefix_cache_queries: Vec<String>,
    /// The cumulative prefix-cache hit counter, in tokens (status page).
    pub prefix_cache_hits: Vec<String>,
    /// A 0..1 prefix-cache hit-rate gauge, for servers without counters.
    pub prefix_cache_hit_rate: Vec<String>,
    /// Histograms whose `_sum` and `_count` tell how fast the replica
    /// prefills and decodes (learned rates); `None` for servers without them.
    pub timing: Option<TimingNames>,
}

/// Base names of the histograms the learned rates read (`_sum`, `_count`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimingNames {
    /// Seconds each request spent in prefill.
    pub prefill_seconds: String,
    /// Prompt tokens each request computed in prefill (cache misses).
    pub prefill_tokens: String,
    /// Seconds between two output tokens.
    pub inter_token_seconds: String,
    /// Output tokens of each finished request.
    pub output_tokens: String,
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_string()).collect()
}

impl MetricNames {
    pub fn vllm() -> MetricNames {
        MetricNames {
            running: names(&["vllm:num_requests_running"]),
            waiting: names(&["vllm:num_requests_waiting"]),
            kv_usage: names(&["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"]),
            cache_info: Some("vllm:cache_config_info".into()),
            prefix_cache_queries: names(&[
                "vllm:prefix_cache_queries_total",
                "vllm:gpu_prefix_cache_queries_total",
                "vllm:prefix_cache_queries",
            ]),
            prefix_cache_hits: names(&[
                "vllm:prefix_cache_hits_total",
                "vllm:gpu_prefix_cache_hits_total",
                "vllm:prefix_cache_hits",
            ]),
            prefix_cache_hit_rate: Vec::new(),
            timing: Some(TimingNames {
                prefill_seconds: "vllm:request_prefill_time_seconds".into(),
                prefill_tokens: "vllm:request_prefill_kv_computed_tokens".into(),
                inter_token_seconds: "vllm:inter_token_latency_seconds".into(),
                output_tokens: "vllm:request_generation_tokens".into(),
            }),
        }
    }

    pub fn sglang() -> MetricNames {
        MetricNames {
            running: names(&["sglang:num_running_reqs"]),
            waiting: names(&["sglang:num_queue_reqs"]),
            kv_usage: names(&["sglang:token_usage"]),
            cache_info: None,
            prefix_cache_queries: Vec::new(),
            prefix_cache_hits: Vec::new(),
            prefix_cache_hit_rate: names(&["sglang:cache_hit_rate"]),
            timing: None,
        }
    }

    pub fn from_config(scrape: &ScrapeConfig) -> MetricNames {
        match scrape.preset {
            MetricsPreset::Vllm => MetricNames::vllm(),
            MetricsPreset::Sglang => MetricNames::sglang(),
            MetricsPreset::Custom => MetricNames {
                running: scrape.metrics.running.clone(),
                waiting: scrape.metrics.waiting.clone(),
                kv_usage: scrape.metrics.kv_usage.clone(),
                cache_info: None,
                prefix_cache_queries: Vec::new(),
                prefix_cache_hits: Vec::new(),
                prefix_cache_hit_rate: Vec::new(),
                timing: None,
            },
        }
    }
}

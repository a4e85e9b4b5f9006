//! `GET /metrics` of a simulated replica: every `vllm:` family vLLM 0.32
//! exposes (`vllm/v1/metrics/loggers.py`), in its order, with its names, help
//! texts, types, labels and histogram buckets, filled from the engine's
//! statistics. [`super::exposition`] writes them in the Python client's text
//! format. Rendering happens on each scrape; nothing here is on the request
//! path.

use super::engine::{EngineParams, EngineStats, FinishReason};
use super::exposition::{Out, go_float};

/// Labels shared by every series of one replica.
pub struct Labels<'a> {
    pub model: &'a str,
    pub engine: &'a str,
}

/// Counted outside the engine: requests refused by the queue limit.
#[derive(Debug, Clone, Copy, Default)]
pub struct Refusals {
    pub queue_full: u64,
}

/// The Prometheus text of one replica's statistics, families in vLLM's
/// order. `created` is the Unix time the replica started (the value of every
/// `_created` series).
pub fn render(
    stats: &EngineStats,
    params: &EngineParams,
    refusals: Refusals,
    labels: &Labels<'_>,
    created: f64,
) -> String {
    let mut o = Out {
        text: String::with_capacity(32 * 1024),
        base: vec![("engine", labels.engine), ("model_name", labels.model)],
        created,
    };
    let none: &[(&str, &str)] = &[];
    for (name, help) in [
        ("flops", "floating point operations"),
        ("read_bytes", "bytes read from memory"),
        ("write_bytes", "bytes written to memory"),
    ] {
        o.counter(
            &format!("vllm:estimated_{name}_per_gpu"),
            &format!(
                "Estimated number of {help} per GPU (for Model Flops Utilization calculations)."
            ),
            &[(none, 0.0)],
        );
    }
    o.gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        &[(none, stats.num_running as f64)],
    );
    o.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        &[(none, stats.num_waiting as f64)],
    );
    o.gauge(
        "vllm:num_requests_waiting_by_reason",
        "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
        &[
            (&[("reason", "capacity")], stats.num_waiting as f64),
            (&[("reason", "deferred")], 0.0),
        ],
    );
    o.gauge(
        "vllm:engine_sleep_state",
        "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.",
        &[
            (&[("sleep_state", "awake")], 1.0),
            (&[("sleep_state", "weights_offloaded")], 0.0),
            (&[("sleep_state", "discard_all")], 0.0),
        ],
    );
    o.gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        &[(none, stats.kv_usage)],
    );
    o.counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        &[(none, stats.prefix_queries as f64)],
    );
    o.counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        &[(none, stats.prefix_hits as f64)],
    );
    o.counter(
        "vllm:external_prefix_cache_queries",
        "External prefix cache queries from KV connector cross-instance cache sharing, in terms of number of queried tokens.",
        &[(none, 0.0)],
    );
    o.counter(
        "vllm:external_prefix_cache_hits",
        "External prefix cache hits from KV connector cross-instance cache sharing, in terms of number of cached tokens.",
        &[(none, 0.0)],
    );
    o.counter(
        "vllm:mm_cache_queries",
        "Multi-modal cache queries, in terms of number of queried items.",
        &[(none, 0.0)],
    );
    o.counter(
        "vllm:mm_cache_hits",
        "Multi-modal cache hits, in terms of number of cached items.",
        &[(none, 0.0)],
    );
    o.counter(
        "vllm:num_preemptions",
        "Cumulative number of preemption from the engine.",
        &[(none, stats.preemptions as f64)],
    );
    o.counter(
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        &[(none, stats.prompt_tokens as f64)],
    );
    o.counter(
        "vllm:prompt_tokens_by_source",
        "Number of prompt tokens by source.",
        &[
            (
                &[("source", "local_compute")],
                (stats.prompt_tokens - stats.prompt_tokens_cached) as f64,
            ),
            (
                &[("source", "local_cache_hit")],
                stats.prompt_tokens_cached as f64,
            ),
            (&[("source", "external_kv_transfer")], 0.0),
        ],
    );
    o.counter(
        "vllm:prompt_tokens_cached",
        "Number of cached prompt tokens (local + external).",
        &[(none, stats.prompt_tokens_cached as f64)],
    );
    o.counter(
        "vllm:prompt_tokens_cached_by_source",
        "Prefix-cache hit tokens by the cache tier that supplied them: device (local HBM), host (offloaded to DRAM), disk, p2p (transferred from another vLLM instance) or external_unspecified. Counted at admission; sums to vllm:prefix_cache_hits + vllm:external_prefix_cache_hits.",
        &[
            (&[("source", "device")], stats.prefix_hits as f64),
            (&[("source", "host")], 0.0),
            (&[("source", "p2p")], 0.0),
            (&[("source", "disk")], 0.0),
            (&[("source", "external_unspecified")], 0.0),
        ],
    );
    o.counter(
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        &[(none, stats.generation_tokens as f64)],
    );
    let reasons: Vec<([(&str, &str); 1], f64)> = FinishReason::ALL
        .iter()
        .map(|&r| {
            (
                [("finished_reason", r.as_str())],
                stats.finished_with(r) as f64,
            )
        })
        .chain(["error", "repetition"].map(|r| ([("finished_reason", r)], 0.0)))
        .collect();
    let reasons: Vec<(&[(&str, &str)], f64)> = reasons.iter().map(|(l, v)| (&l[..], *v)).collect();
    o.counter(
        "vllm:request_success",
        "Count of successfully processed requests.",
        &reasons,
    );
    // vLLM counts admission rejections in its API server: no `engine` label.
    let base = std::mem::replace(&mut o.base, vec![("model_name", labels.model)]);
    o.counter(
        "vllm:admission_rejections",
        "Number of admission attempts rejected by a queue limit, by reason.",
        &[
            (
                &[("reason", "max_num_queued_reqs")],
                refusals.queue_full as f64,
            ),
            (&[("reason", "max_num_queued_tokens")], 0.0),
        ],
    );
    o.base = base;
    for (name, help, h) in [
        (
            "vllm:request_prompt_tokens",
            "Number of prefill tokens processed.",
            &stats.request_prompt_tokens,
        ),
        (
            "vllm:request_generation_tokens",
            "Number of generation tokens processed.",
            &stats.request_generation_tokens,
        ),
        (
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            &stats.iteration_tokens,
        ),
        (
            "vllm:request_max_num_generation_tokens",
            "Histogram of maximum number of requested generation tokens.",
            &stats.request_max_tokens,
        ),
        (
            "vllm:request_params_n",
            "Histogram of the n request parameter.",
            &stats.request_n,
        ),
        (
            "vllm:request_params_max_tokens",
            "Histogram of the max_tokens request parameter.",
            &stats.request_max_tokens,
        ),
        (
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            &stats.ttft,
        ),
        (
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            &stats.itl,
        ),
        (
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            &stats.time_per_output_token,
        ),
        (
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            &stats.e2e,
        ),
        (
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            &stats.queue_time,
        ),
        (
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            &stats.inference_time,
        ),
        (
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            &stats.prefill_time,
        ),
        (
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            &stats.decode_time,
        ),
        (
            "vllm:request_num_preemptions",
            "Histogram of the number of times a request was preempted.",
            &stats.request_preemptions,
        ),
        (
            "vllm:request_prefill_kv_computed_tokens",
            "Histogram of new KV tokens computed during prefill (excluding cached tokens).",
            &stats.request_prefill_computed,
        ),
    ] {
        o.histogram(name, help, h);
    }
    cache_config_info(&mut o, params, labels.engine);
    o.text
}

/// vLLM's `cache_config_info`: a gauge set to 1 whose labels are the cache
/// configuration, with vLLM 0.32's label set (values that have no meaning
/// here are vLLM's defaults).
fn cache_config_info(o: &mut Out<'_>, params: &EngineParams, engine: &str) {
    let block_size = params.block_size.to_string();
    let blocks = params.num_blocks.to_string();
    let tokens = params.num_blocks * params.block_size;
    let concurrency = go_float(tokens as f64 / params.max_model_len as f64);
    let tokens = tokens.to_string();
    let caching = if params.enable_prefix_caching {
        "True"
    } else {
        "False"
    };
    o.info(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        &[
            ("_block_size_resolved", "True"),
            ("block_size", &block_size),
            ("cache_dtype", "auto"),
            ("cache_hit_alignment_tokens", "None"),
            ("effective_attention_block_size", &block_size),
            ("enable_mamba_shared_prefix_checkpoint", "False"),
            ("enable_prefix_caching", caching),
            ("engine", engine),
            ("gpu_memory_utilization", "0.9"),
            ("hash_block_size", "None"),
            ("is_attention_free", "False"),
            ("kv_cache_dtype_skip_layers", "[]"),
            ("kv_cache_layout", "None"),
            ("kv_cache_max_concurrency", &concurrency),
            ("kv_cache_memory_bytes", "None"),
            ("kv_cache_size_tokens", &tokens),
            ("kv_offloading_backend", "native"),
            ("kv_offloading_size", "None"),
            ("kv_sharing_fast_prefill", "False"),
            ("mamba_block_size", "None"),
            ("mamba_cache_dtype", "auto"),
            ("mamba_cache_mode", "none"),
            ("mamba_page_size_padded", "None"),
            ("mamba_ssm_cache_dtype", "float32"),
            ("num_cpu_blocks", "None"),
            ("num_gpu_blocks", &blocks),
            ("num_gpu_blocks_override", "None"),
            ("prefix_cache_retention_interval", "0"),
            ("prefix_caching_hash_algo", "builtin"),
            ("prefix_match_unit", "None"),
            ("replayssm_buffer_len", "16"),
            ("skip_page_size_padded", "None"),
            ("sliding_window", "None"),
            ("swa_bounded_replay", "True"),
            ("use_kda_recoverssm", "False"),
            ("use_replayssm", "False"),
            ("user_specified_block_size", "False"),
        ],
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica_sim::SimConfig;

    #[test]
    fn exposition_matches_the_captured_vllm_output() {
        let p = SimConfig::profile("vllm-cpu-tiny").unwrap();
        let stats = EngineStats::new(p.engine.usable_blocks(), p.engine.max_model_len);
        let labels = Labels {
            model: "tiny-llama",
            engine: "0",
        };
        let text = render(&stats, &p.engine, Refusals::default(), &labels, 1.7e9);
        let real = include_str!("../../tests/fixtures/vllm_metrics.txt");
        let vllm_only = |t: &'static str| -> Vec<&'static str> {
            t.lines()
                .filter(|l| {
                    l.starts_with("vllm:")
                        || l.starts_with("# HELP vllm:")
                        || l.starts_with("# TYPE vllm:")
                })
                .collect()
        };
        let ours: Vec<&str> = text.lines().collect();
        let real = vllm_only(real);
        // The same families, help texts and types, in the same order.
        let headers = |lines: &[&str]| -> Vec<String> {
            lines
                .iter()
                .filter(|l| l.starts_with('#'))
                .map(|l| l.to_string())
                .collect()
        };
        assert_eq!(headers(&ours), headers(&real));
        // The same series: names, label names and label values (bucket
        // bounds, reasons, sources), compared without their values; for
        // cache_config_info, the same label names.
        let series = |lines: &[&str]| -> Vec<String> {
            let mut v: Vec<String> = lines
                .iter()
                .filter(|l| !l.starts_with('#'))
                .map(|l| {
                    let id = &l[..l.rfind(' ').unwrap()];
                    if id.starts_with("vllm:cache_config_info{") {
                        label_names(l).join(",")
                    } else {
                        id.to_string()
                    }
                })
                .collect();
            v.sort();
            v
        };
        assert_eq!(series(&ours), series(&real));
        assert!(text.contains(
            "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"2560.0\",model_name=\"tiny-llama\"} 0.0"
        ));
        assert!(text.contains("num_gpu_blocks=\"32\""));
    }

    fn label_names(line: &str) -> Vec<String> {
        let inner = &line[line.find('{').unwrap() + 1..line.rfind('}').unwrap()];
        inner
            .split("\",")
            .map(|kv| kv.split('=').next().unwrap().to_string())
            .collect()
    }
}

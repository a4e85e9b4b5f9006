//! `GET /metrics` of a simulated replica, in the exact shape vLLM's
//! Prometheus endpoint has (`vllm/v1/metrics/loggers.py`, exposed by the
//! Python `prometheus_client`):
//!
//! - names, help texts, types and histogram buckets as vLLM's;
//! - labels `engine` and `model_name` on every series (plus
//!   `finished_reason` and `le` where vLLM has them), sorted by name;
//! - every counter `X` as `X_total` plus a separate `X_created` gauge (the
//!   Unix time the series was created), and histograms with `_created` too;
//! - values printed like Python's client prints them: `8.0`, `0.4375`,
//!   `1.756e+09`, `+Inf`.
//!
//! The engine's statistics are copied into the text on each scrape; nothing
//! here is on the request path.

use std::fmt::Write;

use super::engine::{EngineParams, EngineStats, FinishReason, Histogram};

/// Labels shared by every series of one replica.
pub struct Labels<'a> {
    pub model: &'a str,
    pub engine: &'a str,
}

/// The Prometheus text of one replica's statistics. `created` is the Unix
/// time the replica started (the value of every `_created` series).
pub fn render(
    stats: &EngineStats,
    params: &EngineParams,
    labels: &Labels<'_>,
    created: f64,
) -> String {
    let mut o = Out {
        text: String::with_capacity(16 * 1024),
        base: vec![("engine", labels.engine), ("model_name", labels.model)],
        created,
    };
    o.gauge(
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        stats.num_running as f64,
    );
    o.gauge(
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        stats.num_waiting as f64,
    );
    o.gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        stats.kv_usage,
    );
    o.counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        &[(&[], stats.prefix_queries as f64)],
    );
    o.counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        &[(&[], stats.prefix_hits as f64)],
    );
    o.counter(
        "vllm:num_preemptions",
        "Cumulative number of preemption from the engine.",
        &[(&[], stats.preemptions as f64)],
    );
    o.counter(
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        &[(&[], stats.prompt_tokens as f64)],
    );
    o.counter(
        "vllm:prompt_tokens_cached",
        "Number of cached prompt tokens (local + external).",
        &[(&[], stats.prefix_hits as f64)],
    );
    o.counter(
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        &[(&[], stats.generation_tokens as f64)],
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
    o.histogram(
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &stats.ttft,
    );
    o.histogram(
        "vllm:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        &stats.itl,
    );
    o.histogram(
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        &stats.e2e,
    );
    o.histogram(
        "vllm:request_queue_time_seconds",
        "Histogram of time spent in WAITING phase for request.",
        &stats.queue_time,
    );
    let block_size = params.block_size.to_string();
    let blocks = params.num_blocks.to_string();
    let tokens = (params.num_blocks * params.block_size).to_string();
    let caching = if params.enable_prefix_caching {
        "True"
    } else {
        "False"
    };
    o.info(
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        &[
            ("block_size", &block_size),
            ("cache_dtype", "auto"),
            ("enable_prefix_caching", caching),
            ("engine", labels.engine),
            ("kv_cache_size_tokens", &tokens),
            ("num_cpu_blocks", "None"),
            ("num_gpu_blocks", &blocks),
            ("sliding_window", "None"),
        ],
    );
    o.text
}

struct Out<'a> {
    text: String,
    base: Vec<(&'static str, &'a str)>,
    created: f64,
}

impl Out<'_> {
    fn family(&mut self, name: &str, help: &str, kind: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, extra: &[(&str, &str)], value: f64) {
        let mut labels: Vec<(&str, &str)> = self
            .base
            .iter()
            .copied()
            .chain(extra.iter().copied())
            .collect();
        labels.sort_by(|a, b| a.0.cmp(b.0));
        write_sample(&mut self.text, name, &labels, value);
    }

    fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.family(name, help, "gauge");
        self.sample(name, &[], value);
    }

    fn counter(&mut self, base: &str, help: &str, series: &[(&[(&str, &str)], f64)]) {
        let total = format!("{base}_total");
        self.family(&total, help, "counter");
        for (labels, v) in series {
            self.sample(&total, labels, *v);
        }
        let created = format!("{base}_created");
        self.family(&created, help, "gauge");
        for (labels, _) in series {
            self.sample(&created, labels, self.created);
        }
    }

    fn histogram(&mut self, name: &str, help: &str, h: &Histogram) {
        self.family(name, help, "histogram");
        let bucket = format!("{name}_bucket");
        for (le, count) in h.cumulative() {
            let le = go_float(le);
            self.sample(&bucket, &[("le", &le)], count as f64);
        }
        self.sample(&format!("{name}_count"), &[], h.count as f64);
        self.sample(&format!("{name}_sum"), &[], h.sum);
        let created = format!("{name}_created");
        self.family(&created, help, "gauge");
        self.sample(&created, &[], self.created);
    }

    /// A gauge set to 1 whose labels carry the information (no `model_name`, as in vLLM).
    fn info(&mut self, name: &str, help: &str, labels: &[(&str, &str)]) {
        self.family(name, help, "gauge");
        let mut labels = labels.to_vec();
        labels.sort_by(|a, b| a.0.cmp(b.0));
        write_sample(&mut self.text, name, &labels, 1.0);
    }
}

fn write_sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    out.push_str(name);
    out.push('{');
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(out, "{k}=\"{}\"", escape(v));
    }
    let _ = writeln!(out, "}} {}", go_float(value));
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Formats a value as Python's `prometheus_client` does (`floatToGoString`):
/// Python's `repr`, switching to an exponent for positive numbers with more
/// than six digits before the point.
pub fn go_float(v: f64) -> String {
    if v == f64::INFINITY {
        return "+Inf".into();
    }
    if v == f64::NEG_INFINITY {
        return "-Inf".into();
    }
    if v.is_nan() {
        return "NaN".into();
    }
    let s = python_repr(v);
    if let Some(dot) = s.find('.')
        && v > 0.0
        && dot > 6
    {
        let digits = format!("{}{}", &s[..dot], &s[dot + 1..]);
        let mut mantissa = format!("{}.{}", &digits[..1], &digits[1..]);
        while mantissa.ends_with('0') {
            mantissa.pop();
        }
        if mantissa.ends_with('.') {
            mantissa.pop();
        }
        return format!("{mantissa}e+0{}", dot - 1);
    }
    s
}

/// Python's `repr(float)`: shortest round-trip digits; scientific below 1e-4
/// and from 1e16, with a two-digit signed exponent.
fn python_repr(v: f64) -> String {
    let a = v.abs();
    if a != 0.0 && !(1e-4..1e16).contains(&a) {
        let s = format!("{v:e}");
        let (m, e) = s.split_once('e').expect("exponent form");
        let (sign, digits) = match e.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', e),
        };
        return format!("{m}e{sign}{digits:0>2}");
    }
    let s = format!("{v:?}");
    if s.contains('.') { s } else { format!("{s}.0") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::SimConfig;

    #[test]
    fn floats_print_like_python_prometheus_client() {
        assert_eq!(go_float(8.0), "8.0");
        assert_eq!(go_float(0.4375), "0.4375");
        assert_eq!(go_float(0.001), "0.001");
        assert_eq!(go_float(2560.0), "2560.0");
        assert_eq!(go_float(1_756_000_000.0), "1.756e+09");
        assert_eq!(go_float(1.795942296663666e9), "1.795942296663666e+09");
        assert_eq!(go_float(1024.0), "1024.0");
        assert_eq!(go_float(f64::INFINITY), "+Inf");
        assert_eq!(go_float(f64::NAN), "NaN");
        assert_eq!(go_float(0.00001), "1e-05");
        assert_eq!(go_float(0.0), "0.0");
    }

    #[test]
    fn families_match_the_captured_vllm_exposition() {
        let p = SimConfig::profile("vllm-cpu-tiny").unwrap();
        let stats = EngineStats::new(p.engine.num_blocks);
        let text = render(
            &stats,
            &p.engine,
            &Labels {
                model: "tiny-llama",
                engine: "0",
            },
            1.7e9,
        );
        let real = include_str!("../../tests/fixtures/vllm_metrics.txt");
        // Every family and every HELP line we emit exists, identical, in real vLLM output.
        for line in text.lines().filter(|l| l.starts_with('#')) {
            assert!(
                real.lines().any(|r| r == line),
                "not in vLLM's output: {line}"
            );
        }
        // Same label names per sample name, and same bucket bounds.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = &line[..line.find('{').unwrap()];
            let labels = label_names(line);
            if name == "vllm:cache_config_info" {
                continue; // vLLM's label set is longer; ours is a subset.
            }
            let found = real.lines().filter(|r| !r.starts_with('#')).any(|r| {
                r.starts_with(&format!("{name}{{"))
                    && label_names(r) == labels
                    && le_of(r) == le_of(line)
            });
            assert!(found, "no sample like {line}");
        }
        assert!(text.contains(
            "vllm:time_to_first_token_seconds_bucket{engine=\"0\",le=\"2560.0\",model_name=\"tiny-llama\"} 0.0"
        ));
        assert!(text.contains("vllm:cache_config_info{block_size=\"128\","));
    }

    fn label_names(line: &str) -> Vec<String> {
        let inner = &line[line.find('{').unwrap() + 1..line.rfind('}').unwrap()];
        inner
            .split("\",")
            .map(|kv| kv.split('=').next().unwrap().to_string())
            .collect()
    }

    fn le_of(line: &str) -> Option<String> {
        line.split("le=\"")
            .nth(1)
            .map(|s| s[..s.find('"').unwrap()].to_string())
    }
}

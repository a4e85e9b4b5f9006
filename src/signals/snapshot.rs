//! Reading one scrape's text into a [`LoadSnapshot`] (the type lives with
//! the replica state, `replica::snapshot`): one pass over the samples, each
//! load metric taken from the first of its preset's names that is present.
//!
//! A missing metric stays `None` rather than becoming zero, so a balancer can
//! tell "idle" from "unknown". Negative or non-finite values count as missing.

use super::parse;
use super::preset::{MetricNames, TimingNames};
use crate::replica::{EngineTiming, LoadSnapshot};

impl LoadSnapshot {
    /// Reads one scrape in a single pass. `taken_at_ms` is when the scrape completed.
    pub fn from_text(text: &str, names: &MetricNames, taken_at_ms: u64) -> LoadSnapshot {
        let mut running = Acc::new(&names.running);
        let mut waiting = Acc::new(&names.waiting);
        let mut kv = Acc::new(&names.kv_usage);
        let mut queries = Acc::new(&names.prefix_cache_queries);
        let mut hits = Acc::new(&names.prefix_cache_hits);
        let mut hit_gauge = Acc::new(&names.prefix_cache_hit_rate);
        let mut capacity: Option<u64> = None;
        let cache_info = names.cache_info.as_deref();
        let mut timing = EngineTiming::default();
        for s in parse::samples(text) {
            if let Some(t) = &names.timing {
                timing.add(t, s.name, s.value);
            }
            running.add(s.name, s.value);
            waiting.add(s.name, s.value);
            kv.add(s.name, s.value);
            queries.add(s.name, s.value);
            hits.add(s.name, s.value);
            hit_gauge.add(s.name, s.value);
            if Some(s.name) == cache_info {
                let blocks = s
                    .label("num_gpu_blocks")
                    .and_then(|v| v.parse::<u64>().ok());
                let size = s.label("block_size").and_then(|v| v.parse::<u64>().ok());
                if let (Some(b), Some(z)) = (blocks, size) {
                    capacity = Some(capacity.unwrap_or(0).saturating_add(b.saturating_mul(z)));
                }
            }
        }
        let count = |v: Option<f64>| {
            v.filter(|v| *v >= 0.0)
                .map(|v| v.round().min(u64::MAX as f64) as u64)
        };
        LoadSnapshot {
            running: count(running.sum()),
            waiting: count(waiting.sum()),
            kv_usage: kv.mean().filter(|v| *v >= 0.0).map(|v| v.min(1.0)),
            kv_capacity_tokens: capacity.filter(|t| *t > 0),
            prefix_cache_queries: queries.sum().filter(|v| *v >= 0.0),
            prefix_cache_hits: hits.sum().filter(|v| *v >= 0.0),
            prefix_cache_hit_gauge: hit_gauge.mean().filter(|v| *v >= 0.0).map(|v| v.min(1.0)),
            timing,
            taken_at_ms,
        }
    }
}

impl EngineTiming {
    fn add(&mut self, names: &TimingNames, name: &str, value: f64) {
        if !value.is_finite() || value < 0.0 {
            return;
        }
        let slot = match name.strip_suffix("_sum") {
            Some(base) if base == names.prefill_seconds => &mut self.prefill_seconds,
            Some(base) if base == names.prefill_tokens => &mut self.prefill_tokens,
            Some(base) if base == names.inter_token_seconds => &mut self.inter_token_seconds,
            Some(base) if base == names.output_tokens => &mut self.output_tokens,
            Some(_) => return,
            None => match name.strip_suffix("_count") {
                Some(base) if base == names.prefill_seconds => &mut self.prefill_requests,
                Some(base) if base == names.inter_token_seconds => &mut self.inter_tokens,
                Some(base) if base == names.output_tokens => &mut self.finished_requests,
                _ => return,
            },
        };
        *slot = Some(slot.unwrap_or(0.0) + value);
    }
}

/// Sums of the finite values per candidate name; the first name (in order of
/// preference) that had any wins.
struct Acc<'n> {
    names: &'n [String],
    sums: Vec<(f64, usize)>,
}

impl<'n> Acc<'n> {
    fn new(names: &'n [String]) -> Acc<'n> {
        Acc {
            names,
            sums: vec![(0.0, 0); names.len()],
        }
    }

    fn add(&mut self, name: &str, value: f64) {
        if !value.is_finite() {
            return;
        }
        if let Some(i) = self.names.iter().position(|n| n == name) {
            self.sums[i].0 += value;
            self.sums[i].1 += 1;
        }
    }

    fn first(&self) -> Option<(f64, usize)> {
        self.sums.iter().copied().find(|(_, n)| *n > 0)
    }

    fn sum(&self) -> Option<f64> {
        self.first().map(|(s, _)| s)
    }

    fn mean(&self) -> Option<f64> {
        self.first().map(|(s, n)| s / n as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_metrics_stay_unknown() {
        let s = LoadSnapshot::from_text("other 1\n", &MetricNames::vllm(), 5);
        assert!(s.is_empty());
        assert_eq!(s.taken_at_ms, 5);
    }

    #[test]
    fn prefix_cache_queries_summed_over_engines() {
        let s = LoadSnapshot::from_text(
            "vllm:prefix_cache_queries_total{engine=\"0\"} 100\nvllm:prefix_cache_queries_total{engine=\"1\"} 28\nvllm:prefix_cache_queries_created 1.7e9\n",
            &MetricNames::vllm(),
            1,
        );
        assert_eq!(s.prefix_cache_queries, Some(128.0));
    }

    #[test]
    fn prefix_cache_hit_rate_from_vllm_counters() {
        let text = "# TYPE vllm:prefix_cache_hits_total counter\n\
            vllm:prefix_cache_hits_total{engine=\"0\"} 30\n\
            vllm:prefix_cache_hits_total{engine=\"1\"} 10\n\
            vllm:prefix_cache_queries_total{engine=\"0\"} 60\n\
            vllm:prefix_cache_queries_total{engine=\"1\"} 40\n\
            vllm:num_requests_running 2\n";
        let s = LoadSnapshot::from_text(text, &MetricNames::vllm(), 1);
        assert_eq!(s.prefix_cache_hits, Some(40.0));
        assert_eq!(s.prefix_cache_queries, Some(100.0));
        assert_eq!(s.prefix_cache_hit_rate(), Some(0.4));
        assert_eq!(s.running, Some(2));
    }

    #[test]
    fn prefix_cache_hit_rate_unknown_without_lookups() {
        let zero = LoadSnapshot::from_text(
            "vllm:prefix_cache_hits_total 0\nvllm:prefix_cache_queries_total 0\n",
            &MetricNames::vllm(),
            1,
        );
        assert_eq!(zero.prefix_cache_hits, Some(0.0));
        assert_eq!(zero.prefix_cache_hit_rate(), None);
        let absent =
            LoadSnapshot::from_text("vllm:num_requests_running 1\n", &MetricNames::vllm(), 1);
        assert_eq!(absent.prefix_cache_hits, None);
        assert_eq!(absent.prefix_cache_hit_rate(), None);
    }

    #[test]
    fn sglang_hit_rate_gauge() {
        let s = LoadSnapshot::from_text(
            "sglang:cache_hit_rate{model_name=\"m\"} 0.75\nsglang:num_running_reqs 3\n",
            &MetricNames::sglang(),
            1,
        );
        assert_eq!(s.prefix_cache_hit_gauge, Some(0.75));
        assert_eq!(s.prefix_cache_hit_rate(), Some(0.75));
        assert_eq!(s.prefix_cache_hits, None);
    }

    #[test]
    fn timing_histograms_read_from_the_real_vllm_page() {
        let text = include_str!("../../tests/fixtures/vllm_cpu_real_metrics.txt");
        let t = LoadSnapshot::from_text(text, &MetricNames::vllm(), 1).timing;
        assert_eq!(t.prefill_requests, Some(13.0));
        assert_eq!(t.prefill_tokens, Some(200.0));
        assert_eq!(t.inter_tokens, Some(2006.0));
        assert_eq!(t.output_tokens, Some(2019.0));
        assert_eq!(t.finished_requests, Some(13.0));
        assert!((t.prefill_seconds.unwrap() - 0.081_469_771).abs() < 1e-6);
        assert!((t.inter_token_seconds.unwrap() - 2.876_886_113).abs() < 1e-6);
        let none = LoadSnapshot::from_text(text, &MetricNames::sglang(), 1).timing;
        assert_eq!(none, EngineTiming::default());
    }

    #[test]
    fn older_kv_name_is_accepted() {
        let s = LoadSnapshot::from_text(
            "vllm:gpu_cache_usage_perc{engine=\"0\"} 0.25\n",
            &MetricNames::vllm(),
            1,
        );
        assert_eq!(s.kv_usage, Some(0.25));
    }

    #[test]
    fn negative_and_infinite_values_are_missing() {
        let s = LoadSnapshot::from_text(
            "vllm:num_requests_waiting -3\nvllm:num_requests_running +Inf\n",
            &MetricNames::vllm(),
            1,
        );
        assert_eq!(s.waiting, None);
        assert_eq!(s.running, None);
    }
}

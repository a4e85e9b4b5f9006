//! What the engine counts: the numbers behind vLLM's Prometheus metrics, kept
//! as plain values by the engine that owns them and copied out as a snapshot.
//!
//! Latencies are in engine (simulated) seconds: with a time scale of 10 the
//! histograms show what the replica would report at real speed.

use std::sync::Arc;

/// `vllm:time_to_first_token_seconds` buckets (vllm/v1/metrics/loggers.py).
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// `vllm:inter_token_latency_seconds` buckets.
pub const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

/// `vllm:e2e_request_latency_seconds` buckets (also used for the queue time).
pub const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// `vllm:iteration_tokens_total` buckets.
pub const ITERATION_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];

/// `vllm:request_num_preemptions` buckets.
pub const PREEMPTION_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 10.0, 20.0];

/// vLLM's 1-2-5 series up to `max` (1, 2, 5, 10, 20, 50, ...), used for its
/// token-count histograms with `max` = `max_model_len`.
pub fn one_two_five(max: usize) -> Vec<f64> {
    let mut out = Vec::new();
    let mut scale = 1usize;
    loop {
        for m in [1, 2, 5] {
            let v = m * scale;
            if v > max {
                return out;
            }
            out.push(v as f64);
        }
        scale *= 10;
    }
}

/// A cumulative-on-render histogram with fixed upper bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    pub bounds: Arc<[f64]>,
    /// Observations per bucket (not cumulative); one more than `bounds` for +Inf.
    pub counts: Vec<u64>,
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    pub fn new(bounds: impl Into<Arc<[f64]>>) -> Histogram {
        let bounds: Arc<[f64]> = bounds.into();
        Histogram {
            counts: vec![0; bounds.len() + 1],
            bounds,
            sum: 0.0,
            count: 0,
        }
    }

    pub fn observe(&mut self, v: f64) {
        let i = self.bounds.partition_point(|&b| b < v);
        self.counts[i] += 1;
        self.sum += v;
        self.count += 1;
    }

    /// `(upper bound, cumulative count)` pairs, ending with `+Inf`.
    pub fn cumulative(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        let mut acc = 0;
        self.bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(self.counts.iter())
            .map(move |(b, c)| {
                acc += c;
                (b, acc)
            })
    }
}

/// Why a request left the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// The model emitted a stop token (the filler never does; kept for the label set).
    Stop,
    /// `max_tokens` reached.
    Length,
    /// Aborted: the client went away.
    Abort,
}

impl FinishReason {
    pub const ALL: [FinishReason; 3] = [
        FinishReason::Stop,
        FinishReason::Length,
        FinishReason::Abort,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }
}

/// Everything the engine counts, at one instant.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineStats {
    pub num_running: usize,
    pub num_waiting: usize,
    pub kv_usage: f64,
    /// Blocks that can hold tokens (the null block excluded).
    pub num_blocks: usize,
    pub free_blocks: usize,
    /// Prompt tokens looked up in / found in the prefix cache, at first admission.
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    pub preemptions: u64,
    /// Prompt tokens of requests that produced their first token, and the
    /// part of them served from the prefix cache.
    pub prompt_tokens: u64,
    pub prompt_tokens_cached: u64,
    pub generation_tokens: u64,
    /// Finished requests by reason, in [`FinishReason::ALL`] order.
    pub finished: [u64; 3],
    /// Blocks released by aborted requests.
    pub aborted_blocks_freed: u64,
    /// Cached blocks evicted to make room.
    pub evictions: u64,
    pub steps: u64,
    /// Engine time spent running steps, seconds.
    pub busy_time: f64,
    /// Per token and per step.
    pub ttft: Histogram,
    pub itl: Histogram,
    pub iteration_tokens: Histogram,
    /// Per request, observed when it finishes (`max_tokens` reached).
    pub e2e: Histogram,
    pub queue_time: Histogram,
    pub inference_time: Histogram,
    pub prefill_time: Histogram,
    pub decode_time: Histogram,
    pub time_per_output_token: Histogram,
    pub request_prompt_tokens: Histogram,
    pub request_generation_tokens: Histogram,
    pub request_max_tokens: Histogram,
    pub request_n: Histogram,
    pub request_preemptions: Histogram,
    pub request_prefill_computed: Histogram,
}

impl EngineStats {
    /// Zeroed statistics; token-count buckets follow `max_model_len`, as vLLM's do.
    pub fn new(num_blocks: usize, max_model_len: usize) -> EngineStats {
        let tokens: Arc<[f64]> = one_two_five(max_model_len).into();
        let latency: Arc<[f64]> = E2E_BUCKETS.into();
        EngineStats {
            num_running: 0,
            num_waiting: 0,
            kv_usage: 0.0,
            num_blocks,
            free_blocks: num_blocks,
            prefix_queries: 0,
            prefix_hits: 0,
            preemptions: 0,
            prompt_tokens: 0,
            prompt_tokens_cached: 0,
            generation_tokens: 0,
            finished: [0; 3],
            aborted_blocks_freed: 0,
            evictions: 0,
            steps: 0,
            busy_time: 0.0,
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            iteration_tokens: Histogram::new(ITERATION_BUCKETS),
            e2e: Histogram::new(latency.clone()),
            queue_time: Histogram::new(latency.clone()),
            inference_time: Histogram::new(latency.clone()),
            prefill_time: Histogram::new(latency.clone()),
            decode_time: Histogram::new(latency),
            time_per_output_token: Histogram::new(ITL_BUCKETS),
            request_prompt_tokens: Histogram::new(tokens.clone()),
            request_generation_tokens: Histogram::new(tokens.clone()),
            request_max_tokens: Histogram::new(tokens.clone()),
            request_n: Histogram::new(one_two_five(20)),
            request_preemptions: Histogram::new(PREEMPTION_BUCKETS),
            request_prefill_computed: Histogram::new(tokens),
        }
    }

    pub fn finished_with(&self, reason: FinishReason) -> u64 {
        self.finished[reason as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_upper_inclusive_and_cumulative() {
        let mut h = Histogram::new(vec![1.0, 2.0]);
        for v in [0.5, 1.0, 1.5, 3.0] {
            h.observe(v);
        }
        let c: Vec<_> = h.cumulative().collect();
        assert_eq!(c, vec![(1.0, 2), (2.0, 3), (f64::INFINITY, 4)]);
        assert_eq!(h.count, 4);
        assert!((h.sum - 6.0).abs() < 1e-12);
    }

    #[test]
    fn one_two_five_series_stops_at_max() {
        assert_eq!(
            one_two_five(2048),
            vec![
                1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0
            ]
        );
        assert_eq!(one_two_five(20), vec![1.0, 2.0, 5.0, 10.0, 20.0]);
    }

    #[test]
    fn bucket_lists_are_sorted() {
        for b in [TTFT_BUCKETS, ITL_BUCKETS, E2E_BUCKETS] {
            assert!(b.windows(2).all(|w| w[0] < w[1]));
        }
    }
}

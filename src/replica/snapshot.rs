//! A replica's load as last scraped: one immutable [`LoadSnapshot`] replaced
//! whole (through an `ArcSwap` on the replica) after every successful scrape.
//! `signals` reads it from the scrape's text (`LoadSnapshot::from_text`).
//!
//! A missing metric stays `None` rather than becoming zero, so a balancer can
//! tell "idle" from "unknown".

#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LoadSnapshot {
    pub running: Option<u64>,
    pub waiting: Option<u64>,
    /// 0..1, averaged over engines.
    pub kv_usage: Option<f64>,
    /// KV capacity in tokens, when the replica reports it.
    pub kv_capacity_tokens: Option<u64>,
    /// The cumulative prefix-cache lookup counter (tokens), summed over
    /// engines: a drop means the replica restarted and lost its cache.
    pub prefix_cache_queries: Option<f64>,
    /// The cumulative prefix-cache hit counter (tokens), summed over engines.
    pub prefix_cache_hits: Option<f64>,
    /// A hit-rate gauge (0..1) for servers that export a ratio instead of
    /// counters (SGLang's `sglang:cache_hit_rate`), averaged over engines.
    pub prefix_cache_hit_gauge: Option<f64>,
    /// Cumulative timing histograms' sums and counts (learned rates).
    pub timing: EngineTiming,
    /// When it was taken, on the process clock (`telemetry::clock::now_millis`).
    pub taken_at_ms: u64,
}

impl LoadSnapshot {
    /// The share of prompt tokens served from the prefix cache since the
    /// replica started (hits ÷ queries), or the replica's own hit-rate gauge
    /// when it exports one. `None` when unknown or before the first lookup.
    pub fn prefix_cache_hit_rate(&self) -> Option<f64> {
        if let Some(g) = self.prefix_cache_hit_gauge {
            return Some(g);
        }
        match (self.prefix_cache_hits, self.prefix_cache_queries) {
            (Some(h), Some(q)) if q > 0.0 => Some((h / q).clamp(0.0, 1.0)),
            _ => None,
        }
    }

    /// Whether no load metric at all was found (wrong preset, wrong path).
    pub fn is_empty(&self) -> bool {
        self.running.is_none() && self.waiting.is_none() && self.kv_usage.is_none()
    }
}

/// Cumulative sums and counts of the timing histograms, summed over
/// engines; `None` where the replica does not export the series.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EngineTiming {
    pub prefill_seconds: Option<f64>,
    pub prefill_requests: Option<f64>,
    pub prefill_tokens: Option<f64>,
    pub inter_token_seconds: Option<f64>,
    pub inter_tokens: Option<f64>,
    /// Output tokens of the finished requests, and how many finished.
    pub output_tokens: Option<f64>,
    pub finished_requests: Option<f64>,
}

//! The closed loop of prefix routing: for each answered request, the prompt
//! tokens llmlb predicted at routing time that the chosen replica would find
//! cached, against the `usage.prompt_tokens_details.cached_tokens` the
//! replica reported.
//!
//! Where it comes from: the routing stage's prediction for every candidate
//! travels with the request (`Decision::predicted_for`), the forwarder
//! stamps the one for the replica it sent to on the response
//! (`Dispatched::predicted_cached`), and the access-log wrapper, which reads
//! `usage` at the end of every answer, calls [`PrefixLoopMetrics::observe`].
//!
//! Both counters are split by request `kind` (`plain`, `tools`,
//! `template_args`, `adapter`: a LoRA adapter's request, whatever else it
//! carries), so a gap between prediction and report shows which kind of
//! request it comes from.
//!
//! Counted: answers with status 200 whose `usage` carries `cached_tokens`
//! (vLLM: `--enable-prompt-tokens-details`): every non-streamed answer, and
//! streams whose client asked for `stream_options.include_usage`. Streams
//! without it carry no usage and are not counted. Pools with prefix mode
//! `off` make no prediction and are not counted. Cost: two counter
//! increments and one histogram observation per answer.
//!
//! The same loop for the time to first token: `cache` and `exact` pick a
//! replica by the time to first token the cost model expects there
//! (`Dispatched::predicted_ttft`); a stream's first content, less its wait
//! in the pool's queue, is what the replica took ([`TtftObservation`]).
//! Counted: streams answered 200 at their first attempt.

use prometheus::{CounterVec, HistogramVec, IntCounterVec, Registry};

/// Buckets of |predicted − reported| ÷ prompt tokens.
const ERROR_BUCKETS: &[f64] = &[0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0];

/// Buckets of observed ÷ predicted time to first token.
const TTFT_RATIO_BUCKETS: &[f64] = &[0.25, 0.5, 0.8, 1.25, 2.0, 4.0, 8.0, 16.0];

#[derive(Debug, Clone)]
pub struct PrefixLoopMetrics {
    /// `llmlb_prefix_cached_tokens_predicted_total{pool,replica,kind}`.
    pub predicted: IntCounterVec,
    /// `llmlb_prefix_cached_tokens_reported_total{pool,replica,kind}`.
    pub reported: IntCounterVec,
    /// `llmlb_prefix_cached_tokens_error_ratio{pool}`.
    pub error: HistogramVec,
    /// `llmlb_prefix_ttft_predicted_seconds_total{pool,replica}`.
    pub ttft_predicted: CounterVec,
    /// `llmlb_prefix_ttft_observed_seconds_total{pool,replica}`.
    pub ttft_observed: CounterVec,
    /// `llmlb_prefix_ttft_observed_over_predicted{pool}`.
    pub ttft_ratio: HistogramVec,
}

/// One stream's time to first token, predicted when it was routed and
/// observed from its dispatch, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TtftObservation {
    pub predicted: f64,
    pub observed: f64,
}

/// The TTFT observation for an answer: a stream answered 200 at its
/// first attempt, with a prediction and a first content; `queued` (its
/// wait in the pool's queue, before the dispatch) is taken off.
pub fn ttft_observation(
    status: u16,
    stream: bool,
    attempts: u32,
    predicted: Option<f64>,
    first_content: Option<f64>,
    queued: Option<f64>,
) -> Option<TtftObservation> {
    if status != 200 || !stream || attempts != 1 {
        return None;
    }
    Some(TtftObservation {
        predicted: predicted?,
        observed: (first_content? - queued.unwrap_or(0.0)).max(0.0),
    })
}

/// One answered request, as the loop sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// Cached prompt tokens predicted for the replica that answered.
    pub predicted: u64,
    /// `usage.prompt_tokens`.
    pub prompt_tokens: u64,
    /// `usage.prompt_tokens_details.cached_tokens`.
    pub reported: u64,
}

impl Observation {
    /// |predicted − reported| as a fraction of the prompt (0 for an empty one).
    pub fn error_ratio(&self) -> f64 {
        if self.prompt_tokens == 0 {
            return 0.0;
        }
        self.predicted.abs_diff(self.reported) as f64 / self.prompt_tokens as f64
    }
}

impl PrefixLoopMetrics {
    pub fn register(registry: &Registry) -> PrefixLoopMetrics {
        let family = super::Family::new(registry);
        let predicted = family.counter("llmlb_prefix_cached_tokens_predicted_total", "Prompt tokens llmlb predicted, when routing, that the replica would find in its prefix cache (answers whose usage reports cached tokens).", &["pool", "replica", "kind"]);
        let reported = family.counter("llmlb_prefix_cached_tokens_reported_total", "Prompt tokens the replica reported cached (usage.prompt_tokens_details.cached_tokens) on the same answers.", &["pool", "replica", "kind"]);
        let error = family.histogram("llmlb_prefix_cached_tokens_error_ratio", "Per request, |predicted - reported| cached tokens as a fraction of the prompt's tokens.", &["pool"], ERROR_BUCKETS);
        let ttft_predicted = family.float_counter("llmlb_prefix_ttft_predicted_seconds_total", "Time to first token the cost model expected, when routing, on the replica it picked (streams answered at their first attempt).", &["pool", "replica"]);
        let ttft_observed = family.float_counter(
            "llmlb_prefix_ttft_observed_seconds_total",
            "Time from dispatch to first content on the same streams.",
            &["pool", "replica"],
        );
        let ttft_ratio = family.histogram(
            "llmlb_prefix_ttft_observed_over_predicted",
            "Per stream, observed time to first token over the cost model's prediction.",
            &["pool"],
            TTFT_RATIO_BUCKETS,
        );
        PrefixLoopMetrics {
            predicted,
            reported,
            error,
            ttft_predicted,
            ttft_observed,
            ttft_ratio,
        }
    }

    /// Records one stream's time to first token; `None` is skipped.
    pub fn observe_ttft(&self, pool: &str, replica: &str, o: Option<TtftObservation>) {
        let Some(o) = o else {
            return;
        };
        self.ttft_predicted
            .with_label_values(&[pool, replica])
            .inc_by(o.predicted);
        self.ttft_observed
            .with_label_values(&[pool, replica])
            .inc_by(o.observed);
        if o.predicted > 0.0 {
            self.ttft_ratio
                .with_label_values(&[pool])
                .observe(o.observed / o.predicted);
        }
    }

    /// Records one answer; `None` observations (no prediction, or no
    /// reported cached count) are skipped.
    pub fn observe(&self, pool: &str, replica: &str, kind: &str, o: Option<Observation>) {
        let Some(o) = o else {
            return;
        };
        self.predicted
            .with_label_values(&[pool, replica, kind])
            .inc_by(o.predicted);
        self.reported
            .with_label_values(&[pool, replica, kind])
            .inc_by(o.reported);
        self.error
            .with_label_values(&[pool])
            .observe(o.error_ratio());
    }
}

/// The observation for an answer: needs status 200, a prediction and a
/// reported cached count.
pub fn observation(
    status: u16,
    predicted: Option<u64>,
    prompt_tokens: Option<u64>,
    reported: Option<u64>,
) -> Option<Observation> {
    if status != 200 {
        return None;
    }
    Some(Observation {
        predicted: predicted?,
        prompt_tokens: prompt_tokens.unwrap_or(0),
        reported: reported?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_only_complete_observations() {
        let registry = Registry::new();
        let m = PrefixLoopMetrics::register(&registry);
        assert_eq!(observation(200, None, Some(10), Some(4)), None);
        assert_eq!(observation(200, Some(4), Some(10), None), None);
        assert_eq!(observation(500, Some(4), Some(10), Some(4)), None);
        let o = observation(200, Some(96), Some(200), Some(80)).unwrap();
        assert!((o.error_ratio() - 0.08).abs() < 1e-9);
        m.observe("p", "r", "tools", Some(o));
        m.observe("p", "r", "tools", None);
        assert_eq!(
            m.predicted.with_label_values(&["p", "r", "tools"]).get(),
            96
        );
        assert_eq!(m.reported.with_label_values(&["p", "r", "tools"]).get(), 80);
        assert_eq!(m.error.with_label_values(&["p"]).get_sample_count(), 1);
    }

    #[test]
    fn a_streams_ttft_is_counted_from_its_dispatch() {
        let registry = Registry::new();
        let m = PrefixLoopMetrics::register(&registry);
        let ok = |status, stream, attempts| {
            ttft_observation(status, stream, attempts, Some(0.2), Some(0.9), Some(0.3))
        };
        // Not a stream (its first byte is its last), a retry, an error.
        assert_eq!(ok(200, false, 1), None);
        assert_eq!(ok(200, true, 2), None);
        assert_eq!(ok(503, true, 1), None);
        assert_eq!(ttft_observation(200, true, 1, None, Some(0.9), None), None);
        assert_eq!(ttft_observation(200, true, 1, Some(0.2), None, None), None);
        let o = ok(200, true, 1).unwrap();
        assert!((o.observed - 0.6).abs() < 1e-9, "{o:?}");
        m.observe_ttft("p", "r", Some(o));
        m.observe_ttft("p", "r", None);
        let predicted = m.ttft_predicted.with_label_values(&["p", "r"]).get();
        let observed = m.ttft_observed.with_label_values(&["p", "r"]).get();
        assert!((predicted - 0.2).abs() < 1e-9 && (observed - 0.6).abs() < 1e-9);
        let ratio = m.ttft_ratio.with_label_values(&["p"]);
        assert_eq!(ratio.get_sample_count(), 1);
        assert!((ratio.get_sample_sum() - 3.0).abs() < 1e-9);
    }
}

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

use prometheus::{HistogramVec, IntCounterVec, Registry};

/// Buckets of |predicted − reported| ÷ prompt tokens.
const ERROR_BUCKETS: &[f64] = &[0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0];

#[derive(Debug, Clone)]
pub struct PrefixLoopMetrics {
    /// `llmlb_prefix_cached_tokens_predicted_total{pool,replica,kind}`.
    pub predicted: IntCounterVec,
    /// `llmlb_prefix_cached_tokens_reported_total{pool,replica,kind}`.
    pub reported: IntCounterVec,
    /// `llmlb_prefix_cached_tokens_error_ratio{pool}`.
    pub error: HistogramVec,
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
        PrefixLoopMetrics {
            predicted,
            reported,
            error,
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
}

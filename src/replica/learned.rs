//! Per-replica service rates learned online from the replica's own timing
//! histograms, so the cache-aware cost model prices prefill and queueing at
//! what *this* replica does (an A100 next to an H100 in one pool gets two
//! different rates), not at constants from the config.
//!
//! Every stored scrape is compared with the previous one. From the deltas of
//! vLLM's cumulative histograms:
//!
//! ```text
//! prefill rate      (tokens/s)    = Δ request_prefill_kv_computed_tokens_sum
//!                                 ÷ Δ request_prefill_time_seconds_sum
//! prefill time      (s/request)   = Δ request_prefill_time_seconds_sum
//!                                 ÷ Δ request_prefill_time_seconds_count
//! decode step       (s)           = Δ inter_token_latency_seconds_sum
//!                                 ÷ Δ inter_token_latency_seconds_count
//! answer length     (tokens)      = Δ request_generation_tokens_sum
//!                                 ÷ Δ request_generation_tokens_count
//! ```
//!
//! vLLM's prefill time runs from a request's first scheduled step to its
//! first token, so it already includes the batching with other requests:
//! the rate is the replica's *effective* prefill rate under its current load.
//!
//! Each sample enters an exponentially weighted mean (weight [`ALPHA`] for
//! the new sample). Robustness: an interval with too little work (fewer than
//! [`MIN_PREFILL_TOKENS`] computed tokens, or fewer than [`MIN_INTER_TOKENS`]
//! inter-token gaps) gives no sample; a counter that went down (a restart)
//! gives none either; and once a mean exists a sample is clamped to within
//! [`MAX_STEP`]× of it, so one pathological interval (a GC pause, a burst of
//! preemptions) moves the estimate by a bounded factor. The count of
//! requests behind the prefill rates goes with them: the cache-aware cost
//! weighs a rate learned from a few requests against the rates of the
//! replica's peers (`routing::prefix::score`), and uses the config values
//! only while no candidate has learned anything.
//!
//! Shared state: four `AtomicU64`s holding `f64` bits (0 = none yet) and
//! a count of the requests the prefill rates were learned from,
//! written only by the replica's scrape loop and read lock-free by the router.
//! Cost per scrape: a handful of float operations.

use std::sync::atomic::{AtomicU64, Ordering};

use super::LoadSnapshot;

/// Weight of a new sample in the moving mean.
pub const ALPHA: f64 = 0.3;
/// A sample may move the mean by at most this factor either way.
pub const MAX_STEP: f64 = 4.0;
/// Fewer computed prefill tokens than this in an interval: no sample.
pub const MIN_PREFILL_TOKENS: f64 = 16.0;
/// Fewer inter-token gaps than this in an interval: no sample.
pub const MIN_INTER_TOKENS: f64 = 4.0;

/// A replica's learned rates, as the scorer reads them (`None` until learned).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Rates {
    /// Prompt tokens prefilled per second.
    pub prefill_tokens_per_second: Option<f64>,
    /// Seconds one request spends in prefill, on average.
    pub prefill_seconds_per_request: Option<f64>,
    /// Seconds per decode step (between two output tokens of one request).
    pub decode_step_seconds: Option<f64>,
    /// Output tokens of a finished request, on average (how long a request
    /// that does not bound its answer is expected to decode).
    pub output_tokens: Option<f64>,
    /// Requests the prefill rates were learned from, so far: how much
    /// evidence stands behind them.
    pub prefill_requests: u64,
}

impl Rates {
    /// Whether some rate is not learned yet.
    pub fn lacks_any(&self) -> bool {
        self.prefill_tokens_per_second.is_none()
            || self.prefill_seconds_per_request.is_none()
            || self.decode_step_seconds.is_none()
    }
}

/// The moving means, updated from consecutive scrapes.
#[derive(Debug, Default)]
pub struct LearnedRates {
    prefill_tokens_per_second: AtomicU64,
    prefill_seconds_per_request: AtomicU64,
    decode_step_seconds: AtomicU64,
    output_tokens: AtomicU64,
    prefill_requests: AtomicU64,
}

fn load(cell: &AtomicU64) -> Option<f64> {
    match f64::from_bits(cell.load(Ordering::Relaxed)) {
        v if v > 0.0 && v.is_finite() => Some(v),
        _ => None,
    }
}

/// Folds `sample` into the mean in `cell`.
fn fold(cell: &AtomicU64, sample: f64) {
    if !(sample > 0.0 && sample.is_finite()) {
        return;
    }
    let next = match load(cell) {
        None => sample,
        Some(mean) => {
            let s = sample.clamp(mean / MAX_STEP, mean * MAX_STEP);
            mean + ALPHA * (s - mean)
        }
    };
    cell.store(next.to_bits(), Ordering::Relaxed);
}

/// `after − before` when both exist and the counter did not go down.
fn delta(before: Option<f64>, after: Option<f64>) -> Option<f64> {
    let d = after? - before?;
    (d >= 0.0).then_some(d)
}

impl LearnedRates {
    pub fn rates(&self) -> Rates {
        Rates {
            prefill_tokens_per_second: load(&self.prefill_tokens_per_second),
            prefill_seconds_per_request: load(&self.prefill_seconds_per_request),
            decode_step_seconds: load(&self.decode_step_seconds),
            output_tokens: load(&self.output_tokens),
            prefill_requests: self.prefill_requests.load(Ordering::Relaxed),
        }
    }

    /// Learns from what changed between two consecutive scrapes.
    pub fn observe(&self, before: &LoadSnapshot, after: &LoadSnapshot) {
        let (b, a) = (&before.timing, &after.timing);
        let seconds = delta(b.prefill_seconds, a.prefill_seconds);
        let requests = delta(b.prefill_requests, a.prefill_requests);
        let tokens = delta(b.prefill_tokens, a.prefill_tokens);
        if let (Some(s), Some(n), Some(t)) = (seconds, requests, tokens)
            && n >= 1.0
            && s > 0.0
        {
            fold(&self.prefill_seconds_per_request, s / n);
            self.prefill_requests.fetch_add(n as u64, Ordering::Relaxed);
            if t >= MIN_PREFILL_TOKENS {
                fold(&self.prefill_tokens_per_second, t / s);
            }
        }
        let gaps = delta(b.inter_tokens, a.inter_tokens);
        let gap_seconds = delta(b.inter_token_seconds, a.inter_token_seconds);
        if let (Some(n), Some(s)) = (gaps, gap_seconds)
            && n >= MIN_INTER_TOKENS
        {
            fold(&self.decode_step_seconds, s / n);
        }
        let finished = delta(b.finished_requests, a.finished_requests);
        let output = delta(b.output_tokens, a.output_tokens);
        if let (Some(n), Some(t)) = (finished, output)
            && n >= 1.0
        {
            fold(&self.output_tokens, t / n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica::EngineTiming;

    /// A scrape whose cumulative histograms stand at these totals.
    fn at(prefill_s: f64, requests: f64, tokens: f64, itl_s: f64, gaps: f64) -> LoadSnapshot {
        LoadSnapshot {
            timing: EngineTiming {
                prefill_seconds: Some(prefill_s),
                prefill_requests: Some(requests),
                prefill_tokens: Some(tokens),
                inter_token_seconds: Some(itl_s),
                inter_tokens: Some(gaps),
                ..EngineTiming::default()
            },
            ..LoadSnapshot::default()
        }
    }

    #[test]
    fn first_interval_sets_the_rates() {
        let l = LearnedRates::default();
        assert_eq!(l.rates(), Rates::default());
        l.observe(
            &at(0.0, 0.0, 0.0, 0.0, 0.0),
            &at(0.5, 5.0, 1000.0, 0.2, 100.0),
        );
        let r = l.rates();
        assert_eq!(r.prefill_tokens_per_second, Some(2000.0));
        assert_eq!(r.prefill_seconds_per_request, Some(0.1));
        assert_eq!(r.decode_step_seconds, Some(0.002));
        assert_eq!(r.prefill_requests, 5);
        assert_eq!(
            r.output_tokens, None,
            "no answer length without its histogram"
        );
    }

    #[test]
    fn answer_length_is_the_moving_mean_of_finished_requests() {
        let l = LearnedRates::default();
        let answers = |tokens: f64, finished: f64| LoadSnapshot {
            timing: EngineTiming {
                output_tokens: Some(tokens),
                finished_requests: Some(finished),
                ..EngineTiming::default()
            },
            ..LoadSnapshot::default()
        };
        l.observe(&answers(0.0, 0.0), &answers(400.0, 4.0));
        assert_eq!(l.rates().output_tokens, Some(100.0));
        // Nothing finished: no sample.
        l.observe(&answers(400.0, 4.0), &answers(450.0, 4.0));
        assert_eq!(l.rates().output_tokens, Some(100.0));
        // Two answers of 200 tokens: the mean moves by ALPHA toward 200.
        l.observe(&answers(400.0, 4.0), &answers(800.0, 6.0));
        let mean = l.rates().output_tokens.unwrap();
        assert!((mean - (100.0 + ALPHA * 100.0)).abs() < 1e-9, "{mean}");
        // A restart (counters went down) gives none.
        l.observe(&answers(800.0, 6.0), &answers(10.0, 1.0));
        assert_eq!(l.rates().output_tokens, Some(mean));
    }

    #[test]
    fn converges_on_a_replica_that_became_three_times_slower() {
        let l = LearnedRates::default();
        let mut prev = at(0.0, 0.0, 0.0, 0.0, 0.0);
        let mut step = |l: &LearnedRates, secs_per_token: f64| {
            let t = &prev.timing;
            let next = at(
                t.prefill_seconds.unwrap() + 1000.0 * secs_per_token,
                t.prefill_requests.unwrap() + 4.0,
                t.prefill_tokens.unwrap() + 1000.0,
                t.inter_token_seconds.unwrap() + 50.0 * secs_per_token,
                t.inter_tokens.unwrap() + 50.0,
            );
            l.observe(&prev, &next);
            prev = next;
        };
        for _ in 0..5 {
            step(&l, 0.001);
        }
        assert!((l.rates().prefill_tokens_per_second.unwrap() - 1000.0).abs() < 1e-6);
        for _ in 0..20 {
            step(&l, 0.003);
        }
        let learned = l.rates().prefill_tokens_per_second.unwrap();
        assert!(
            (learned - 1000.0 / 3.0).abs() < 5.0,
            "learned {learned} tokens/s"
        );
        let step_s = l.rates().decode_step_seconds.unwrap();
        assert!((step_s - 0.003).abs() < 5e-5, "decode step {step_s}");
    }

    #[test]
    fn one_wild_interval_moves_the_mean_a_bounded_amount() {
        let l = LearnedRates::default();
        l.observe(
            &at(0.0, 0.0, 0.0, 0.0, 0.0),
            &at(1.0, 4.0, 1000.0, 0.0, 0.0),
        );
        // 1,000 tokens in 1,000 s: a stall, not the replica's rate.
        l.observe(
            &at(1.0, 4.0, 1000.0, 0.0, 0.0),
            &at(1001.0, 8.0, 2000.0, 0.0, 0.0),
        );
        let r = l.rates().prefill_tokens_per_second.unwrap();
        let floor = 1000.0 + ALPHA * (1000.0 / MAX_STEP - 1000.0);
        assert!((r - floor).abs() < 1e-6, "{r}");
    }

    #[test]
    fn idle_intervals_and_restarts_give_no_sample() {
        let l = LearnedRates::default();
        // Nothing happened.
        l.observe(
            &at(1.0, 4.0, 100.0, 1.0, 10.0),
            &at(1.0, 4.0, 100.0, 1.0, 10.0),
        );
        // Too few tokens and gaps.
        l.observe(
            &at(1.0, 4.0, 100.0, 1.0, 10.0),
            &at(1.1, 4.0, 108.0, 1.01, 12.0),
        );
        assert_eq!(l.rates().prefill_tokens_per_second, None);
        assert_eq!(l.rates().decode_step_seconds, None);
        // Counters went down: a restart, not a negative rate.
        l.observe(
            &at(5.0, 9.0, 900.0, 3.0, 90.0),
            &at(0.2, 1.0, 50.0, 0.1, 5.0),
        );
        assert_eq!(l.rates(), Rates::default());
        // Missing series (another server kind): nothing learned.
        l.observe(&LoadSnapshot::default(), &LoadSnapshot::default());
        assert_eq!(l.rates(), Rates::default());
    }
}

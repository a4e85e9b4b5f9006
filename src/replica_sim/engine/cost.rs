//! The step-time model: how long one engine step takes, from the shape of the
//! batch it runs.
//!
//! ```text
//! t = step_overhead
//!   + prefill_overhead                 (only when the step prefills anything)
//!   + prefill_per_token  × prompt tokens computed in the step (uncached only)
//!   + prefill_attention  × attention pairs of those tokens (each prefilled
//!                          token against every earlier token of its sequence)
//!   + decode_per_seq     × sequences decoding one token
//!   + per_context_token  × tokens attended by the step (context of every
//!                          scheduled sequence, cached prefix included)
//! ```
//!
//! The first five terms are the linear model used by vLLM-style simulators
//! (llm-d-inference-sim, Vidur's simplest predictor): a fixed cost per forward
//! pass (reading the weights, scheduling, sampling), a compute-bound cost per
//! prefilled token, a small cost per sequence, and a memory-bound cost per KV
//! entry read by attention. A cached prefix is never prefilled, so it only
//! costs its attention reads.
//!
//! `prefill_attention` makes prefill convex in the prompt length, as
//! attention is: a chunk of `n` tokens starting after `s` computed tokens has
//! `n·s + n·(n+1)/2` query-key pairs, so a long prompt costs more per token
//! than a short one.
//!
//! The API server's work is not a step term: it runs beside the engine, one
//! piece at a time ([`super::front_end`]): parsing and tokenizing each
//! request (`api_per_request`) before the scheduler sees it, detokenizing
//! and framing each streamed token (`api_per_output_token`) after the step
//! that sampled it. Both default to 0.
//!
//! Profiles name the constants and where they come from (see
//! `docs/SIMULATOR.md`). Cost: a handful of multiplications per step. Missing
//! data: a field absent from a config file is 0 for the three newer terms.

use serde::{Deserialize, Serialize};

/// Constants of the step-time model, in seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostModel {
    /// Fixed cost of every step.
    pub step_overhead: f64,
    /// Extra fixed cost of a step that prefills at least one token.
    pub prefill_overhead: f64,
    /// Cost per prompt token computed (not found in the prefix cache).
    pub prefill_per_token: f64,
    /// Cost per sequence that decodes one token in the step.
    pub decode_per_seq: f64,
    /// Cost per token of context attended by the step.
    pub per_context_token: f64,
    /// Cost per query-key pair of prefilled tokens (the quadratic part of
    /// attention during prefill); 0 keeps prefill linear.
    #[serde(default)]
    pub prefill_attention: f64,
    /// API-server work per request, done before the scheduler sees the
    /// request, one request at a time, beside the engine's steps
    /// ([`super::front_end`]).
    #[serde(default)]
    pub api_per_request: f64,
    /// API-server work per streamed token, handed to the API server when the
    /// step that sampled it ends ([`super::front_end`]).
    #[serde(default)]
    pub api_per_output_token: f64,
}

/// What one step computes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepShape {
    /// Prompt tokens computed (prefill chunks, recomputation after preemption).
    pub prefill_tokens: usize,
    /// Sequences that decode one token.
    pub decode_seqs: usize,
    /// Sum over scheduled sequences of their context length after the step.
    pub context_tokens: usize,
    /// Query-key pairs of the prompt tokens computed ([`attention_pairs`]).
    pub prefill_pairs: u64,
    /// Tokens sampled (one per sequence whose computed tokens caught up).
    pub output_tokens: usize,
}

/// Query-key pairs of a prefill chunk of `n` tokens after `start` computed
/// ones: token `start + i` attends to `start + i + 1` tokens.
pub fn attention_pairs(start: usize, n: usize) -> u64 {
    let (s, n) = (start as u64, n as u64);
    n * s + n * (n + 1) / 2
}

impl CostModel {
    /// Duration of a step of this shape, in seconds; zero for an empty step.
    pub fn step_time(&self, s: &StepShape) -> f64 {
        if s.prefill_tokens == 0 && s.decode_seqs == 0 {
            return 0.0;
        }
        let prefill = if s.prefill_tokens > 0 {
            self.prefill_overhead + self.prefill_per_token * s.prefill_tokens as f64
        } else {
            0.0
        };
        self.step_overhead
            + prefill
            + self.prefill_attention * s.prefill_pairs as f64
            + self.decode_per_seq * s.decode_seqs as f64
            + self.per_context_token * s.context_tokens as f64
    }

    /// Checks every constant is finite and not negative.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("step_overhead", self.step_overhead),
            ("prefill_overhead", self.prefill_overhead),
            ("prefill_per_token", self.prefill_per_token),
            ("decode_per_seq", self.decode_per_seq),
            ("per_context_token", self.per_context_token),
            ("prefill_attention", self.prefill_attention),
            ("api_per_request", self.api_per_request),
            ("api_per_output_token", self.api_per_output_token),
        ] {
            if !v.is_finite() || v < 0.0 {
                return Err(format!("cost.{name} must be a finite number >= 0, got {v}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> CostModel {
        CostModel {
            step_overhead: 0.010,
            prefill_overhead: 0.020,
            prefill_per_token: 0.0001,
            decode_per_seq: 0.001,
            per_context_token: 0.000001,
            prefill_attention: 0.0,
            api_per_request: 0.0,
            api_per_output_token: 0.0,
        }
    }

    #[test]
    fn empty_step_is_free() {
        assert_eq!(model().step_time(&StepShape::default()), 0.0);
    }

    #[test]
    fn decode_only_step_skips_prefill_overhead() {
        let t = model().step_time(&StepShape {
            decode_seqs: 4,
            context_tokens: 1000,
            ..StepShape::default()
        });
        assert!((t - (0.010 + 0.004 + 0.001)).abs() < 1e-12, "{t}");
    }

    #[test]
    fn prefill_grows_with_uncached_tokens() {
        let m = model();
        let shape = |n| StepShape {
            prefill_tokens: n,
            context_tokens: 1000,
            ..StepShape::default()
        };
        let (a, b) = (m.step_time(&shape(100)), m.step_time(&shape(900)));
        assert!((b - a - 800.0 * 0.0001).abs() < 1e-12);
    }

    #[test]
    fn attention_pairs_count_every_earlier_token() {
        assert_eq!(attention_pairs(0, 1), 1);
        assert_eq!(attention_pairs(0, 4), 1 + 2 + 3 + 4);
        // A chunk after 10 computed tokens: 11 + 12 + 13.
        assert_eq!(attention_pairs(10, 3), 36);
        // Chunking does not change the total.
        assert_eq!(
            attention_pairs(0, 100) + attention_pairs(100, 50),
            attention_pairs(0, 150)
        );
    }

    #[test]
    fn prefill_attention_makes_prefill_convex() {
        let m = CostModel {
            prefill_attention: 1e-8,
            ..model()
        };
        let t = |n| {
            m.step_time(&StepShape {
                prefill_tokens: n,
                prefill_pairs: attention_pairs(0, n),
                ..StepShape::default()
            })
        };
        // Per-token cost grows with the prompt: the second 1,000 tokens cost
        // more than the first.
        let (t0, t1, t2) = (t(1), t(1001), t(2001));
        assert!(t2 - t1 > t1 - t0, "{t0} {t1} {t2}");
        let extra = 1e-8 * (attention_pairs(0, 2001) - attention_pairs(0, 1001)) as f64;
        assert!((t2 - t1 - 1000.0 * 0.0001 - extra).abs() < 1e-12);
    }

    #[test]
    fn the_api_servers_work_is_not_a_step_term() {
        let m = CostModel {
            api_per_request: 0.002,
            api_per_output_token: 0.0001,
            ..model()
        };
        let shape = StepShape {
            decode_seqs: 8,
            context_tokens: 1000,
            output_tokens: 8,
            ..StepShape::default()
        };
        assert_eq!(m.step_time(&shape), model().step_time(&shape));
    }

    #[test]
    fn validate_rejects_negative_and_nan() {
        let mut m = model();
        assert!(m.validate().is_ok());
        m.decode_per_seq = -1.0;
        assert!(m.validate().unwrap_err().contains("decode_per_seq"));
        m.decode_per_seq = f64::NAN;
        assert!(m.validate().is_err());
    }
}

//! The step-time model: how long one engine step takes, from the shape of the
//! batch it runs.
//!
//! ```text
//! t = step_overhead
//!   + prefill_overhead                 (only when the step prefills anything)
//!   + prefill_per_token  × prompt tokens computed in the step (uncached only)
//!   + decode_per_seq     × sequences decoding one token
//!   + per_context_token  × tokens attended by the step (context of every
//!                          scheduled sequence, cached prefix included)
//! ```
//!
//! This is the linear model used by vLLM-style simulators (llm-d-inference-sim,
//! Vidur's simplest predictor): a fixed cost per forward pass (reading the
//! weights, scheduling, sampling), a compute-bound cost per prefilled token, a
//! small cost per sequence, and a memory-bound cost per KV entry read by
//! attention. A cached prefix is never prefilled, so it only costs its
//! attention reads. Profiles name the constants and where they come from
//! (see `docs/SIMULATOR.md`). Cost: a handful of multiplications per step.

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
        }
    }

    #[test]
    fn empty_step_is_free() {
        assert_eq!(model().step_time(&StepShape::default()), 0.0);
    }

    #[test]
    fn decode_only_step_skips_prefill_overhead() {
        let t = model().step_time(&StepShape {
            prefill_tokens: 0,
            decode_seqs: 4,
            context_tokens: 1000,
        });
        assert!((t - (0.010 + 0.004 + 0.001)).abs() < 1e-12, "{t}");
    }

    #[test]
    fn prefill_grows_with_uncached_tokens() {
        let m = model();
        let shape = |n| StepShape {
            prefill_tokens: n,
            decode_seqs: 0,
            context_tokens: 1000,
        };
        let (a, b) = (m.step_time(&shape(100)), m.step_time(&shape(900)));
        assert!((b - a - 800.0 * 0.0001).abs() < 1e-12);
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

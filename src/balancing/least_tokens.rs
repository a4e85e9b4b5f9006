//! Least outstanding tokens: the candidate with the least work this proxy has
//! already given it, counted in tokens rather than requests, relative to its
//! weight.
//!
//! Each in-flight request weighs its estimated prompt tokens until the
//! replica starts answering (prefill done) plus its remaining output tokens:
//! `max_tokens` (or the pool's `default_max_tokens`) minus the SSE events
//! already streamed. A 4,000-token summarisation thus counts for far more than
//! a 10-token classification, which least-connections treats alike. It is
//! least-request balancing with requests weighed by their work, close to how
//! Dynamo's KV router costs a worker by the blocks its active requests hold,
//! computed from counts the proxy keeps itself.
//!
//! Cost per pick: O(n), one atomic increment for the tie-break rotation.
//! Uses only the proxy's own counts, which are never stale; a replica that
//! other clients also load is not seen (pair with `jsq` or `kv_aware` when
//! the fleet is shared).

use super::load::{Load, Scan};
use super::{Branch, RequestInfo};
use crate::replica::ReplicaView;

/// Least-tokens: every candidate compared by [`OutstandingTokens`].
pub type LeastTokens = Scan<OutstandingTokens>;

/// Least-tokens' measure: `(outstanding tokens per unit of weight, in
/// flight)`, from this proxy's own counts (never stale).
#[derive(Debug, Clone, Copy, Default)]
pub struct OutstandingTokens;

impl Load for OutstandingTokens {
    type Metric = (f64, u64);
    type Local = (f64, u64);

    fn load(&self, v: &ReplicaView, _req: &RequestInfo<'_>) -> Option<(f64, u64)> {
        Some(self.local(v))
    }

    fn local(&self, v: &ReplicaView) -> (f64, u64) {
        (
            v.outstanding_tokens as f64 / f64::from(v.weight.max(1)),
            v.in_flight,
        )
    }

    fn branch(&self, _winner: &(f64, u64)) -> Branch {
        Branch::LeastTokens
    }

    fn name(&self) -> &'static str {
        "least_tokens"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancing::{Balancer, Pick};

    fn view(id: u64, tokens: u64, in_flight: u64, weight: u32) -> ReplicaView {
        ReplicaView {
            id,
            weight,
            in_flight,
            outstanding_tokens: tokens,
            prefilling: 0,
            uncached_prefill: 0,
            decoding_output: 0,
            load: None,
            rates: Default::default(),
        }
    }

    #[test]
    fn one_long_request_outweighs_many_short_ones() {
        let b = LeastTokens::default();
        // Replica 0: one 4,000-token request. Replica 1: five 20-token ones.
        let v = [view(1, 4_000, 1, 1), view(2, 100, 5, 1)];
        for _ in 0..5 {
            let p = b.pick(&RequestInfo::default(), &v).unwrap();
            assert_eq!(
                p,
                Pick {
                    index: 1,
                    branch: Branch::LeastTokens
                }
            );
        }
    }

    #[test]
    fn weight_scales_tokens() {
        let b = LeastTokens::default();
        let v = [view(1, 300, 1, 1), view(2, 500, 1, 2)];
        assert_eq!(b.pick(&RequestInfo::default(), &v).unwrap().index, 1);
    }

    #[test]
    fn idle_pool_rotates() {
        let b = LeastTokens::default();
        let v = [view(1, 0, 0, 1), view(2, 0, 0, 1), view(3, 0, 0, 1)];
        let mut seen = [0; 3];
        for _ in 0..30 {
            seen[b.pick(&RequestInfo::default(), &v).unwrap().index] += 1;
        }
        assert_eq!(seen, [10, 10, 10]);
    }

    #[test]
    fn empty_gives_none() {
        assert!(
            LeastTokens::default()
                .pick(&RequestInfo::default(), &[])
                .is_none()
        );
    }
}

//! Power of two choices: sample two distinct candidates at random and keep
//! the less loaded one, by any [`Load`] measure (`p2c_metric` names the
//! balancer whose measure it uses: least_connections, least_tokens, jsq,
//! kv_aware). The selection knows nothing of the measure but its keys.
//!
//! Mitzenmacher (2001) showed that two random choices bring the maximum load
//! from Θ(log n / log log n) down to Θ(log log n); in practice p2c also
//! avoids the herding of a full scan when many proxies read the same stale
//! numbers, and its cost does not grow with the pool. Tower's `p2c` balancer
//! and Envoy's least-request use the same scheme.
//!
//! Sampling uses a lock-free SplitMix64 sequence seeded from the pool's
//! `seed`, so a run is reproducible. Cost per pick: O(1) beyond building the
//! view slice. When either sampled candidate lacks the data a scraped
//! measure needs, both are compared by the measure's local key instead
//! (branch `fallback_stale_metrics`). Ties keep the first sampled.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Balancer, Branch, Load, Pick, RequestInfo};
use crate::replica::ReplicaView;

#[derive(Debug)]
pub struct PowerOfTwo<L> {
    load: L,
    state: AtomicU64,
}

const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

impl<L: Load> PowerOfTwo<L> {
    /// Two random choices compared by `load`; `seed` starts the sequence.
    pub fn new(load: L, seed: u64) -> PowerOfTwo<L> {
        PowerOfTwo {
            load,
            state: AtomicU64::new(seed),
        }
    }

    fn next_u64(&self) -> u64 {
        let mut z = self
            .state
            .fetch_add(GOLDEN_GAMMA, Ordering::Relaxed)
            .wrapping_add(GOLDEN_GAMMA);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Two distinct indices in `0..n` (n ≥ 2).
    fn sample(&self, n: usize) -> (usize, usize) {
        let r = self.next_u64();
        let a = (r % n as u64) as usize;
        let b = (a + 1 + ((r >> 32) % (n as u64 - 1)) as usize) % n;
        (a, b)
    }

    /// Whether `b` is strictly less loaded than `a`, and the branch that decided.
    fn prefer_b(&self, req: &RequestInfo<'_>, a: &ReplicaView, b: &ReplicaView) -> (bool, Branch) {
        match (self.load.load(a, req), self.load.load(b, req)) {
            (Some(ka), Some(kb)) => (kb < ka, Branch::P2c),
            _ => (
                self.load.local(b) < self.load.local(a),
                Branch::FallbackStaleMetrics,
            ),
        }
    }
}

impl<L: Load> Balancer for PowerOfTwo<L> {
    fn name(&self) -> &'static str {
        "p2c"
    }

    fn pick(&self, req: &RequestInfo<'_>, replicas: &[ReplicaView]) -> Option<Pick> {
        match replicas.len() {
            0 => None,
            1 => Some(Pick {
                index: 0,
                branch: Branch::P2c,
            }),
            n => {
                let (a, b) = self.sample(n);
                let (take_b, branch) = self.prefer_b(req, &replicas[a], &replicas[b]);
                Some(Pick {
                    index: if take_b { b } else { a },
                    branch,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancing::{BalancerParams, InFlight, OutstandingTokens, QueueLength};
    use crate::replica::ScrapedLoad;

    fn p2c<L: Load>(load: L, seed: u64) -> PowerOfTwo<L> {
        PowerOfTwo::new(load, seed)
    }

    fn queue() -> QueueLength {
        QueueLength::new(BalancerParams {
            max_age_ms: 1_000,
            ..BalancerParams::default()
        })
    }

    fn views(tokens: &[u64]) -> Vec<ReplicaView> {
        tokens
            .iter()
            .enumerate()
            .map(|(i, &t)| ReplicaView {
                id: i as u64 + 1,
                weight: 1,
                in_flight: t / 100,
                outstanding_tokens: t,
                prefilling: 0,
                uncached_prefill: 0,
                decoding_output: 0,
                load: None,
                rates: Default::default(),
            })
            .collect()
    }

    #[test]
    fn samples_are_distinct_and_in_range() {
        let b = p2c(OutstandingTokens, 42);
        for n in 2..40 {
            for _ in 0..50 {
                let (x, y) = b.sample(n);
                assert!(x < n && y < n && x != y, "n={n} x={x} y={y}");
            }
        }
    }

    #[test]
    fn never_picks_the_most_loaded_of_many() {
        let b = p2c(OutstandingTokens, 7);
        let v = views(&[100, 200, 300, 400, 10_000]);
        for _ in 0..200 {
            let p = b.pick(&RequestInfo::default(), &v).unwrap();
            assert_ne!(p.index, 4);
            assert_eq!(p.branch, Branch::P2c);
        }
    }

    #[test]
    fn same_seed_same_sequence() {
        let v = views(&[0; 16]);
        let run = |seed| {
            let b = p2c(InFlight, seed);
            (0..32)
                .map(|_| b.pick(&RequestInfo::default(), &v).unwrap().index)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(3), run(3));
        assert_ne!(run(3), run(4));
    }

    #[test]
    fn spreads_over_an_idle_pool() {
        let b = p2c(OutstandingTokens, 1);
        let v = views(&[0; 8]);
        let mut seen = [0u32; 8];
        for _ in 0..800 {
            seen[b.pick(&RequestInfo::default(), &v).unwrap().index] += 1;
        }
        assert!(seen.iter().all(|&c| c > 50), "{seen:?}");
    }

    #[test]
    fn scraped_metric_without_data_falls_back() {
        let b = p2c(queue(), 9);
        let mut v = views(&[0, 0]);
        v[0].load = Some(ScrapedLoad {
            waiting: Some(0),
            ..ScrapedLoad::default()
        });
        let p = b.pick(&RequestInfo::default(), &v).unwrap();
        assert_eq!(p.branch, Branch::FallbackStaleMetrics);
        v[1].load = v[0].load;
        let p = b.pick(&RequestInfo::default(), &v).unwrap();
        assert_eq!(p.branch, Branch::P2c);
    }
}

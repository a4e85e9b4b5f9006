//! Smooth weighted round-robin (the scheme NGINX uses for `upstream` weights).
//!
//! Each candidate carries a running score; every pick adds each candidate's
//! weight to its score, takes the highest, and subtracts the total weight from
//! the winner. Over any window of `sum(weights)` picks each replica is chosen
//! exactly `weight` times, and picks of a heavy replica are spread out rather
//! than bunched. Candidates that leave the slice (ejected, drained) keep their
//! score untouched and rejoin where they were.
//!
//! Cost per pick: O(n) over the candidates plus one uncontended mutex.
//! Uses no load data, so nothing can be missing or stale.

use std::collections::HashMap;
use std::sync::Mutex;

use super::{Balancer, Branch, Pick, RequestInfo};
use crate::replica::{ReplicaId, ReplicaView};

#[derive(Debug, Default)]
pub struct WeightedRoundRobin {
    scores: Mutex<HashMap<ReplicaId, i64>>,
}

impl Balancer for WeightedRoundRobin {
    fn name(&self) -> &'static str {
        "round_robin"
    }

    fn pick(&self, _req: &RequestInfo<'_>, replicas: &[ReplicaView]) -> Option<Pick> {
        if replicas.is_empty() {
            return None;
        }
        let mut scores = self.scores.lock().unwrap_or_else(|p| p.into_inner());
        if scores.len() > 4 * replicas.len() + 64 {
            // Forget replicas that left the pool long ago.
            let live: std::collections::HashSet<ReplicaId> =
                replicas.iter().map(|r| r.id).collect();
            scores.retain(|id, _| live.contains(id));
        }
        let mut total: i64 = 0;
        let mut best: Option<(usize, i64)> = None;
        for (i, r) in replicas.iter().enumerate() {
            let w = i64::from(r.weight.max(1));
            total += w;
            let score = scores.entry(r.id).or_insert(0);
            *score += w;
            if best.is_none_or(|(_, s)| *score > s) {
                best = Some((i, *score));
            }
        }
        let (index, _) = best?;
        if let Some(score) = scores.get_mut(&replicas[index].id) {
            *score -= total;
        }
        Some(Pick {
            index,
            branch: Branch::RoundRobin,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn views(weights: &[u32]) -> Vec<ReplicaView> {
        weights
            .iter()
            .enumerate()
            .map(|(i, &w)| ReplicaView {
                id: i as u64 + 1,
                weight: w,
                in_flight: 0,
                ..ReplicaView::default()
            })
            .collect()
    }

    #[test]
    fn honours_weights_exactly_per_cycle() {
        let rr = WeightedRoundRobin::default();
        let v = views(&[5, 1, 1]);
        let mut counts = [0; 3];
        for _ in 0..70 {
            counts[rr.pick(&RequestInfo::default(), &v).unwrap().index] += 1;
        }
        assert_eq!(counts, [50, 10, 10]);
    }

    #[test]
    fn spreads_heavy_replica_picks() {
        let rr = WeightedRoundRobin::default();
        let v = views(&[5, 1, 1]);
        let seq: Vec<usize> = (0..7)
            .map(|_| rr.pick(&RequestInfo::default(), &v).unwrap().index)
            .collect();
        // NGINX's documented sequence for weights 5,1,1: a a b a c a a.
        assert_eq!(seq, vec![0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn equal_weights_rotate() {
        let rr = WeightedRoundRobin::default();
        let v = views(&[1, 1, 1]);
        let seq: Vec<usize> = (0..6)
            .map(|_| rr.pick(&RequestInfo::default(), &v).unwrap().index)
            .collect();
        assert_eq!(seq, vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn empty_slice_gives_none() {
        assert!(
            WeightedRoundRobin::default()
                .pick(&RequestInfo::default(), &[])
                .is_none()
        );
    }
}

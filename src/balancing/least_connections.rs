//! Least-connections: the candidate with the fewest requests in flight from this
//! proxy, relative to its weight (`in_flight / weight`, as NGINX's `least_conn`).
//!
//! Ties are broken by starting the scan at a rotating offset, so an idle pool is
//! filled evenly instead of always favouring the first replica.
//!
//! Cost per pick: O(n) and one atomic increment. Uses only the proxy's own
//! counts, which are never stale.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Balancer, Branch, Pick, ReplicaView, RequestInfo};

#[derive(Debug, Default)]
pub struct LeastConnections {
    cursor: AtomicUsize,
}

impl Balancer for LeastConnections {
    fn name(&self) -> &'static str {
        "least_connections"
    }

    fn pick(&self, _req: &RequestInfo<'_>, replicas: &[ReplicaView]) -> Option<Pick> {
        let n = replicas.len();
        if n == 0 {
            return None;
        }
        let start = self.cursor.fetch_add(1, Ordering::Relaxed) % n;
        let mut best = start;
        for step in 1..n {
            let i = (start + step) % n;
            if less_loaded(&replicas[i], &replicas[best]) {
                best = i;
            }
        }
        Some(Pick {
            index: best,
            branch: Branch::LeastConnections,
        })
    }
}

/// `a.in_flight / a.weight < b.in_flight / b.weight`, compared without division.
fn less_loaded(a: &ReplicaView, b: &ReplicaView) -> bool {
    u128::from(a.in_flight) * u128::from(b.weight.max(1))
        < u128::from(b.in_flight) * u128::from(a.weight.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(id: u64, in_flight: u64, weight: u32) -> ReplicaView {
        ReplicaView {
            id,
            weight,
            in_flight,
            ..ReplicaView::default()
        }
    }

    #[test]
    fn picks_fewest_in_flight() {
        let lc = LeastConnections::default();
        let v = [view(1, 5, 1), view(2, 2, 1), view(3, 7, 1)];
        for _ in 0..10 {
            assert_eq!(lc.pick(&RequestInfo::default(), &v).unwrap().index, 1);
        }
    }

    #[test]
    fn weight_scales_load() {
        let lc = LeastConnections::default();
        // 6/3 = 2 beats 3/1 = 3.
        let v = [view(1, 3, 1), view(2, 6, 3)];
        assert_eq!(lc.pick(&RequestInfo::default(), &v).unwrap().index, 1);
    }

    #[test]
    fn ties_do_not_always_favour_first() {
        let lc = LeastConnections::default();
        let v = [view(1, 0, 1), view(2, 0, 1), view(3, 0, 1), view(4, 0, 1)];
        let mut seen = [0; 4];
        for _ in 0..40 {
            seen[lc.pick(&RequestInfo::default(), &v).unwrap().index] += 1;
        }
        assert_eq!(seen, [10, 10, 10, 10]);
    }
}

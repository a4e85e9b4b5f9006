//! Least-connections: the candidate with the fewest requests in flight from this
//! proxy, relative to its weight (`in_flight / weight`, as NGINX's `least_conn`).
//!
//! Ties are broken by starting the scan at a rotating offset, so an idle pool is
//! filled evenly instead of always favouring the first replica.
//!
//! Cost per pick: O(n) and one atomic increment. Uses only the proxy's own
//! counts, which are never stale.

use std::cmp::Ordering;

use super::load::{Load, Scan};
use super::{Branch, RequestInfo};
use crate::replica::ReplicaView;

/// Least-connections: every candidate compared by [`InFlight`].
pub type LeastConnections = Scan<InFlight>;

/// Least-connections' measure: in flight per unit of weight, from this
/// proxy's own counts (never stale).
#[derive(Debug, Clone, Copy, Default)]
pub struct InFlight;

/// `count / weight`, compared exactly (cross-multiplied, no division).
#[derive(Debug, Clone, Copy)]
pub struct PerWeight {
    count: u64,
    weight: u32,
}

impl PerWeight {
    fn cross(&self, other: &PerWeight) -> (u128, u128) {
        (
            u128::from(self.count) * u128::from(other.weight.max(1)),
            u128::from(other.count) * u128::from(self.weight.max(1)),
        )
    }
}

impl PartialEq for PerWeight {
    fn eq(&self, other: &PerWeight) -> bool {
        let (a, b) = self.cross(other);
        a == b
    }
}

impl PartialOrd for PerWeight {
    fn partial_cmp(&self, other: &PerWeight) -> Option<Ordering> {
        let (a, b) = self.cross(other);
        Some(a.cmp(&b))
    }
}

impl Load for InFlight {
    type Metric = PerWeight;
    type Local = PerWeight;

    fn load(&self, v: &ReplicaView, _req: &RequestInfo<'_>) -> Option<PerWeight> {
        Some(self.local(v))
    }

    fn local(&self, v: &ReplicaView) -> PerWeight {
        PerWeight {
            count: v.in_flight,
            weight: v.weight,
        }
    }

    fn branch(&self, _winner: &PerWeight) -> Branch {
        Branch::LeastConnections
    }

    fn name(&self) -> &'static str {
        "least_connections"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancing::Balancer;

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

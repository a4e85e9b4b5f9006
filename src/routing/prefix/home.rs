//! A home for every prompt prefix: the replica that keeps it, so that a
//! prefix's requests are prefilled in one place unless a less busy replica
//! is worth the miss, and the pool's prefixes are spread over its replicas
//! in proportion to their demand.
//!
//! A prefix gets its home at its first arrival (and again if that replica
//! leaves the candidates): the first replica of the prefix's rendezvous
//! order whose homed demand is below its share by weight, with a quarter to
//! spare (consistent hashing with bounded loads, Mirrokni, Thorup and
//! Zadimoghaddam):
//!
//! ```text
//! homed(r)  = decayed arrivals of the prefixes whose home is r
//!             (requests; the decay of the prefix demand in [`super::hot`])
//! accepted  when homed(r) + 1 ≤ max(1, (1 + HEADROOM) × (Σ homed + 1) × weight(r) ÷ Σ weight)
//!             (the arrival counted on both sides; an empty replica always
//!             accepts, so a fresh pool's first prefix goes to its first choice)
//! otherwise the replica with the least homed demand per unit of weight
//! ```
//!
//! Rendezvous order alone spreads prefixes evenly only on average: six
//! prefixes over two replicas split 5/1 or worse about one time in five,
//! and the replica with five then cycles them through a cache that holds
//! two or three. The bound keeps the split within a quarter of even by
//! demand.
//!
//! A prefix keeps its home while it is tracked, with one exception: the
//! first arrivals say little about demand (six prefixes placed on counts
//! of one or two can end four against two), so once the pool has seen some
//! traffic, an arrival whose home is above its bound moves the prefix to a
//! replica that takes it within its own bound and ends less loaded than the
//! home was ([`Homes::place`]). The prefix's demand moves with it, every
//! move lowers the larger of the two loads, and a prefix too hot for any
//! one replica's bound stays put: demand that holds still settles.
//!
//! `cache` and `exact` scoring count a prefix's home as holding the part its
//! arrivals share ([`super::hot::Hot::shared_blocks`]) even when it does not
//! hold it now: a request with nothing warm anywhere then goes home instead
//! of to whichever cold replica happens to be idlest, and warms the replica
//! the prefix's next requests will look for. It is a preference in the cost,
//! not a rule: a busy home still loses to an idle replica.
//!
//! Homes are this llmlb's own: two instances agree on a home when they saw
//! the same prefixes in the same order (the rendezvous order is shared, the
//! loads are not).
//!
//! Cost: one rendezvous score per candidate when a home is chosen, a hash
//! lookup otherwise; memory: one decayed count per replica.

use std::collections::HashMap;

use super::hot::Decayed;
use super::rendezvous::{self, Node};

/// How far above its share by weight a replica's homed demand may be when
/// it takes another prefix.
pub const HEADROOM: f64 = 0.25;

/// Decayed arrivals per replica the pool must have seen before a prefix
/// is moved off a home above its bound.
pub const SETTLED_PER_REPLICA: f64 = 8.0;

/// The homed demand of every replica of a pool, by the hash of its name.
#[derive(Debug, Default)]
pub struct Homes {
    homed: HashMap<u64, Decayed>,
}

impl Homes {
    /// The home among `nodes` of prefix `key`, whose home so far is the
    /// replica named by `current` (a name hash) and whose decayed arrivals
    /// before this one are `demand`, for an arrival at `now_ms`; the arrival
    /// is counted on the home. `None` only when `nodes` is empty.
    pub fn place(
        &mut self,
        current: Option<u64>,
        key: u64,
        demand: f64,
        nodes: &[Node],
        now_ms: u64,
        tau_ms: f64,
    ) -> Option<usize> {
        let kept = current.and_then(|h| nodes.iter().position(|n| n.name_hash == h));
        let home = match kept {
            Some(k) => self.rehome(k, key, demand, nodes, now_ms, tau_ms),
            None => self.choose(key, nodes, now_ms, tau_ms)?,
        };
        self.homed
            .entry(nodes[home].name_hash)
            .or_default()
            .add(now_ms, tau_ms);
        if self.homed.len() > 2 * nodes.len() + 64 {
            self.homed
                .retain(|h, _| nodes.iter().any(|n| n.name_hash == *h));
        }
        Some(home)
    }

    /// Where a prefix homed on `k`, with decayed `demand`, stays: on `k`,
    /// unless `k`'s homed demand is above its bound and another replica
    /// takes the prefix within its own bound and ends below what `k` has
    /// now; then the prefix moves there (the first such replica in `key`'s
    /// rendezvous order) and takes its demand along. Checked once the pool
    /// has seen [`SETTLED_PER_REPLICA`] arrivals per replica (decayed):
    /// before that the shares are mostly noise.
    ///
    /// Each move lowers the larger of the two loads it touches, so demand
    /// that holds still settles instead of swinging back and forth; a
    /// prefix whose own demand is over any replica's bound stays where it
    /// is.
    fn rehome(
        &mut self,
        k: usize,
        key: u64,
        demand: f64,
        nodes: &[Node],
        now_ms: u64,
        tau_ms: f64,
    ) -> usize {
        let weight = |n: &Node| f64::from(n.weight.max(1));
        let total_weight: f64 = nodes.iter().map(weight).sum();
        let load = self.loads(nodes, now_ms, tau_ms);
        let pool: f64 = load.iter().sum();
        if pool < SETTLED_PER_REPLICA * nodes.len() as f64 {
            return k;
        }
        let bound = |i: usize| (1.0 + HEADROOM) * pool * weight(&nodes[i]) / total_weight;
        if load[k] <= bound(k) {
            return k;
        }
        let per = |i: usize, l: f64| l / weight(&nodes[i]);
        let target = rendezvous::order(key, nodes).into_iter().find(|&t| {
            t != k && load[t] + demand <= bound(t) && per(t, load[t] + demand) < per(k, load[k])
        });
        let Some(t) = target else {
            return k;
        };
        let moved = demand.min(load[k]);
        self.homed
            .entry(nodes[k].name_hash)
            .or_default()
            .shift(now_ms, tau_ms, -moved);
        self.homed
            .entry(nodes[t].name_hash)
            .or_default()
            .shift(now_ms, tau_ms, moved);
        t
    }

    /// The homed demand of each of `nodes` at `now_ms`.
    fn loads(&self, nodes: &[Node], now_ms: u64, tau_ms: f64) -> Vec<f64> {
        nodes
            .iter()
            .map(|n| {
                self.homed
                    .get(&n.name_hash)
                    .map_or(0.0, |d| d.at(now_ms, tau_ms))
            })
            .collect()
    }

    /// The first replica of `key`'s rendezvous order with room under the
    /// bound, else the least loaded by weight (the earliest in the order
    /// among equals).
    fn choose(&self, key: u64, nodes: &[Node], now_ms: u64, tau_ms: f64) -> Option<usize> {
        let weight = |n: &Node| f64::from(n.weight.max(1));
        let total_weight: f64 = nodes.iter().map(weight).sum();
        let load = self.loads(nodes, now_ms, tau_ms);
        let pool = load.iter().sum::<f64>() + 1.0;
        let share = |i: usize| weight(&nodes[i]) / total_weight;
        let order = rendezvous::order(key, nodes);
        order
            .iter()
            .copied()
            .find(|&i| load[i] + 1.0 <= ((1.0 + HEADROOM) * pool * share(i)).max(1.0))
            .or_else(|| {
                order.iter().copied().min_by(|&a, &b| {
                    (load[a] / weight(&nodes[a])).total_cmp(&(load[b] / weight(&nodes[b])))
                })
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: u64) -> Vec<Node> {
        (0..n)
            .map(|i| Node {
                name_hash: rendezvous::hash64(format!("10.0.0.{i}:8000").as_bytes()),
                weight: 1,
            })
            .collect()
    }

    /// Prefix keys whose rendezvous order over `nodes` starts with node 0.
    fn keys_preferring_first(nodes: &[Node], n: usize) -> Vec<u64> {
        (0u64..)
            .filter(|&k| rendezvous::first(k, nodes) == Some(0))
            .take(n)
            .collect()
    }

    #[test]
    fn prefixes_that_all_prefer_one_replica_are_split_by_demand() {
        // Six prefixes, all first in rendezvous order on replica 0, arrive
        // in turn: rendezvous alone would put all six there.
        let nodes = nodes(2);
        let keys = keys_preferring_first(&nodes, 6);
        let mut homes = Homes::default();
        let mut current: HashMap<u64, u64> = HashMap::new();
        let mut served = [0u32; 2];
        for t in 0..600u64 {
            let key = keys[(t % 6) as usize];
            let h = homes
                .place(
                    current.get(&key).copied(),
                    key,
                    0.0,
                    &nodes,
                    t * 10,
                    10_000.0,
                )
                .unwrap();
            current.insert(key, nodes[h].name_hash);
            served[h] += 1;
        }
        let on_first = current
            .values()
            .filter(|&&h| h == nodes[0].name_hash)
            .count();
        assert_eq!(on_first, 3, "{on_first} of 6 on replica 0");
        assert_eq!(served, [300, 300]);
    }

    #[test]
    fn four_prefixes_against_two_even_out_once_and_stay() {
        // Six prefixes of equal demand, placed four on replica 0 and two on
        // replica 1 (as early counts can place them).
        let nodes = nodes(2);
        let mut homes = Homes::default();
        let mut current: HashMap<u64, u64> = (0..6u64)
            .map(|k| (k, nodes[usize::from(k >= 4)].name_hash))
            .collect();
        let mut demand: HashMap<u64, f64> = HashMap::new();
        let mut moves = 0;
        for t in 0..1_200u64 {
            let key = (t * 7 + t / 6) % 6;
            let d = demand.entry(key).or_default();
            let h = homes
                .place(current.get(&key).copied(), key, *d, &nodes, t * 10, 1e9)
                .unwrap();
            *d += 1.0;
            if current.insert(key, nodes[h].name_hash) != Some(nodes[h].name_hash) {
                moves += 1;
            }
        }
        let on_first = current
            .values()
            .filter(|&&h| h == nodes[0].name_hash)
            .count();
        assert_eq!(on_first, 3, "{on_first} of 6 on replica 0");
        assert_eq!(moves, 1, "one move evens it out");
    }

    #[test]
    fn a_prefix_keeps_its_home_while_it_is_a_candidate() {
        let nodes = nodes(3);
        let mut homes = Homes::default();
        let first = homes.place(None, 42, 1.0, &nodes, 0, 10_000.0).unwrap();
        assert_eq!(
            Some(first),
            rendezvous::first(42, &nodes),
            "an empty pool: the first choice"
        );
        let name = nodes[first].name_hash;
        for t in 1..50 {
            assert_eq!(
                homes.place(Some(name), 42, (t + 1) as f64, &nodes, t, 10_000.0),
                Some(first)
            );
        }
        // Its home leaves the candidates: another replica takes it.
        let rest: Vec<Node> = nodes
            .iter()
            .copied()
            .filter(|n| n.name_hash != name)
            .collect();
        let moved = homes
            .place(Some(name), 42, 51.0, &rest, 60, 10_000.0)
            .unwrap();
        assert!(rest[moved].name_hash != name);
        assert_eq!(homes.place(None, 42, 52.0, &[], 70, 10_000.0), None);
    }

    #[test]
    fn a_heavier_replica_homes_more_demand() {
        let mut nodes = nodes(2);
        nodes[1].weight = 3;
        let mut homes = Homes::default();
        let mut current: HashMap<u64, u64> = HashMap::new();
        let mut served = [0u32; 2];
        for t in 0..4_000u64 {
            let key = t % 40;
            let h = homes
                .place(current.get(&key).copied(), key, 0.0, &nodes, t, 100_000.0)
                .unwrap();
            current.insert(key, nodes[h].name_hash);
            served[h] += 1;
        }
        // Weight 3 of 4: at most a quarter over its share of 3,000.
        assert!(served[1] >= 2_500 && served[0] <= 1_250, "{served:?}");
    }
}

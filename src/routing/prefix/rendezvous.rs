//! Rendezvous (highest-random-weight) hashing: every replica gets a score
//! for a key, and the key's replicas in descending score order are its
//! preference list (Thaler and Ravishankar, 1998).
//!
//! Removing a replica moves only the keys whose first choice it was; adding
//! one takes from each replica only the keys it now scores highest on. The
//! score depends on nothing but the key and the replica's *name* (its
//! `host:port` unless configured), so two llmlb instances with the same
//! replica set agree without talking to each other.
//!
//! Weighted form: score = weight / −ln(u), u ∈ (0, 1) derived from the pair,
//! so a replica of weight 2 is first for twice the keys.
//!
//! Cost: one 64-bit mix per replica per key, plus a sort for the full order;
//! no allocation for [`first_acceptable`]. No state, so nothing is ever stale.

use sha2::{Digest, Sha256};

/// 64 bits of SHA-256 of `bytes`: the stable identity of a key or a name.
pub fn hash64(bytes: &[u8]) -> u64 {
    let d = Sha256::digest(bytes);
    u64::from_le_bytes(d[..8].try_into().expect("8 bytes"))
}

/// SplitMix64's finaliser: a strong, cheap 64-bit mix.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A replica as rendezvous hashing sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Node {
    /// `hash64` of the replica's name.
    pub name_hash: u64,
    pub weight: u32,
}

/// The score of `node` for `key`: higher is preferred.
pub fn score(key: u64, node: Node) -> f64 {
    let h = mix(key ^ mix(node.name_hash));
    // 53 random bits → u in (0, 1): never 0, never 1.
    let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    f64::from(node.weight.max(1)) / -u.ln()
}

fn better(key: u64, a: Node, b: Node) -> bool {
    let (sa, sb) = (score(key, a), score(key, b));
    sa > sb || (sa == sb && a.name_hash > b.name_hash)
}

/// Indices of `nodes` in the key's preference order.
pub fn order(key: u64, nodes: &[Node]) -> Vec<usize> {
    let mut idx: Vec<(f64, u64, usize)> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (score(key, *n), n.name_hash, i))
        .collect();
    idx.sort_by(|a, b| b.0.total_cmp(&a.0).then(b.1.cmp(&a.1)));
    idx.into_iter().map(|(_, _, i)| i).collect()
}

/// The key's first choice among `nodes`.
pub fn first(key: u64, nodes: &[Node]) -> Option<usize> {
    first_acceptable(key, nodes, |_| true).map(|(i, _)| i)
}

/// The most preferred node that `accept` takes, with its rank in the key's
/// order (0 = the first choice). `None` when no node is acceptable.
pub fn first_acceptable(
    key: u64,
    nodes: &[Node],
    accept: impl Fn(usize) -> bool,
) -> Option<(usize, usize)> {
    let mut best: Option<usize> = None;
    for (i, n) in nodes.iter().enumerate() {
        if accept(i) && best.is_none_or(|b| better(key, *n, nodes[b])) {
            best = Some(i);
        }
    }
    let b = best?;
    // Its rank: how many nodes the key prefers over it.
    let rank = nodes.iter().filter(|n| better(key, **n, nodes[b])).count();
    Some((b, rank))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: usize) -> Vec<Node> {
        (0..n)
            .map(|i| Node {
                name_hash: hash64(format!("10.0.0.{i}:8000").as_bytes()),
                weight: 1,
            })
            .collect()
    }

    /// `all` with its `removed`-th node taken out.
    fn without(all: &[Node], removed: usize) -> Vec<Node> {
        let mut rest = all.to_vec();
        rest.remove(removed);
        rest
    }

    #[test]
    fn removing_a_replica_moves_only_its_keys() {
        let all = nodes(8);
        let removed = 3;
        let rest = without(&all, removed);
        let mut moved = 0;
        for k in 0..5_000u64 {
            let key = hash64(&k.to_le_bytes());
            let before = all[first(key, &all).unwrap()];
            let after = rest[first(key, &rest).unwrap()];
            if before == all[removed] {
                moved += 1;
                // Its keys go to their second choice.
                assert_eq!(after, all[order(key, &all)[1]]);
            } else {
                assert_eq!(before, after, "key {k} moved though its replica stayed");
            }
        }
        // About 1/8 of the keys lived on the removed replica.
        assert!((450..=800).contains(&moved), "{moved}");
    }

    #[test]
    fn adding_a_replica_takes_only_what_it_wins() {
        let before = nodes(6);
        let after = nodes(7);
        for k in 0..2_000u64 {
            let key = hash64(&k.to_le_bytes());
            let b = before[first(key, &before).unwrap()];
            let a = after[first(key, &after).unwrap()];
            assert!(a == b || a == after[6]);
        }
    }

    #[test]
    fn spread_is_even_and_follows_weights() {
        let mut ns = nodes(4);
        ns[0].weight = 2;
        let mut counts = [0usize; 4];
        for k in 0..20_000u64 {
            counts[first(hash64(&k.to_le_bytes()), &ns).unwrap()] += 1;
        }
        // Expected shares 2/5, 1/5, 1/5, 1/5 of 20,000: 8,000 and 4,000 (±7 %).
        assert!((7_440..=8_560).contains(&counts[0]), "{counts:?}");
        for c in &counts[1..] {
            assert!((3_720..=4_280).contains(c), "{counts:?}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// For any replica set and any replica removed, a key moves only
        /// when it lived on the removed replica, and then to its second choice.
        #[test]
        fn removal_moves_only_the_removed_replicas_keys(
            names in proptest::collection::hash_set("[a-z0-9.:]{3,20}", 2..24),
            weights in proptest::collection::vec(1u32..5, 24),
            removed_pick in 0usize..1000,
            key in proptest::prelude::any::<u64>(),
        ) {
            let all: Vec<Node> = names
                .iter()
                .zip(&weights)
                .map(|(n, w)| Node { name_hash: hash64(n.as_bytes()), weight: *w })
                .collect();
            let removed = removed_pick % all.len();
            let rest = without(&all, removed);
            let before = all[first(key, &all).unwrap()];
            let after = rest[first(key, &rest).unwrap()];
            if before == all[removed] {
                proptest::prop_assert_eq!(after, all[order(key, &all)[1]]);
            } else {
                proptest::prop_assert_eq!(before, after);
            }
        }
    }

    #[test]
    fn first_acceptable_follows_the_order() {
        let ns = nodes(5);
        let key = hash64(b"system prompt");
        let ord = order(key, &ns);
        assert_eq!(first_acceptable(key, &ns, |_| true), Some((ord[0], 0)));
        let skip = ord[0];
        assert_eq!(first_acceptable(key, &ns, |i| i != skip), Some((ord[1], 1)));
        assert_eq!(first_acceptable(key, &ns, |_| false), None);
    }
}

//! Which requests in flight on one replica carry each block, ranked by when
//! they should end: what `exact` mode counts on a replica whose requests in
//! flight carry more blocks than it holds ([`super::held`], "More in flight
//! than fits").
//!
//! A request's rank is its key `(ends_ms, id)`: the later it ends, the
//! higher (the later sent first among equal ends). A block's rank is the
//! highest of its carriers'. Gathering the requests' prompts from the
//! highest rank down until `capacity` distinct blocks are in is the same
//! as keeping every block whose rank is at least the rank where the
//! running count of blocks, by rank, reaches `capacity`: that rank is the
//! [`Ending::cutoff`], found by walking one count per request.
//!
//! Cost: carrying or releasing a prompt is O(its blocks × log requests),
//! more for a block many requests carry when its highest carrier ends
//! (its carriers are scanned once); a cutoff is O(requests walked); a
//! lookup O(1).

use std::collections::{BTreeMap, HashMap};

/// A request's rank: when it should end, then its id.
pub type Rank = (u64, u64);

#[derive(Debug, Default)]
pub struct Ending {
    /// Each carried block → its carriers' ranks and the highest of them.
    blocks: HashMap<u64, Carried>,
    /// Each rank → how many blocks have it as their highest.
    highest: BTreeMap<Rank, usize>,
}

#[derive(Debug)]
struct Carried {
    ranks: Vec<Rank>,
    top: Rank,
}

impl Ending {
    /// A request of rank `rank` carries `blocks`.
    pub fn carry(&mut self, rank: Rank, blocks: &[u64]) {
        for &b in blocks {
            match self.blocks.get_mut(&b) {
                Some(c) => {
                    c.ranks.push(rank);
                    if rank > c.top {
                        let old = std::mem::replace(&mut c.top, rank);
                        Self::moved(&mut self.highest, Some(old), Some(rank));
                    }
                }
                None => {
                    self.blocks.insert(
                        b,
                        Carried {
                            ranks: vec![rank],
                            top: rank,
                        },
                    );
                    Self::moved(&mut self.highest, None, Some(rank));
                }
            }
        }
    }

    /// The request of rank `rank` that carried `blocks` ended.
    pub fn release(&mut self, rank: Rank, blocks: &[u64]) {
        for &b in blocks {
            let Some(c) = self.blocks.get_mut(&b) else {
                continue;
            };
            let Some(pos) = c.ranks.iter().position(|r| *r == rank) else {
                continue;
            };
            c.ranks.swap_remove(pos);
            if rank != c.top {
                continue;
            }
            match c.ranks.iter().max().copied() {
                Some(top) => {
                    c.top = top;
                    Self::moved(&mut self.highest, Some(rank), Some(top));
                }
                None => {
                    self.blocks.remove(&b);
                    Self::moved(&mut self.highest, Some(rank), None);
                }
            }
        }
    }

    pub fn clear(&mut self) {
        self.blocks.clear();
        self.highest.clear();
    }

    /// When more than `capacity` distinct blocks are carried: the lowest
    /// rank whose blocks still count (see the module docs). `None` while
    /// they fit.
    pub fn cutoff(&self, capacity: usize) -> Option<Rank> {
        if self.blocks.len() <= capacity {
            return None;
        }
        let mut gathered = 0;
        for (rank, n) in self.highest.iter().rev() {
            gathered += n;
            if gathered >= capacity {
                return Some(*rank);
            }
        }
        self.highest.keys().next().copied()
    }

    /// Whether a request in flight carries `block`.
    pub fn carries(&self, block: u64) -> bool {
        self.blocks.contains_key(&block)
    }

    /// How many distinct blocks requests in flight carry.
    pub fn carried(&self) -> usize {
        self.blocks.len()
    }

    /// Whether `block` is carried by a request ranked at least `cutoff`.
    pub fn kept(&self, block: u64, cutoff: Rank) -> bool {
        self.blocks.get(&block).is_some_and(|c| c.top >= cutoff)
    }

    fn moved(highest: &mut BTreeMap<Rank, usize>, from: Option<Rank>, to: Option<Rank>) {
        if let Some(f) = from
            && let Some(n) = highest.get_mut(&f)
        {
            *n -= 1;
            if *n == 0 {
                highest.remove(&f);
            }
        }
        if let Some(t) = to {
            *highest.entry(t).or_insert(0) += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// The definition: gather the prompts from the highest rank down until
    /// `capacity` distinct blocks are in.
    fn gathered(requests: &[(Rank, Vec<u64>)], capacity: usize) -> Option<HashSet<u64>> {
        let carried: HashSet<u64> = requests
            .iter()
            .flat_map(|(_, b)| b.iter().copied())
            .collect();
        if carried.len() <= capacity {
            return None;
        }
        let mut order: Vec<&(Rank, Vec<u64>)> = requests.iter().collect();
        order.sort_by_key(|r| std::cmp::Reverse(r.0));
        let mut kept = HashSet::new();
        for (_, blocks) in order {
            kept.extend(blocks.iter().copied());
            if kept.len() >= capacity {
                break;
            }
        }
        Some(kept)
    }

    #[test]
    fn the_cutoff_keeps_what_gathering_by_rank_keeps() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut e = Ending::default();
        let mut live: Vec<(Rank, Vec<u64>)> = Vec::new();
        for id in 0..400u64 {
            if !live.is_empty() && next(3) == 0 {
                let (rank, blocks) = live.swap_remove(next(live.len() as u64) as usize);
                e.release(rank, &blocks);
            } else {
                // Prompts share beginnings: one of four prefixes, then
                // blocks of their own.
                let prefix = next(4) * 100;
                let len = 1 + next(6);
                let blocks: Vec<u64> = (0..len)
                    .map(|i| {
                        if i < 3 {
                            prefix + i
                        } else {
                            1000 + id * 10 + i
                        }
                    })
                    .collect();
                let rank = (next(50), id);
                e.carry(rank, &blocks);
                live.push((rank, blocks));
            }
            for capacity in [1, 4, 10, 30] {
                let want = gathered(&live, capacity);
                let got = e.cutoff(capacity);
                assert_eq!(
                    want.is_some(),
                    got.is_some(),
                    "step {id}, capacity {capacity}"
                );
                if let (Some(want), Some(cut)) = (want, got) {
                    for b in live.iter().flat_map(|(_, b)| b.iter()) {
                        assert_eq!(want.contains(b), e.kept(*b, cut), "block {b}, step {id}");
                    }
                }
            }
        }
        for (rank, blocks) in live.drain(..) {
            e.release(rank, &blocks);
        }
        assert!(e.blocks.is_empty() && e.highest.is_empty());
    }
}

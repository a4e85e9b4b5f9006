//! Which of the blocks a replica reports holding it will evict before a
//! new request's prefill runs: `exact` mode's view is what the replica
//! holds, plus what it has been sent, *minus what it will evict* to make
//! room for what it has been sent.
//!
//! vLLM keeps the blocks no running request uses in a free queue, in the
//! order they were last released (a finished request's blocks tail first,
//! so a prompt's shared beginning outlives its end), and takes the blocks
//! a newly scheduled request writes from the front of that queue, evicting
//! the cached prefix they held (`src/replica_sim` models the same order).
//! A request llmlb places now runs after the ones already in flight there,
//! so the blocks those will write come out of the oldest free ones first.
//!
//! The estimate, per replica, keyed by llmlb's block hashes:
//!
//! ```text
//! last use   = when a block was reported stored, or when the last request
//!              llmlb sent with it ended (its blocks tail first)
//! referenced = carried by a request llmlb has in flight there: in use, or
//!              about to be used, so not in line for eviction
//! overflow   = reported blocks + sent blocks not yet reported − capacity
//! doomed     = the `overflow` unreferenced reported blocks with the
//!              oldest last use
//! ```
//!
//! A doomed block does not count as held for the next pick (nor in what
//! llmlb predicts the replica will report cached). Nothing is doomed while
//! the capacity is unknown (neither reported by the replica's metrics nor
//! learned from its events: the blocks it held when it first had to evict,
//! [`EvictOrder::learn_capacity`]) or while everything fits. What it does
//! not see: requests of other clients (their stores count, their future
//! writes do not), the partial last block of a running request, output
//! blocks still to be written, and a waiting request's prefix evicted by
//! the ones scheduled before it (a referenced block is never doomed here;
//! when the requests in flight carry more blocks than the capacity, the
//! record counts only those of the requests that end last instead:
//! [`super::held`], "More in flight than fits").
//!
//! Cost: a stamp per stored block in a hash map and an ordered map
//! (about 80 bytes); a store, a removal or a request's end is O(log n) per
//! block, plus the carried blocks' ranks ([`super::ending`]). A pick walks
//! the oldest unreferenced blocks once per replica, O(overflow +
//! referenced blocks older than the line), which is the work
//! in flight there, not the cache size, and zero while everything fits.

use std::collections::{BTreeMap, HashMap};

use super::ending::{Ending, Rank};

/// The last-use order of one replica's reported blocks (see the module docs).
#[derive(Debug, Default)]
pub struct EvictOrder {
    /// Block → its last-use stamp.
    stamp_of: HashMap<u64, u64>,
    /// Stamp → block, oldest first.
    by_stamp: BTreeMap<u64, u64>,
    /// Blocks carried by requests in flight, ranked by when those end.
    carried: Ending,
    next: u64,
    /// Capacity learned from the events, in blocks (see [`Self::learn_capacity`]).
    learned: Option<usize>,
}

/// The line below which unreferenced blocks are doomed, for one pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Doom {
    /// Unreferenced blocks stamped at or before this are doomed; `None`:
    /// nothing is.
    below: Option<u64>,
}

impl Doom {
    pub const NONE: Doom = Doom { below: None };
}

impl EvictOrder {
    fn stamp(&mut self, block: u64) {
        let s = self.next;
        self.next += 1;
        if let Some(old) = self.stamp_of.insert(block, s) {
            self.by_stamp.remove(&old);
        }
        self.by_stamp.insert(s, block);
    }

    /// The replica reported storing `blocks`, in prompt order: each is used
    /// now, the last of them the least recently (as vLLM releases them).
    pub fn stored(&mut self, blocks: &[u64]) {
        for &b in blocks.iter().rev() {
            self.stamp(b);
        }
    }

    /// The replica evicted `block` (or no longer holds it under any key).
    pub fn removed(&mut self, block: u64) {
        if let Some(s) = self.stamp_of.remove(&block) {
            self.by_stamp.remove(&s);
        }
    }

    /// The replica holds nothing (restart, cleared cache) and what was in
    /// flight is forgotten; the learned capacity stays.
    pub fn clear(&mut self) {
        self.stamp_of.clear();
        self.by_stamp.clear();
        self.carried.clear();
    }

    /// A request of rank `rank` carrying `blocks` (its prompt's, in order)
    /// was sent.
    pub fn carry(&mut self, rank: Rank, blocks: &[u64]) {
        self.carried.carry(rank, blocks);
    }

    /// The request of rank `rank` carrying `blocks` ended: they are
    /// released, tail first, and those the replica holds are used now.
    pub fn release(&mut self, rank: Rank, blocks: &[u64]) {
        self.carried.release(rank, blocks);
        for &b in blocks.iter().rev() {
            if self.stamp_of.contains_key(&b) {
                self.stamp(b);
            }
        }
    }

    /// The replica evicted a block while holding `held` reported blocks:
    /// it had no empty block left, so its capacity is at least that.
    pub fn learn_capacity(&mut self, held: usize) {
        self.learned = Some(self.learned.unwrap_or(0).max(held));
    }

    /// The capacity learned from the events, in blocks.
    pub fn learned_capacity(&self) -> Option<usize> {
        self.learned
    }

    /// Which blocks a pick should count as gone: with `held` reported
    /// blocks, `sent` blocks on their way and room for `capacity`, the
    /// oldest unreferenced reported blocks that the sent ones push out.
    pub fn doom(&self, held: usize, sent: usize, capacity: Option<usize>) -> Doom {
        let Some(capacity) = capacity.or(self.learned) else {
            return Doom::NONE;
        };
        let overflow = (held + sent).saturating_sub(capacity);
        if overflow == 0 {
            return Doom::NONE;
        }
        let mut left = overflow;
        let mut below = None;
        for (&s, b) in &self.by_stamp {
            if self.carried.carries(*b) {
                continue;
            }
            below = Some(s);
            left -= 1;
            if left == 0 {
                break;
            }
        }
        Doom { below }
    }

    /// Whether `block`, reported held, will be gone by the pick's turn.
    pub fn doomed(&self, block: u64, doom: Doom) -> bool {
        let Some(below) = doom.below else {
            return false;
        };
        !self.carried.carries(block) && self.stamp_of.get(&block).is_some_and(|&s| s <= below)
    }

    /// Whether a request in flight carries `block`.
    pub fn carries(&self, block: u64) -> bool {
        self.carried.carries(block)
    }

    /// The blocks requests in flight carry, ranked by when those end.
    pub fn carried(&self) -> &Ending {
        &self.carried
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doomed(o: &EvictOrder, held: usize, sent: usize, cap: usize, blocks: &[u64]) -> Vec<u64> {
        let d = o.doom(held, sent, Some(cap));
        blocks.iter().copied().filter(|&b| o.doomed(b, d)).collect()
    }

    #[test]
    fn nothing_is_doomed_while_everything_fits_or_the_capacity_is_unknown() {
        let mut o = EvictOrder::default();
        o.stored(&[1, 2, 3]);
        assert!(doomed(&o, 3, 2, 5, &[1, 2, 3]).is_empty());
        assert_eq!(o.doom(3, 9, None), Doom::NONE);
    }

    #[test]
    fn the_oldest_go_first_and_a_prompt_loses_its_tail_first() {
        let mut o = EvictOrder::default();
        o.stored(&[1, 2, 3]); // one prompt: 3 is the oldest, 1 the newest
        o.stored(&[10, 11]);
        assert_eq!(doomed(&o, 5, 2, 5, &[1, 2, 3, 10, 11]), vec![2, 3]);
        assert_eq!(doomed(&o, 5, 3, 5, &[1, 2, 3, 10, 11]), vec![1, 2, 3]);
    }

    #[test]
    fn blocks_in_flight_are_kept_and_used_again_when_their_request_ends() {
        let mut o = EvictOrder::default();
        o.stored(&[1, 2]);
        o.stored(&[10, 11]);
        o.carry((0, 0), &[1, 2, 5]);
        // 1 and 2 are the oldest but carried: the next oldest go instead.
        assert_eq!(doomed(&o, 4, 2, 4, &[1, 2, 10, 11]), vec![10, 11]);
        assert_eq!(o.carried().carried(), 3);
        o.release((0, 0), &[1, 2, 5]);
        assert_eq!(o.carried().carried(), 0);
        // Released after 10 and 11 were stored: now the most recent.
        assert_eq!(doomed(&o, 4, 2, 4, &[1, 2, 10, 11]), vec![10, 11]);
        assert_eq!(doomed(&o, 4, 3, 4, &[1, 2, 10, 11]), vec![2, 10, 11]);
    }

    #[test]
    fn removed_and_cleared_blocks_leave_the_order() {
        let mut o = EvictOrder::default();
        o.stored(&[1, 2, 3]);
        o.removed(3);
        assert_eq!(doomed(&o, 2, 1, 2, &[1, 2, 3]), vec![2]);
        o.clear();
        assert!(doomed(&o, 0, 1, 0, &[1, 2]).is_empty());
    }

    #[test]
    fn the_capacity_is_learned_from_the_first_evictions() {
        let mut o = EvictOrder::default();
        o.stored(&[1, 2, 3, 4]);
        o.learn_capacity(4);
        o.learn_capacity(3);
        assert_eq!(o.learned_capacity(), Some(4));
        let d = o.doom(4, 1, None);
        assert!(o.doomed(4, d) && !o.doomed(3, d));
        // A reported capacity wins over the learned one.
        assert_eq!(o.doom(4, 1, Some(8)), Doom::NONE);
    }

    #[test]
    fn more_overflow_than_unreferenced_blocks_dooms_only_those() {
        let mut o = EvictOrder::default();
        o.stored(&[1, 2, 3]);
        o.carry((0, 0), &[1, 2]);
        assert_eq!(doomed(&o, 3, 5, 3, &[1, 2, 3]), vec![3]);
    }
}

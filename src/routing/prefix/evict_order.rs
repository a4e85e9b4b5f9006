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
//! A waiting request's prefix is not protected: until the scheduler takes
//! it, its blocks sit in the free queue like any other. vLLM runs its
//! waiting queue first come, first served, and a request placed now runs
//! after the ones already in flight there, so the blocks those will write
//! come out of the oldest free ones first, and only the requests that fit
//! in the cache together get to use their prefix before it goes.
//!
//! The estimate, per replica, keyed by llmlb's block hashes:
//!
//! ```text
//! last use   = when a block was reported stored, or when the last request
//!              llmlb sent with it ended (its blocks tail first)
//! spared     = carried by one of the requests llmlb has in flight there
//!              that fit in the cache together, taken in the order they
//!              were sent (the order the replica runs them) until the next
//!              one's blocks would go past the capacity: those are running
//!              or run first, so not in line for eviction
//! overflow   = reported blocks + sent blocks not yet reported − capacity
//! doomed     = the `overflow` reported blocks with the oldest last use
//!              that are not spared (a block carried only by requests that
//!              do not fit is doomed like any other)
//! ```
//!
//! A doomed block does not count as held for the next pick (nor in what
//! llmlb predicts the replica will report cached). Nothing is doomed while
//! the capacity is unknown (neither reported by the replica's metrics nor
//! learned from its events: the blocks it held when it first had to evict,
//! [`EvictOrder::learn_capacity`]) or while everything fits. What it does
//! not see: requests of other clients (their stores count, their future
//! writes do not), the partial last block of a running request, output
//! blocks still to be written, and chunked prefill (a request is taken
//! whole or not at all).
//!
//! Cost: a stamp per stored block in a hash map and an ordered map
//! (about 80 bytes), and each request in flight's block list; a store, a
//! removal or a request's end is O(log n) per block. A pick walks the
//! requests in flight once (a set of their blocks, up to the capacity) and
//! the oldest unspared blocks, O(blocks in flight + overflow), which is the
//! work in flight there, not the cache size, and zero while everything fits.

use std::collections::{BTreeMap, HashMap, HashSet};

/// The last-use order of one replica's reported blocks (see the module docs).
#[derive(Debug, Default)]
pub struct EvictOrder {
    /// Block → its last-use stamp.
    stamp_of: HashMap<u64, u64>,
    /// Stamp → block, oldest first.
    by_stamp: BTreeMap<u64, u64>,
    /// Requests in flight, by the order they were sent → their blocks.
    flight: BTreeMap<u64, Vec<u64>>,
    /// Blocks carried by requests in flight → those requests, in the
    /// order they were sent.
    refs: HashMap<u64, Vec<u64>>,
    next: u64,
    /// Capacity learned from the events, in blocks (see [`Self::learn_capacity`]).
    learned: Option<usize>,
}

/// Which blocks count as gone, for one pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Doom {
    /// Unspared blocks stamped at or before this are doomed; `None`:
    /// nothing is.
    below: Option<u64>,
    /// Blocks carried by a request sent before this one are spared.
    cut: u64,
}

impl Doom {
    pub const NONE: Doom = Doom {
        below: None,
        cut: u64::MAX,
    };
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
        self.flight.clear();
        self.refs.clear();
    }

    /// Request `id` carrying `blocks` (its prompt's, in order) was sent;
    /// ids rise in the order requests are sent.
    pub fn carry(&mut self, id: u64, blocks: &[u64]) {
        for &b in blocks {
            let ids = self.refs.entry(b).or_default();
            if ids.last() != Some(&id) {
                ids.push(id);
            }
        }
        self.flight.insert(id, blocks.to_vec());
    }

    /// Request `id` ended: its blocks are released, tail first, and those
    /// the replica holds are used now.
    pub fn release(&mut self, id: u64) {
        let Some(blocks) = self.flight.remove(&id) else {
            return;
        };
        for &b in blocks.iter().rev() {
            if let Some(ids) = self.refs.get_mut(&b) {
                ids.retain(|&i| i != id);
                if ids.is_empty() {
                    self.refs.remove(&b);
                }
            }
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

    /// The first request in flight, in sent order, whose blocks do not fit
    /// in `capacity` together with those of the requests before it
    /// (`u64::MAX`: they all fit).
    fn cut(&self, capacity: usize) -> u64 {
        let mut kept: HashSet<u64> = HashSet::new();
        for (&id, blocks) in &self.flight {
            let new = blocks.iter().filter(|b| !kept.contains(b)).count();
            if kept.len() + new > capacity {
                return id;
            }
            kept.extend(blocks.iter().copied());
        }
        u64::MAX
    }

    fn spared(&self, block: u64, cut: u64) -> bool {
        self.refs
            .get(&block)
            .is_some_and(|ids| ids.iter().any(|&i| i < cut))
    }

    /// Which blocks a pick should count as gone: with `held` reported
    /// blocks, `sent` blocks on their way and room for `capacity`, the
    /// oldest unspared reported blocks that the sent ones push out.
    pub fn doom(&self, held: usize, sent: usize, capacity: Option<usize>) -> Doom {
        let Some(capacity) = capacity.or(self.learned) else {
            return Doom::NONE;
        };
        let overflow = (held + sent).saturating_sub(capacity);
        if overflow == 0 {
            return Doom::NONE;
        }
        let cut = self.cut(capacity);
        let mut left = overflow;
        let mut below = None;
        for (&s, &b) in &self.by_stamp {
            if self.spared(b, cut) {
                continue;
            }
            below = Some(s);
            left -= 1;
            if left == 0 {
                break;
            }
        }
        Doom { below, cut }
    }

    /// Whether `block`, reported held, will be gone by the pick's turn.
    pub fn doomed(&self, block: u64, doom: Doom) -> bool {
        let Some(below) = doom.below else {
            return false;
        };
        !self.spared(block, doom.cut) && self.stamp_of.get(&block).is_some_and(|&s| s <= below)
    }

    /// How many blocks requests in flight carry (for tests and status).
    pub fn referenced(&self) -> usize {
        self.refs.len()
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
        o.carry(0, &[1, 2, 5]);
        // 1 and 2 are the oldest but carried: the next oldest go instead.
        assert_eq!(doomed(&o, 4, 2, 4, &[1, 2, 10, 11]), vec![10, 11]);
        assert_eq!(o.referenced(), 3);
        o.release(0);
        assert_eq!(o.referenced(), 0);
        // Released after 10 and 11 were stored: now the most recent.
        assert_eq!(doomed(&o, 4, 2, 4, &[1, 2, 10, 11]), vec![10, 11]);
        assert_eq!(doomed(&o, 4, 3, 4, &[1, 2, 10, 11]), vec![2, 10, 11]);
    }

    /// The replica runs its queue in order: a request that does not fit in
    /// the cache beside the ones sent before it waits, and its prefix, in
    /// the free queue meanwhile, goes as any other old block would.
    #[test]
    fn a_waiting_request_past_the_capacity_does_not_spare_its_prefix() {
        let mut o = EvictOrder::default();
        o.stored(&[1, 2]); // the oldest: the waiting request's prefix
        o.stored(&[10, 11]);
        o.carry(0, &[10, 11, 20, 21]); // runs first, fills the cache
        o.carry(1, &[1, 2, 30]); // waits behind it
        // 4 reported + 3 sent (20, 21, 30) in a cache of 4: 3 must go, and
        // only 1 and 2 are not held by the request that runs.
        assert_eq!(doomed(&o, 4, 3, 4, &[1, 2, 10, 11]), vec![1, 2]);
        // With room for both requests, both prefixes are spared.
        assert!(doomed(&o, 4, 3, 7, &[1, 2, 10, 11]).is_empty());
        // Once the first has ended the waiting one runs: its prefix stays
        // and the released blocks are the oldest unspared ones.
        o.release(0);
        assert_eq!(doomed(&o, 4, 1, 4, &[1, 2, 10, 11]), vec![11]);
    }

    #[test]
    fn a_prefix_shared_with_a_request_that_runs_first_is_spared() {
        let mut o = EvictOrder::default();
        o.stored(&[1, 2]);
        o.stored(&[10, 11]);
        o.carry(0, &[1, 2, 20]);
        o.carry(1, &[1, 2, 21, 22]); // 2 new blocks past room for 4
        o.carry(2, &[10, 11, 23]);
        // Request 1 does not fit (3 + 2 > 4), nor does 2 behind it: 10 and
        // 11 go; 1 and 2 stay, request 0 runs with them.
        assert_eq!(doomed(&o, 4, 4, 4, &[1, 2, 10, 11]), vec![10, 11]);
        o.release(1);
        o.release(2);
        assert_eq!(o.referenced(), 3);
    }

    #[test]
    fn removed_and_cleared_blocks_leave_the_order() {
        let mut o = EvictOrder::default();
        o.stored(&[1, 2, 3]);
        o.removed(3);
        assert_eq!(doomed(&o, 2, 1, 2, &[1, 2, 3]), vec![2]);
        o.carry(0, &[1]);
        o.clear();
        assert_eq!(o.referenced(), 0);
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
    fn more_overflow_than_unspared_blocks_dooms_only_those() {
        let mut o = EvictOrder::default();
        o.stored(&[1, 2, 3]);
        o.carry(0, &[1, 2]);
        assert_eq!(doomed(&o, 3, 5, 3, &[1, 2, 3]), vec![3]);
    }
}

//! The paged KV cache: a pool of fixed-size blocks with prefix caching.
//!
//! Modelled on vLLM's v1 block pool (`vllm/v1/core/block_pool.py`,
//! `FreeKVCacheBlockQueue` in `kv_cache_utils.py`), written from its
//! documented behaviour and checked against the KV events a real vLLM
//! publishes (`tests/it/sim_eviction_order.rs`):
//! - every block has a reference count; a block with no reference sits on the
//!   **free queue**, whose head is taken first;
//! - a *full* block of a request is **committed** under its chained hash
//!   (see [`block_hash`]); the hash stays on the block after it is freed, so a
//!   later request with the same prefix can find it. As in vLLM, identical
//!   content is not de-duplicated: a block recomputed while another copy is
//!   cached is committed too, and a lookup returns the oldest copy;
//! - **freeing** a request's blocks walks them last block first: those that
//!   carry a hash go to the **tail** of the queue (least recently used at the
//!   head, and within one request the leaf of its prefix before its
//!   parents); those that carry none (a partly filled last block) go to the
//!   **head**, to be reused before any cached block is evicted;
//! - a **hit** on a free block takes it off the queue (it is used again);
//! - **allocation** takes the head of the queue and evicts whatever hash it
//!   still carried.
//!
//! The queue is an intrusive doubly linked list over block indices, so taking
//! a block out of its middle (a hit) is O(1). Lookup by hash is one `HashMap`
//! probe. The pool is owned by one engine and never shared.
//!
//! With [`BlockPool::record_events`] on, the pool also notes what vLLM would
//! publish as KV-cache events: one `BlockStored` for each run of blocks a
//! request commits in one step (their hashes, the parent of the first, their
//! tokens) and one `BlockRemoved` for each hash evicted; the engine drains
//! them after every step.

use std::collections::HashMap;

use crate::kv_events::{BlockKey, KvEvent};

pub type BlockId = u32;

const NIL: u32 = u32::MAX;

/// Chained hash of one full block: equal exactly when this block's tokens and
/// every token before it are equal (FNV-1a over the parent hash and the ids,
/// then a final avalanche so nearby inputs spread over the 64-bit space).
pub fn block_hash(parent: Option<u64>, tokens: &[u32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |x: u64| {
        for b in x.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(parent.unwrap_or(0x9e37_79b9_7f4a_7c15));
    for &t in tokens {
        eat(u64::from(t));
    }
    mix64(h)
}

/// SplitMix64's finaliser: a cheap bijective avalanche on 64 bits.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The blocks holding one hash: nearly always one.
#[derive(Debug)]
enum Copies {
    One(BlockId),
    Many(Vec<BlockId>),
}

impl Copies {
    fn first(&self) -> BlockId {
        match self {
            Copies::One(id) => *id,
            Copies::Many(ids) => ids[0],
        }
    }
}

#[derive(Debug)]
pub struct BlockPool {
    ref_cnt: Vec<u32>,
    hash: Vec<Option<u64>>,
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
    num_free: usize,
    /// Every cached copy of each hash, oldest first.
    cached: HashMap<u64, Copies>,
    evictions: u64,
    /// KV-cache events not yet drained, when recording.
    events: Option<Vec<KvEvent>>,
}

impl BlockPool {
    /// A pool of `num_blocks` free, empty blocks (free list in index order).
    pub fn new(num_blocks: usize) -> BlockPool {
        assert!(num_blocks > 0 && num_blocks < NIL as usize);
        let n = num_blocks as u32;
        BlockPool {
            ref_cnt: vec![0; num_blocks],
            hash: vec![None; num_blocks],
            prev: (0..n).map(|i| if i == 0 { NIL } else { i - 1 }).collect(),
            next: (0..n)
                .map(|i| if i + 1 == n { NIL } else { i + 1 })
                .collect(),
            head: 0,
            tail: n - 1,
            num_free: num_blocks,
            cached: HashMap::new(),
            evictions: 0,
            events: None,
        }
    }

    /// Starts noting KV-cache events (see the module docs).
    pub fn record_events(&mut self) {
        self.events.get_or_insert_with(Vec::new);
    }

    pub fn is_recording(&self) -> bool {
        self.events.is_some()
    }

    /// The events noted since the last call (empty when not recording).
    pub fn take_events(&mut self) -> Vec<KvEvent> {
        self.events.as_mut().map(std::mem::take).unwrap_or_default()
    }

    pub fn num_blocks(&self) -> usize {
        self.ref_cnt.len()
    }

    /// Blocks with no reference, cached or not.
    pub fn num_free(&self) -> usize {
        self.num_free
    }

    /// Fraction of blocks in use, 0..1 (cached-but-free blocks count as free,
    /// as in `vllm:kv_cache_usage_perc`).
    pub fn usage(&self) -> f64 {
        1.0 - self.num_free as f64 / self.num_blocks() as f64
    }

    /// Cached blocks evicted so far to make room.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// The block holding `hash`, if it is still cached.
    pub fn lookup(&self, hash: u64) -> Option<BlockId> {
        self.cached.get(&hash).map(Copies::first)
    }

    /// Whether `id` has no reference (so taking it costs a free block).
    pub fn is_free(&self, id: BlockId) -> bool {
        self.ref_cnt[id as usize] == 0
    }

    /// Takes a reference on a cached block found by [`lookup`](Self::lookup),
    /// reviving it from the free list when nobody held it.
    pub fn acquire(&mut self, id: BlockId) {
        if self.ref_cnt[id as usize] == 0 {
            self.unlink(id);
        }
        self.ref_cnt[id as usize] += 1;
    }

    /// A fresh block from the head of the free queue, evicting its old hash.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let id = self.head;
        if id == NIL {
            return None;
        }
        self.unlink(id);
        if let Some(h) = self.hash[id as usize].take() {
            self.uncache(h, id);
            if let Some(events) = &mut self.events {
                events.push(KvEvent::BlockRemoved {
                    block_hashes: vec![BlockKey(h)],
                    medium: Some("GPU".into()),
                });
            }
            self.evictions += 1;
        }
        self.ref_cnt[id as usize] = 1;
        Some(id)
    }

    /// Drops one reference on each of `blocks`, given in eviction order (a
    /// request frees its blocks last first). Those nobody holds any more go
    /// back to the free queue: cached ones to its tail in that order,
    /// anonymous ones to its head (the first of them at the very head).
    pub fn free_blocks(&mut self, blocks: impl IntoIterator<Item = BlockId>) {
        let mut anonymous = Vec::new();
        for id in blocks {
            let rc = &mut self.ref_cnt[id as usize];
            assert!(*rc > 0, "block {id} freed twice");
            *rc -= 1;
            if *rc > 0 {
                continue;
            }
            if self.hash[id as usize].is_some() {
                self.push_tail(id);
            } else {
                anonymous.push(id);
            }
        }
        for &id in anonymous.iter().rev() {
            self.push_head(id);
        }
    }

    /// Drops one reference on one block (see [`free_blocks`](Self::free_blocks)).
    pub fn free(&mut self, id: BlockId) {
        self.free_blocks([id]);
    }

    /// Records that `id` now holds the full block identified by `hash`. A
    /// block commits once; another block holding the same content stays
    /// cached beside it. Returns whether `id` took the hash (the caller
    /// reports the run with [`note_stored`](Self::note_stored)).
    pub fn commit(&mut self, id: BlockId, hash: u64) -> bool {
        if self.hash[id as usize].is_some() {
            return false;
        }
        self.hash[id as usize] = Some(hash);
        match self.cached.entry(hash) {
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(Copies::One(id));
            }
            std::collections::hash_map::Entry::Occupied(mut e) => {
                let copies = e.get_mut();
                match copies {
                    Copies::One(first) => *copies = Copies::Many(vec![*first, id]),
                    Copies::Many(ids) => ids.push(id),
                }
            }
        }
        true
    }

    /// Notes one `BlockStored` event for a run of blocks committed together
    /// (`hashes` in order, chained on `parent`, holding `tokens`), when
    /// recording.
    pub fn note_stored(
        &mut self,
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u32>,
        block_size: usize,
    ) {
        if hashes.is_empty() {
            return;
        }
        if let Some(events) = &mut self.events {
            events.push(KvEvent::BlockStored {
                block_hashes: hashes.into_iter().map(BlockKey).collect(),
                parent_block_hash: parent.map(BlockKey),
                token_ids: tokens,
                block_size,
                lora_name: None,
                medium: Some("GPU".into()),
                extra_keys: Vec::new(),
            });
        }
    }

    /// Removes block `id` from the copies of `hash`.
    fn uncache(&mut self, hash: u64, id: BlockId) {
        let std::collections::hash_map::Entry::Occupied(mut e) = self.cached.entry(hash) else {
            return;
        };
        match e.get_mut() {
            Copies::One(only) => {
                if *only == id {
                    e.remove();
                }
            }
            Copies::Many(ids) => {
                ids.retain(|&b| b != id);
                if ids.is_empty() {
                    e.remove();
                }
            }
        }
    }

    /// The free queue from head (next to be taken) to tail.
    pub fn free_order(&self) -> Vec<BlockId> {
        let mut out = Vec::with_capacity(self.num_free);
        let mut cur = self.head;
        while cur != NIL {
            out.push(cur);
            cur = self.next[cur as usize];
        }
        out
    }

    fn unlink(&mut self, id: BlockId) {
        let (p, n) = (self.prev[id as usize], self.next[id as usize]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[id as usize] = NIL;
        self.next[id as usize] = NIL;
        self.num_free -= 1;
    }

    fn push_head(&mut self, id: BlockId) {
        self.prev[id as usize] = NIL;
        self.next[id as usize] = self.head;
        if self.head == NIL {
            self.tail = id;
        } else {
            self.prev[self.head as usize] = id;
        }
        self.head = id;
        self.num_free += 1;
    }

    fn push_tail(&mut self, id: BlockId) {
        self.prev[id as usize] = self.tail;
        self.next[id as usize] = NIL;
        if self.tail == NIL {
            self.head = id;
        } else {
            self.next[self.tail as usize] = id;
        }
        self.tail = id;
        self.num_free += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cached(p: &mut BlockPool, id: BlockId, hash: u64) {
        assert!(p.commit(id, hash));
    }

    #[test]
    fn chained_hash_depends_on_parent() {
        let a = block_hash(None, &[1, 2, 3]);
        assert_eq!(a, block_hash(None, &[1, 2, 3]));
        assert_ne!(block_hash(Some(a), &[4]), block_hash(Some(a ^ 1), &[4]));
        assert_ne!(a, block_hash(None, &[1, 2, 4]));
    }

    #[test]
    fn allocate_until_empty_then_none() {
        let mut p = BlockPool::new(3);
        let ids: Vec<_> = (0..3).map(|_| p.allocate().unwrap()).collect();
        assert_eq!(ids, vec![0, 1, 2]);
        assert_eq!(p.allocate(), None);
        assert_eq!(p.usage(), 1.0);
        p.free(1);
        assert_eq!(p.num_free(), 1);
        assert_eq!(p.allocate(), Some(1));
    }

    #[test]
    fn freed_blocks_keep_hash_and_hit_revives() {
        let mut p = BlockPool::new(4);
        let b = p.allocate().unwrap();
        cached(&mut p, b, 42);
        p.free(b);
        assert_eq!(p.num_free(), 4);
        assert_eq!(p.lookup(42), Some(b));
        p.acquire(b);
        assert_eq!(p.num_free(), 3);
        assert!(!p.free_order().contains(&b));
        p.free(b);
        assert_eq!(
            *p.free_order().last().unwrap(),
            b,
            "cached blocks go to the tail"
        );
    }

    #[test]
    fn lru_eviction_takes_least_recently_freed_first() {
        let mut p = BlockPool::new(4);
        let ids: Vec<_> = (0..4).map(|_| p.allocate().unwrap()).collect();
        for (i, &id) in ids.iter().enumerate() {
            cached(&mut p, id, 100 + i as u64);
        }
        // Free in the order 2, 0, 3, 1: that is the eviction order.
        for i in [2, 0, 3, 1] {
            p.free(ids[i]);
        }
        assert_eq!(p.free_order(), vec![2, 0, 3, 1]);
        assert_eq!(p.allocate(), Some(2));
        assert_eq!(p.lookup(102), None, "the evicted hash is gone");
        assert_eq!(p.lookup(100), Some(0));
        // A hit on block 0 protects it: the next victim is 3.
        p.acquire(0);
        assert_eq!(p.allocate(), Some(3));
        assert_eq!(p.evictions(), 2);
        assert_eq!(p.lookup(101), Some(1));
    }

    #[test]
    fn anonymous_blocks_are_reused_before_cached_ones_are_evicted() {
        // A request of three blocks, the last one partly filled (no hash),
        // freed last block first as vLLM frees them.
        let mut p = BlockPool::new(5);
        let ids: Vec<_> = (0..3).map(|_| p.allocate().unwrap()).collect();
        cached(&mut p, ids[0], 10);
        cached(&mut p, ids[1], 11);
        p.free_blocks(ids.iter().rev().copied());
        // The partial block to the head, the leaf (11) before its parent (10).
        assert_eq!(p.free_order(), vec![2, 3, 4, 1, 0]);
        assert_eq!(p.allocate(), Some(2));
        assert_eq!(p.evictions(), 0, "no cached block was touched");
        // Several anonymous blocks freed together keep their order at the head.
        let more: Vec<_> = (0..2).map(|_| p.allocate().unwrap()).collect();
        p.free_blocks([more[1], more[0], 2]);
        assert_eq!(p.free_order(), vec![4, 3, 2, 1, 0]);
    }

    #[test]
    fn events_follow_commits_and_evictions() {
        let mut p = BlockPool::new(2);
        p.record_events();
        let (a, b) = (p.allocate().unwrap(), p.allocate().unwrap());
        cached(&mut p, a, 7);
        cached(&mut p, b, 8);
        p.note_stored(vec![7, 8], None, vec![1, 2, 3, 4], 2);
        p.note_stored(Vec::new(), Some(8), Vec::new(), 2); // nothing new: no event
        p.free_blocks([b, a]);
        let stored = p.take_events();
        assert_eq!(stored.len(), 1, "{stored:?}");
        assert!(matches!(
            &stored[0],
            KvEvent::BlockStored { block_hashes, parent_block_hash: None, token_ids, block_size: 2, .. }
                if block_hashes == &[BlockKey(7), BlockKey(8)] && token_ids == &[1, 2, 3, 4]
        ));
        p.allocate().unwrap(); // evicts b's hash 8 (the leaf, freed first)
        assert_eq!(
            p.take_events(),
            vec![KvEvent::BlockRemoved {
                block_hashes: vec![BlockKey(8)],
                medium: Some("GPU".into())
            }]
        );
        assert!(p.take_events().is_empty());
    }

    #[test]
    fn duplicate_content_is_cached_twice_and_the_oldest_copy_is_found() {
        let mut p = BlockPool::new(3);
        let (a, b) = (p.allocate().unwrap(), p.allocate().unwrap());
        cached(&mut p, a, 7);
        cached(&mut p, b, 7);
        assert!(!p.commit(b, 9), "a block commits once");
        assert_eq!(p.lookup(7), Some(a));
        p.free(a);
        p.free(b);
        assert_eq!(p.allocate(), Some(2), "the never-used block first");
        assert_eq!(p.allocate(), Some(a));
        assert_eq!(p.lookup(7), Some(b), "the other copy stays cached");
        assert_eq!(p.allocate(), Some(b));
        assert_eq!(p.lookup(7), None);
        assert_eq!(p.evictions(), 2);
    }
}

//! An approximate record of what each replica holds in its prefix cache:
//! the block hashes llmlb recently sent it, in a bounded LRU.
//!
//! It is approximate in both directions: the replica may have evicted a
//! block llmlb still lists (its cache is smaller, or other clients used it),
//! and it may hold blocks sent by someone else. Bounding the index to the
//! replica's KV capacity keeps the first error small: the index holds at
//! most `max_blocks_per_replica` blocks, and no more than the replica
//! reports room for (`vllm:cache_config_info`, [`BlockIndex::fit`]), so a
//! replica whose cache holds three system prompts is not listed with ten.
//! A prompt's blocks are listed last block first, so when the index is full
//! the tails of older prompts go before their shared beginnings, as in
//! vLLM, which frees a finished request's blocks tail first. The scoring
//! treats a match as "probably cached", never as a promise.
//!
//! A replica that restarts loses its cache: the scrape loop sees its
//! cumulative `prefix_cache_queries` counter go down and counts a restart
//! ([`crate::replica::restart`]), and the index clears itself at its next
//! check. A
//! replica removed from the config takes its index with it; one that stays
//! across a reload keeps it (the topology carries the `Arc` over).
//!
//! Memory: at most `capacity` entries (a hash map entry and a queue slot,
//! about 48 bytes each). Concurrency: one mutex per replica, held only for
//! the hash lookups of one request, never across an `.await`; requests to
//! different replicas never contend. (A lock-free structure would buy little:
//! lookups are a few hundred nanoseconds per request.)

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug)]
pub struct BlockIndex {
    inner: Mutex<Lru>,
    /// The replica cache size last given to [`BlockIndex::fit`], so that an
    /// unchanged one costs no lock.
    fitted: AtomicUsize,
}

#[derive(Debug)]
struct Lru {
    /// Block hash → stamp of its last use.
    stamps: HashMap<u64, u64>,
    /// Uses in order; entries whose stamp is outdated are skipped.
    order: VecDeque<(u64, u64)>,
    next: u64,
    /// Blocks listed at most now: `limit`, or less when the replica
    /// reports a smaller cache.
    capacity: usize,
    /// The configured bound.
    limit: usize,
    /// The replica's restart count at the last check.
    restarts_seen: Option<u64>,
}

impl BlockIndex {
    pub fn new(capacity: usize) -> BlockIndex {
        BlockIndex {
            inner: Mutex::new(Lru {
                stamps: HashMap::new(),
                order: VecDeque::new(),
                next: 0,
                capacity: capacity.max(1),
                limit: capacity.max(1),
                restarts_seen: None,
            }),
            fitted: AtomicUsize::new(usize::MAX),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        // A panic while holding the lock cannot leave the LRU inconsistent
        // in a way that matters (worst case: a stale entry), so carry on.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many leading blocks of `blocks` the replica probably holds.
    pub fn matched(&self, blocks: &[u64]) -> usize {
        let lru = self.lock();
        blocks
            .iter()
            .take_while(|h| lru.stamps.contains_key(h))
            .count()
    }

    /// Records that `blocks` were sent to the replica (most recent use;
    /// the first block the most recent of all).
    pub fn record(&self, blocks: &[u64]) {
        let mut lru = self.lock();
        for &h in blocks.iter().rev() {
            lru.touch(h);
        }
    }

    /// Bounds the index to a replica cache of `blocks` blocks (of the
    /// index's block size), within the configured bound; the least recently
    /// sent go first.
    pub fn fit(&self, blocks: usize) {
        if self.fitted.swap(blocks, Ordering::Relaxed) == blocks {
            return;
        }
        let mut lru = self.lock();
        // The latest size asked for, should two calls with different sizes
        // have crossed.
        let blocks = self.fitted.load(Ordering::Relaxed);
        let capacity = lru.limit.min(blocks).max(1);
        if capacity != lru.capacity {
            lru.capacity = capacity;
            lru.evict_over();
        }
    }

    /// Blocks the replica has room for before new ones evict cached ones:
    /// its reported cache less what is listed; `None` until a size was
    /// given to [`BlockIndex::fit`] (the configured bound says nothing of
    /// the replica).
    pub fn room(&self) -> Option<usize> {
        if self.fitted.load(Ordering::Relaxed) == usize::MAX {
            return None;
        }
        let lru = self.lock();
        Some(lru.capacity.saturating_sub(lru.stamps.len()))
    }

    /// Blocks currently listed.
    pub fn len(&self) -> usize {
        self.lock().stamps.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Feeds the replica's restart count (kept by the scrape loop); a
    /// change since the last check means the replica restarted, and the
    /// index is cleared. Returns whether it was.
    pub fn observe_restarts(&self, count: u64) -> bool {
        let mut lru = self.lock();
        let reset = restart_seen(&mut lru.restarts_seen, count);
        if reset {
            lru.stamps.clear();
            lru.order.clear();
        }
        reset
    }
}

/// Feeds a replica's restart count into `seen`: whether it changed since
/// the last check. The first check only sets the reference.
pub fn restart_seen(seen: &mut Option<u64>, count: u64) -> bool {
    let reset = seen.is_some_and(|s| s != count);
    *seen = Some(count);
    reset
}

impl Lru {
    fn touch(&mut self, h: u64) {
        let stamp = self.next;
        self.next += 1;
        self.stamps.insert(h, stamp);
        self.order.push_back((h, stamp));
        self.evict_over();
    }

    fn evict_over(&mut self) {
        while self.stamps.len() > self.capacity {
            let Some((old, s)) = self.order.pop_front() else {
                break;
            };
            if self.stamps.get(&old) == Some(&s) {
                self.stamps.remove(&old);
            }
        }
        // Re-used blocks leave outdated queue entries behind: compact when
        // they dominate, so the queue stays within a small multiple of capacity.
        if self.order.len() > 2 * self.capacity + 64 {
            let stamps = &self.stamps;
            self.order.retain(|(h, s)| stamps.get(h) == Some(s));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_leading_blocks_only() {
        let idx = BlockIndex::new(100);
        idx.record(&[1, 2, 3]);
        assert_eq!(idx.matched(&[1, 2, 3, 4]), 3);
        assert_eq!(idx.matched(&[1, 9, 3]), 1);
        assert_eq!(idx.matched(&[9, 1]), 0);
    }

    #[test]
    fn bounded_and_least_recently_used_go_first() {
        let idx = BlockIndex::new(4);
        idx.record(&[1, 2, 3, 4]);
        idx.record(&[3]); // 3 is now the most recent
        idx.record(&[5, 6]); // evicts 4 (a tail) and 2
        assert_eq!(idx.len(), 4);
        assert_eq!(idx.matched(&[1]), 1);
        assert_eq!(idx.matched(&[1, 2]), 1);
        assert_eq!(idx.matched(&[3]), 1);
        assert_eq!(idx.matched(&[4]), 0);
        assert_eq!(idx.matched(&[5, 6]), 2);
    }

    #[test]
    fn the_tail_of_a_prompt_goes_before_its_beginning() {
        // Two prompts sharing blocks 1, 2 and a third unrelated one, in an
        // index of 6: the first prompt's last block goes, the shared part
        // stays.
        let idx = BlockIndex::new(6);
        idx.record(&[1, 2, 3, 4]);
        idx.record(&[1, 2, 5]);
        idx.record(&[7, 8]);
        assert_eq!(idx.matched(&[1, 2, 3, 4]), 3);
        assert_eq!(idx.matched(&[1, 2, 5]), 3);
    }

    #[test]
    fn fitting_to_a_smaller_replica_cache_drops_the_oldest() {
        let idx = BlockIndex::new(100);
        idx.record(&[1, 2, 3]);
        idx.record(&[4, 5, 6]);
        idx.fit(4);
        assert_eq!(idx.len(), 4);
        assert_eq!(idx.matched(&[4, 5, 6]), 3);
        assert_eq!(idx.matched(&[1, 2, 3]), 1);
        // Never above the configured bound, and not below one block.
        idx.fit(1_000);
        idx.record(&(10..200).collect::<Vec<u64>>());
        assert_eq!(idx.len(), 100);
        idx.fit(0);
        assert_eq!(idx.len(), 1);
    }

    #[test]
    fn room_is_known_once_the_replica_reported_its_cache() {
        let idx = BlockIndex::new(100);
        idx.record(&[1, 2, 3]);
        assert_eq!(
            idx.room(),
            None,
            "the configured bound is not the replica's"
        );
        idx.fit(10);
        assert_eq!(idx.room(), Some(7));
        idx.record(&(10..30).collect::<Vec<u64>>());
        assert_eq!(idx.room(), Some(0));
    }

    #[test]
    fn queue_stays_bounded_under_reuse() {
        let idx = BlockIndex::new(8);
        for _ in 0..10_000 {
            idx.record(&[1, 2, 3]);
        }
        let lru = idx.lock();
        assert!(lru.order.len() <= 2 * 8 + 64 + 3);
        assert_eq!(lru.stamps.len(), 3);
    }

    #[test]
    fn a_restart_clears_the_index() {
        let idx = BlockIndex::new(16);
        idx.record(&[1, 2]);
        assert!(!idx.observe_restarts(0));
        assert!(!idx.observe_restarts(0));
        assert_eq!(idx.len(), 2);
        assert!(idx.observe_restarts(1));
        assert!(idx.is_empty());
    }
}

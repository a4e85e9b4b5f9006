//! The prompt blocks of the requests llmlb has in flight on one replica,
//! by the prefix index's block hashes: what part of a new prompt's cached
//! prefix is held by a request running there.
//!
//! A replica's free KV cache, as vLLM reports it, counts cached blocks no
//! running request uses: they are free until a request uses them again. So
//! a request whose cached prefix no running request carries takes those
//! blocks out of the free ones like any other; only a prefix a request in
//! flight there already carries takes no more room. The KV tokens counted
//! against a replica since its scrape leave out that shared part only.
//!
//! Memory: one map entry per distinct block of the prompts in flight
//! (about 16 bytes each). Concurrency: one mutex per replica, held for one
//! prompt's lookups or updates, never across an `.await`.

use std::collections::HashMap;
use std::sync::Mutex;

#[derive(Debug, Default)]
pub struct CarriedBlocks {
    /// Block hash → requests in flight whose prompt has it.
    blocks: Mutex<HashMap<u64, u32>>,
}

impl CarriedBlocks {
    /// How many leading blocks of `blocks` (a prompt's chained hashes) a
    /// request in flight carries.
    #[cfg(test)]
    pub fn leading(&self, blocks: &[u64]) -> usize {
        leading_in(&self.lock(), blocks)
    }

    /// A request carrying `blocks` is in flight. Returns how many leading
    /// blocks of them the requests already in flight carried (under the
    /// same lock, so the request never counts itself).
    pub fn add(&self, blocks: &[u64]) -> usize {
        let mut held = self.lock();
        let leading = leading_in(&held, blocks);
        for &b in blocks {
            *held.entry(b).or_insert(0) += 1;
        }
        leading
    }

    /// A request carrying `blocks` ended.
    pub fn remove(&self, blocks: &[u64]) {
        let mut held = self.lock();
        for b in blocks {
            if let Some(n) = held.get_mut(b) {
                *n -= 1;
                if *n == 0 {
                    held.remove(b);
                }
            }
        }
    }

    /// Whether no block is carried (tests).
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, u32>> {
        self.blocks.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn leading_in(held: &HashMap<u64, u32>, blocks: &[u64]) -> usize {
    if held.is_empty() {
        return 0;
    }
    blocks.iter().take_while(|b| held.contains_key(b)).count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_counts_while_some_request_carries_it() {
        let c = CarriedBlocks::default();
        assert_eq!(c.leading(&[1, 2, 3]), 0);
        assert_eq!(c.add(&[1, 2, 3]), 0);
        assert_eq!(c.add(&[1, 2, 4]), 2);
        // The shared system prompt (1, 2), then the first request's own block.
        assert_eq!(c.leading(&[1, 2, 5]), 2);
        assert_eq!(c.leading(&[1, 2, 3, 9]), 3);
        assert_eq!(c.leading(&[7, 1]), 0);
        c.remove(&[1, 2, 3]);
        assert_eq!(c.leading(&[1, 2, 3]), 2);
        c.remove(&[1, 2, 4]);
        assert_eq!(c.leading(&[1, 2, 4]), 0);
        assert!(c.is_empty());
    }
}

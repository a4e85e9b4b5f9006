//! What a balancer sees of a candidate: a copy of its numbers at pick time.
//!
//! Scraped values and the proxy's own counts are kept apart: a balancer that
//! needs scraped data checks [`ScrapedLoad::is_fresh`] for every candidate it
//! compares and, if any fails, compares them all by local counts instead.

use super::learned::Rates;
use super::state::{Replica, ReplicaId};

#[derive(Debug, Clone, Copy, Default)]
pub struct ReplicaView {
    pub id: ReplicaId,
    pub weight: u32,
    /// Requests this proxy has sent to the replica that have not finished.
    pub in_flight: u64,
    /// Estimated tokens still to process for those requests.
    pub outstanding_tokens: u64,
    /// Of those, requests without a first byte yet (prompt still ahead).
    pub prefilling: u64,
    /// Their prompt tokens predicted not cached there.
    pub uncached_prefill: u64,
    /// Output tokens still to stream for the others (past their first byte).
    pub decoding_output: u64,
    /// The replica's last scrape, when there is one.
    pub load: Option<ScrapedLoad>,
    /// Prefill and decode rates learned from its scrapes.
    pub rates: Rates,
}

impl ReplicaView {
    pub fn of(replica: &Replica) -> ReplicaView {
        ReplicaView::at(replica, crate::telemetry::clock::now_millis())
    }

    pub fn at(replica: &Replica, now_ms: u64) -> ReplicaView {
        ReplicaView {
            id: replica.id,
            weight: replica.weight,
            in_flight: replica.in_flight(),
            outstanding_tokens: replica.outstanding_tokens(),
            prefilling: replica.prefilling(),
            uncached_prefill: replica.uncached_prefill(),
            decoding_output: replica.decoding_output(),
            load: replica.scraped_load(now_ms),
            rates: replica.learned.rates(),
        }
    }

    /// The scraped load when it is no older than `max_age_ms`.
    pub fn fresh_load(&self, max_age_ms: u64) -> Option<&ScrapedLoad> {
        self.load.as_ref().filter(|l| l.is_fresh(max_age_ms))
    }
}

/// A scraped snapshot plus what this proxy has dispatched and completed on
/// the replica since it was taken.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ScrapedLoad {
    pub running: Option<u64>,
    pub waiting: Option<u64>,
    pub kv_usage: Option<f64>,
    pub kv_capacity_tokens: Option<u64>,
    pub age_ms: u64,
    pub dispatched_since: u64,
    pub completed_since: u64,
    /// llmlb's requests there whose first byte came since the scrape: none
    /// of them is waiting any more.
    pub first_bytes_since: u64,
    /// llmlb's requests there without a first byte at the scrape: those
    /// beyond the scraped queue were running (prefilling) then.
    pub prefilling_at_scrape: u64,
    pub tokens_since: u64,
}

impl ScrapedLoad {
    pub fn is_fresh(&self, max_age_ms: u64) -> bool {
        self.age_ms <= max_age_ms
    }

    /// The waiting queue now, estimated: the scraped queue plus what was sent
    /// since, minus what left it since. What left it: llmlb's requests
    /// whose first byte came beyond those that were already running at the
    /// scrape (llmlb's requests then without a first byte, less the scraped
    /// queue: a replica schedules in arrival order, so those answer first),
    /// or, when more, the requests that finished (each frees a running slot
    /// that a waiting request takes, on a replica whose slots are full).
    pub fn queue_now(&self) -> Option<u64> {
        let w = self.waiting?;
        let running_prefills = self.prefilling_at_scrape.saturating_sub(w);
        let scheduled = self.first_bytes_since.saturating_sub(running_prefills);
        let left = self.completed_since.max(scheduled);
        Some((w + self.dispatched_since).saturating_sub(left))
    }

    /// The replica's KV cache as the scrape left it, with what llmlb sent
    /// since: `None` when the usage is unknown, or the capacity is (the
    /// replica's reported capacity, else `fallback_capacity`).
    pub fn kv_room(&self, fallback_capacity: Option<u64>) -> Option<KvRoom> {
        Some(KvRoom {
            usage: self.kv_usage?,
            capacity: self.kv_capacity_tokens.or(fallback_capacity)?,
            tokens_since: self.tokens_since,
        })
    }

    /// Requests in the replica now, running or waiting, estimated likewise.
    pub fn in_system_now(&self) -> Option<u64> {
        let base = self.waiting.unwrap_or(0) + self.running.unwrap_or(0);
        (self.waiting.is_some() || self.running.is_some())
            .then(|| (base + self.dispatched_since).saturating_sub(self.completed_since))
    }
}

/// One model of a replica's KV cache, read two ways: as free tokens (by
/// cache-aware routing, to tell whether a prompt's uncached blocks fit) and
/// as projected usage (by `kv_aware`, against its threshold).
///
/// Every token llmlb sent since the scrape (prompt and expected output)
/// counts as still held, less the part of a prompt's predicted cached
/// prefix that a request in flight there carries (those blocks are in use
/// and shared, not taken again); which overestimates use slightly until
/// the next scrape. vLLM counts blocks holding only a cached prefix as
/// free, and so does this model: a request reusing such a prefix takes its
/// blocks out of the free ones. llmlb's requests the scrape could not see
/// yet (on their way, in the replica's API server) count as sent since.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KvRoom {
    /// Fraction in use at the scrape.
    pub usage: f64,
    /// Capacity in tokens.
    pub capacity: u64,
    /// Tokens llmlb sent since the scrape.
    pub tokens_since: u64,
}

impl KvRoom {
    /// Free tokens now: `capacity × (1 − usage) − tokens since`, at least 0.
    pub fn free_tokens(&self) -> u64 {
        let free = (self.capacity as f64 * (1.0 - self.usage)).max(0.0) as u64;
        free.saturating_sub(self.tokens_since)
    }

    /// Fraction in use once `extra` more tokens are placed:
    /// `usage + (tokens since + extra) / capacity` (a capacity of 0 counts as 1).
    pub fn projected_usage(&self, extra: u64) -> f64 {
        self.usage + (self.tokens_since + extra) as f64 / self.capacity.max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_now_loses_what_was_scheduled_or_made_room_for_since_the_scrape() {
        // (scraped queue, llmlb's requests then without a first byte), then
        // since the scrape: (sent, finished, first bytes).
        let scraped = |(waiting, prefilling_at_scrape), (sent, finished, first_bytes)| {
            ScrapedLoad {
                waiting: Some(waiting),
                prefilling_at_scrape,
                dispatched_since: sent,
                completed_since: finished,
                first_bytes_since: first_bytes,
                ..ScrapedLoad::default()
            }
            .queue_now()
        };
        // Two waited at the scrape and have had their first byte since.
        assert_eq!(scraped((2, 2), (0, 0, 2)), Some(0));
        // One was prefilling (running) at the scrape: its first byte is
        // not the queue's; the next one is.
        assert_eq!(scraped((2, 3), (0, 0, 1)), Some(2));
        assert_eq!(scraped((2, 3), (0, 0, 2)), Some(1));
        // One sent since, answered after the two ahead of it: none left.
        assert_eq!(scraped((2, 2), (1, 0, 3)), Some(0));
        // Finishes free slots a waiting request takes (a full replica).
        assert_eq!(scraped((3, 0), (0, 2, 0)), Some(1));
        // Both: whichever says more left (a first byte may be the slot a
        // finish freed).
        assert_eq!(scraped((3, 3), (0, 1, 2)), Some(1));
        // Other clients' requests wait there too: llmlb's first bytes
        // count as leaving it.
        assert_eq!(scraped((5, 2), (0, 0, 2)), Some(3));
        assert_eq!(ScrapedLoad::default().queue_now(), None);
    }

    #[test]
    fn free_tokens_and_projected_usage_read_one_model() {
        let load = ScrapedLoad {
            kv_usage: Some(0.25),
            kv_capacity_tokens: Some(10_000),
            tokens_since: 500,
            ..ScrapedLoad::default()
        };
        let room = load.kv_room(Some(1)).unwrap();
        assert_eq!(room.free_tokens(), 7_000);
        assert!((room.projected_usage(1_000) - 0.4).abs() < 1e-12);
        // Placing exactly the free tokens fills the cache.
        assert!((room.projected_usage(room.free_tokens()) - 1.0).abs() < 1e-12);
        // No reported capacity: the fallback, or nothing.
        let bare = ScrapedLoad {
            kv_capacity_tokens: None,
            ..load
        };
        assert_eq!(bare.kv_room(None), None);
        assert_eq!(bare.kv_room(Some(2_000)).unwrap().free_tokens(), 1_000);
        // More sent than was free: none left, usage past 1.
        let full = KvRoom {
            usage: 0.9,
            capacity: 1_000,
            tokens_since: 400,
        };
        assert_eq!(full.free_tokens(), 0);
        assert!(full.projected_usage(0) > 1.0);
    }
}

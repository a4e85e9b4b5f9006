//! When a replica is too busy for affinity: prefix and session affinity move
//! on to the next replica in the key's order, and a tier may overflow into
//! lower tiers' replicas.
//!
//! Saturated means any of: at its `max_inflight` limit; at or above
//! `saturation.max_in_flight` requests from llmlb; or a fresh scrape says
//! its waiting queue (corrected by what llmlb sent, saw answered and saw
//! finish since) is above `saturation.max_queue`, or its KV-cache usage
//! (plus the tokens llmlb sent since, as a fraction of the capacity the
//! replica reports) is at or above `saturation.max_kv_usage`. A stale or
//! missing scrape says nothing, so without scraping only the local bounds
//! apply.

use std::sync::Arc;

use crate::config::SaturationConfig;
use crate::replica::{Replica, ReplicaView, ScrapedLoad};

pub fn is_saturated(
    replica: &Replica,
    view: &ReplicaView,
    config: &SaturationConfig,
    max_age_ms: u64,
) -> bool {
    let fresh = view.fresh_load(max_age_ms);
    !replica.has_free_slot()
        || config.max_in_flight.is_some_and(|m| view.in_flight >= m)
        || fresh
            .and_then(|l| l.queue_now())
            .is_some_and(|q| q > config.max_queue)
        || config
            .max_kv_usage
            .zip(fresh)
            .is_some_and(|(m, l)| kv_usage_now(l).is_some_and(|u| u >= m))
}

/// The scraped KV usage with what llmlb sent since, when the replica reports
/// its capacity; the scraped usage alone when it does not.
fn kv_usage_now(load: &ScrapedLoad) -> Option<f64> {
    match load.kv_room(None) {
        Some(room) => Some(room.projected_usage(0)),
        None => load.kv_usage,
    }
}

/// Whether no eligible replica among `replicas` has room at `now_ms` (or
/// none is eligible): a tier pool's cue to overflow.
pub fn all_saturated(
    replicas: &[Arc<Replica>],
    config: &SaturationConfig,
    max_age_ms: u64,
    now_ms: u64,
) -> bool {
    !replicas.iter().any(|r| {
        r.is_eligible_at(now_ms)
            && !is_saturated(r, &ReplicaView::at(r, now_ms), config, max_age_ms)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(limit: Option<u32>) -> std::sync::Arc<Replica> {
        let gauge = prometheus::IntGauge::new("g", "g").unwrap();
        std::sync::Arc::new(
            Replica::new("r".into(), "127.0.0.1:1".parse().unwrap(), 1, gauge).with_limit(limit),
        )
    }

    #[test]
    fn each_bound_saturates() {
        let cfg = SaturationConfig {
            max_queue: 4,
            max_in_flight: Some(3),
            max_kv_usage: None,
        };
        let r = replica(None);
        let mut v = ReplicaView::of(&r);
        assert!(!is_saturated(&r, &v, &cfg, 1_000));
        v.in_flight = 3;
        assert!(is_saturated(&r, &v, &cfg, 1_000));
        v.in_flight = 0;
        v.load = Some(ScrapedLoad {
            waiting: Some(5),
            age_ms: 10,
            ..ScrapedLoad::default()
        });
        assert!(is_saturated(&r, &v, &cfg, 1_000));
        // Stale: says nothing.
        assert!(!is_saturated(&r, &v, &cfg, 5));
        let limited = replica(Some(1));
        let _g = limited.acquire();
        assert!(is_saturated(
            &limited,
            &ReplicaView::of(&limited),
            &SaturationConfig::default(),
            1_000
        ));
    }

    #[test]
    fn a_full_kv_cache_saturates_when_asked() {
        let cfg = SaturationConfig {
            max_kv_usage: Some(0.9),
            ..SaturationConfig::default()
        };
        let r = replica(None);
        let mut v = ReplicaView::of(&r);
        let scraped = |usage: f64, capacity: Option<u64>, tokens_since: u64, age_ms: u64| {
            Some(ScrapedLoad {
                waiting: Some(0),
                kv_usage: Some(usage),
                kv_capacity_tokens: capacity,
                tokens_since,
                age_ms,
                ..ScrapedLoad::default()
            })
        };
        // Usage alone when the capacity is unknown.
        v.load = scraped(0.89, None, 5_000, 10);
        assert!(!is_saturated(&r, &v, &cfg, 1_000));
        v.load = scraped(0.9, None, 0, 10);
        assert!(is_saturated(&r, &v, &cfg, 1_000));
        // With the capacity, what llmlb sent since counts: 0.8 + 1,000/10,000.
        v.load = scraped(0.8, Some(10_000), 999, 10);
        assert!(!is_saturated(&r, &v, &cfg, 1_000));
        v.load = scraped(0.8, Some(10_000), 1_000, 10);
        assert!(is_saturated(&r, &v, &cfg, 1_000));
        // Stale: says nothing; unset: never.
        assert!(!is_saturated(&r, &v, &cfg, 5));
        assert!(!is_saturated(&r, &v, &SaturationConfig::default(), 1_000));
    }
}

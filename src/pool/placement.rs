//! [`placement_ttft`]: what the pool queue's deadline admission asks of
//! the pool before a request queues: the time to first token it would have
//! on the best replica of its pool, in seconds, by the cache-aware cost
//! model (`routing::prefix::score`: wait for a batch slot, prefill of the
//! uncached tokens at the replica's learned prefill rate, else the pool's
//! prior, and the KV wait), minimised over the eligible replicas. It runs
//! before the request is routed, so no replica's cache is credited: the
//! whole prompt counts as uncached, which overstates the prefill of a
//! request that will hit a warm prefix. Cost: O(replicas).

use std::time::Duration;

use super::Pool;
use crate::admission::estimate::Placement;
use crate::replica::ReplicaView;
use crate::routing::prefix::score::requests_ahead;

/// The predicted time to first token of a `prompt_tokens`-token prompt,
/// nothing of it cached, on the eligible replica of `pool` where it is
/// shortest at `now_ms` (zero when no replica is eligible: the forwarder
/// answers that case).
pub fn placement_ttft(pool: &Pool, prompt_tokens: u64, now_ms: u64) -> Placement {
    let views: Vec<ReplicaView> = pool
        .eligible_at(now_ms)
        .iter()
        .map(|r| ReplicaView::at(r, now_ms))
        .collect();
    let ahead = requests_ahead(&views, pool.router.max_age_ms);
    let cost = &pool.router.cost;
    let best = views
        .iter()
        .zip(ahead)
        .map(|(v, a)| (cost.expected_ttft(a, &v.rates, prompt_tokens), v))
        .min_by(|a, b| a.0.total_cmp(&b.0));
    let Some((ttft, v)) = best else {
        return Placement::default();
    };
    Placement {
        ttft: Duration::from_secs_f64(ttft),
        prefill: Duration::from_secs_f64(cost.prefill_seconds(&v.rates, prompt_tokens)),
        replicas: views.len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::test_fleet::pool_of;

    #[test]
    fn placement_is_the_prefill_on_the_least_loaded_replica() {
        // Three replicas, no scrape: llmlb's own in-flight counts at the
        // pool's priors (10,000 prompt tokens/s, 0.02 s per request ahead).
        let t = pool_of("", 3);
        let pool = &t.pools()[0];
        let secs = |tokens| placement_ttft(pool, tokens, 0).ttft.as_secs_f64();
        assert!((secs(2_000) - 0.2).abs() < 1e-9, "{}", secs(2_000));
        let _busy: Vec<_> = pool.replicas[..2]
            .iter()
            .flat_map(|r| [r.acquire(), r.acquire()])
            .collect();
        // The idle third replica still sets the placement.
        assert!((secs(2_000) - 0.2).abs() < 1e-9);
        let _third = pool.replicas[2].acquire();
        // All busy: one request ahead on the best of them.
        assert!((secs(2_000) - 0.22).abs() < 1e-9, "{}", secs(2_000));
        assert!(secs(4_000) > secs(2_000));
    }
}

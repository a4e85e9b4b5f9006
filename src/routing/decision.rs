//! The routing stage's answer for one request, and how retries use it.
//!
//! A [`Decision`] holds the hard limits (`allowed`: canary version and tier),
//! the preference (`preferred`: session or prefix affinity), the branches
//! that acted, and what to remember once the request is sent (the prompt's
//! blocks in `cache` mode, its tokens in `exact` mode).
//!
//! [`Decision::narrow`] is the retry rule: candidates stay inside the
//! allowed set, and the preferred replicas are tried first while any of them
//! is left. Cost: O(candidates × log allowed) per narrowing (sorted ids,
//! binary search).
//!
//! [`placement_ttft`] is what the pool queue's deadline admission asks of
//! routing before a request queues: the time to first token it would have
//! on the best replica of its pool, in seconds, by the cache-aware cost
//! model ([`super::prefix::score`]: wait for a batch slot, prefill of the
//! uncached tokens at the replica's learned prefill rate, else the pool's
//! prior, and the KV wait), minimised over the eligible replicas. It runs
//! before the request is routed, so no replica's cache is credited: the
//! whole prompt counts as uncached, which overstates the prefill of a
//! request that will hit a warm prefix. Cost: O(replicas).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::prefix::cache_index::BlockIndex;
use super::prefix::held::{Expected, HeldBlocks};
use super::prefix::score::requests_ahead;
use super::{Pool, RouteBranch};
use crate::admission::estimate::Placement;
use crate::balancing::{Replica, ReplicaId, ReplicaView};

/// Each replica's prefix index (`cache` mode, and `exact` mode's estimate).
pub(super) type Indexes = Arc<HashMap<ReplicaId, Arc<BlockIndex>>>;
/// What each event-publishing replica reports holding (`exact` mode).
pub(super) type Held = Arc<HashMap<ReplicaId, Arc<HeldBlocks>>>;

/// The routing stage's answer for one request.
#[derive(Debug, Default)]
pub struct Decision {
    /// Only these replicas may serve the request (`None`: any). Sorted.
    pub allowed: Option<Vec<ReplicaId>>,
    /// Try these first (`None`: no preference). Sorted.
    pub preferred: Option<Vec<ReplicaId>>,
    /// Every step that acted, in order.
    pub branches: Vec<RouteBranch>,
    /// The canary version chosen, when the pool splits by version.
    pub version: Option<Arc<str>>,
    /// `cache` mode: the prompt's blocks, recorded on the replica it is sent to.
    pub(super) record: Option<(Indexes, Vec<u64>)>,
    /// `exact` mode: the prompt's tokens, expected on the replica it is sent
    /// to until its events report them.
    pub(super) expect: Option<(Held, Vec<u32>)>,
    /// Cached prompt tokens predicted per candidate (prefix modes but `off`).
    pub(super) predicted: Vec<(ReplicaId, u64)>,
}

impl Decision {
    /// The candidates the balancer may see: `eligible` limited to the
    /// allowed set, then to the preferred ones when any of them is left.
    pub fn narrow(&self, eligible: Vec<Arc<Replica>>) -> Vec<Arc<Replica>> {
        let allowed: Vec<Arc<Replica>> = match &self.allowed {
            Some(ids) => eligible
                .into_iter()
                .filter(|r| contains(ids, r.id))
                .collect(),
            None => eligible,
        };
        if let Some(pref) = &self.preferred
            && allowed.iter().any(|r| contains(pref, r.id))
        {
            return allowed
                .into_iter()
                .filter(|r| contains(pref, r.id))
                .collect();
        }
        allowed
    }

    /// Limits the allowed set to `ids` (sorted), intersecting with any
    /// limit an earlier step set.
    pub(super) fn allow_only(&mut self, ids: Vec<ReplicaId>) {
        self.allowed = Some(match self.allowed.take() {
            Some(prev) => prev.into_iter().filter(|id| contains(&ids, *id)).collect(),
            None => ids,
        });
    }

    /// The request is being sent to `replica` now: remember its prompt
    /// blocks there. In `exact` mode they count as held there while the
    /// returned handle lives: the caller keeps it until the request ends.
    #[must_use = "in exact mode the prompt counts as sent only while the handle lives"]
    pub fn dispatched(&self, replica: &Replica) -> Option<Expected> {
        // The prompt's cached part takes no new KV blocks there: the
        // request's in-flight guard counted the whole prompt.
        if let Some(cached) = self.predicted_for(replica.id) {
            replica.kv_tokens_shared(cached);
        }
        if let Some((indexes, blocks)) = &self.record
            && let Some(index) = indexes.get(&replica.id)
        {
            index.record(blocks);
        }
        let (held, tokens) = self.expect.as_ref()?;
        Some(held.get(&replica.id)?.expect_prompt(tokens))
    }

    /// The cached prompt tokens predicted for `id`, if it was a candidate.
    pub fn predicted_for(&self, id: ReplicaId) -> Option<u64> {
        self.predicted.iter().find(|(r, _)| *r == id).map(|p| p.1)
    }

    /// The branches as one tracing field.
    pub fn route_label(&self) -> String {
        super::branch::join(&self.branches)
    }
}

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

/// Membership in a sorted id list.
pub(super) fn contains(sorted: &[ReplicaId], id: ReplicaId) -> bool {
    sorted.binary_search(&id).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::test_fleet::pool_of;

    #[test]
    fn narrow_prefers_then_falls_back_to_allowed() {
        let t = pool_of("", 3);
        let ids: Vec<ReplicaId> = t.pools[0].replicas.iter().map(|r| r.id).collect();
        let d = Decision {
            allowed: Some(vec![ids[0], ids[1]]),
            preferred: Some(vec![ids[1]]),
            ..Decision::default()
        };
        let pick = |eligible: Vec<Arc<Replica>>| -> Vec<ReplicaId> {
            d.narrow(eligible).iter().map(|r| r.id).collect()
        };
        assert_eq!(pick(t.pools[0].eligible()), vec![ids[1]]);
        // The preferred replica was tried: the rest of the allowed set.
        let untried: Vec<Arc<Replica>> = t.pools[0]
            .eligible()
            .into_iter()
            .filter(|r| r.id != ids[1])
            .collect();
        assert_eq!(pick(untried), vec![ids[0]]);
    }

    #[test]
    fn placement_is_the_prefill_on_the_least_loaded_replica() {
        // Three replicas, no scrape: llmlb's own in-flight counts at the
        // pool's priors (10,000 prompt tokens/s, 0.02 s per request ahead).
        let t = pool_of("", 3);
        let pool = &t.pools[0];
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

    #[test]
    fn allow_only_intersects_with_an_earlier_limit() {
        let mut d = Decision::default();
        d.allow_only(vec![1, 2, 3]);
        d.allow_only(vec![2, 3, 4]);
        assert_eq!(d.allowed, Some(vec![2, 3]));
    }
}

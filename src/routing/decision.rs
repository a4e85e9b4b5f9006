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

use std::collections::HashMap;
use std::sync::Arc;

use super::RouteBranch;
use super::prefix::blocks::CacheKey;
use super::prefix::cache_index::BlockIndex;
use super::prefix::held::{Expected, HeldBlocks};
use crate::replica::{InFlightGuard, Replica, ReplicaId};

/// Each replica's prefix index (`cache` mode, and `exact` mode's estimate).
pub(super) type Indexes = Arc<HashMap<ReplicaId, Arc<BlockIndex>>>;
/// What each event-publishing replica reports holding (`exact` mode).
pub(super) type Held = Arc<HashMap<ReplicaId, Arc<HeldBlocks>>>;

/// `exact` mode: what a request's dispatch records on its replica.
#[derive(Debug)]
pub(super) struct Expect {
    pub held: Held,
    pub tokens: Vec<u32>,
    pub key: CacheKey,
    /// When the request should end, in the router's milliseconds.
    pub ends_ms: u64,
}

/// A prefix mode's record of the prompt: its blocks in the pool's index
/// hashes, of `block_size` tokens each.
#[derive(Debug)]
pub(super) struct Recorded {
    pub indexes: Indexes,
    pub blocks: Vec<u64>,
    pub block_size: usize,
}

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
    /// Prefix modes: the prompt's blocks, recorded on the replica it is
    /// sent to.
    pub(super) record: Option<Recorded>,
    /// `exact` mode: the prompt, expected on the replica it is sent to
    /// until its events report it or the request ends.
    pub(super) expect: Option<Expect>,
    /// Cached prompt tokens predicted per candidate (prefix modes but `off`).
    pub(super) predicted: Vec<(ReplicaId, u64)>,
    /// The scored pick (`cache` and `exact` modes) and its expected time
    /// to first token there, in seconds.
    pub(super) ttft: Option<(ReplicaId, f64)>,
    /// Why no prediction was made, when the prompt's cached prefix cannot
    /// be predicted exactly (the request is routed by load).
    pub unpredictable: Option<crate::tokenize::Unpredictable>,
    /// The LoRA adapter the request names, if it names one.
    pub adapter: Option<Arc<str>>,
    /// The request's kind in the closed-loop metrics: `adapter`, `tools`,
    /// `template_args` or `plain`.
    pub kind: &'static str,
    /// Under a fleet store: where the dispatch record goes for the other
    /// instances, with the prefix key in `hash` mode.
    pub(super) share: Option<(crate::fleet::PrefixOutbox, Option<u64>)>,
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
    /// blocks and its adapter there. The answer says whether the adapter
    /// swaps in and, in `exact` mode, holds what makes the prompt count as
    /// sent there: the caller keeps it until the request ends.
    #[must_use = "in exact mode the prompt counts as sent only while the answer lives"]
    pub fn dispatched(&self, replica: &Replica) -> Dispatched {
        let swap = self
            .adapter
            .as_deref()
            .is_some_and(|a| replica.adapters.sent(a) == crate::replica::adapters::Placement::Swap);
        if let Some(r) = &self.record
            && let Some(index) = r.indexes.get(&replica.id)
        {
            index.record(&r.blocks);
        }
        if let (Some((outbox, key)), Some(r)) = (&self.share, &self.record) {
            outbox.send(&replica.name, *key, &r.blocks);
        }
        let sent = self.expect.as_ref().and_then(|e| {
            e.held
                .get(&replica.id)
                .map(|h| h.expect_prompt(&e.tokens, &e.key, e.ends_ms))
        });
        Dispatched { swap, sent }
    }

    /// [`Self::dispatched`] to the replica of the request's in-flight
    /// `guard`, which then counts the prompt's predicted cached part out of
    /// the prefill queued there (it counted the whole prompt), and the part
    /// of it a request in flight there carries out of the KV tokens sent
    /// there; the guard carries the prompt's blocks until it drops.
    #[must_use = "in exact mode the prompt counts as sent only while the answer lives"]
    pub fn dispatched_with(&self, guard: &mut InFlightGuard) -> Dispatched {
        let sent = self.dispatched(guard.replica());
        if let Some(cached) = self.predicted_for(guard.replica().id) {
            guard.expect_cached(cached);
            if let Some(r) = &self.record {
                // The guard counted the whole prompt against the replica's
                // free KV cache; the part a request in flight there carries
                // takes no more room (a cached prefix no running request
                // uses is counted free by the replica, and is taken again).
                let carried = guard.carry(r.blocks.clone()) * r.block_size;
                guard.replica().kv_tokens_shared(cached.min(carried as u64));
            }
        }
        sent
    }

    /// The cached prompt tokens predicted for `id`, if it was a candidate.
    pub fn predicted_for(&self, id: ReplicaId) -> Option<u64> {
        self.predicted.iter().find(|(r, _)| *r == id).map(|p| p.1)
    }

    /// `id` is the cost model's pick, where it expects the first token
    /// after `ttft` seconds.
    pub(super) fn prefer_scored(&mut self, id: ReplicaId, ttft: f64) {
        self.preferred = Some(vec![id]);
        self.ttft = Some((id, ttft));
    }

    /// The expected time to first token, in seconds, when `id` is the
    /// replica the cost model picked.
    pub fn predicted_ttft_for(&self, id: ReplicaId) -> Option<f64> {
        self.ttft.filter(|t| t.0 == id).map(|t| t.1)
    }

    /// A decision that only predicts cached tokens (other modules' unit tests).
    #[cfg(test)]
    pub(crate) fn predicting(predicted: Vec<(ReplicaId, u64)>) -> Decision {
        Decision {
            predicted,
            ..Decision::default()
        }
    }

    /// The request's kind (see [`Decision::kind`]; `plain` when unset).
    pub fn kind_label(&self) -> &'static str {
        if self.kind.is_empty() {
            "plain"
        } else {
            self.kind
        }
    }

    /// The branches as one tracing field.
    pub fn route_label(&self) -> String {
        super::branch::join(&self.branches)
    }
}

/// What sending a request to a replica did (see [`Decision::dispatched`]).
#[derive(Debug)]
pub struct Dispatched {
    /// The request's adapter had to wait there for other adapters' running
    /// requests to drain (no slot was free).
    pub swap: bool,
    /// `exact` mode: the prompt counts as sent there while this lives.
    pub sent: Option<Expected>,
}

/// Membership in a sorted id list.
pub(super) fn contains(sorted: &[ReplicaId], id: ReplicaId) -> bool {
    sorted.binary_search(&id).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::test_fleet::pool_of;

    #[test]
    fn narrow_prefers_then_falls_back_to_allowed() {
        let t = pool_of("", 3);
        let ids: Vec<ReplicaId> = t.pools()[0].replicas.iter().map(|r| r.id).collect();
        let d = Decision {
            allowed: Some(vec![ids[0], ids[1]]),
            preferred: Some(vec![ids[1]]),
            ..Decision::default()
        };
        let pick = |eligible: Vec<Arc<Replica>>| -> Vec<ReplicaId> {
            d.narrow(eligible).iter().map(|r| r.id).collect()
        };
        assert_eq!(pick(t.pools()[0].eligible()), vec![ids[1]]);
        // The preferred replica was tried: the rest of the allowed set.
        let untried: Vec<Arc<Replica>> = t.pools()[0]
            .eligible()
            .into_iter()
            .filter(|r| r.id != ids[1])
            .collect();
        assert_eq!(pick(untried), vec![ids[0]]);
    }

    #[test]
    fn allow_only_intersects_with_an_earlier_limit() {
        let mut d = Decision::default();
        d.allow_only(vec![1, 2, 3]);
        d.allow_only(vec![2, 3, 4]);
        assert_eq!(d.allowed, Some(vec![2, 3]));
    }
}

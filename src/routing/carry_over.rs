//! A pool's prefix state and how it survives a reload: each replica's
//! prefix index (`cache` mode, and `exact` mode's estimate) and, in `exact`
//! mode, the record of what each event-publishing replica reports holding.
//!
//! A reload builds a new router; a replica that stays (same id) keeps its
//! index, and keeps its record while its event endpoints stay the same (its
//! subscriber writes into that record). Removed replicas' state is dropped.
//! A change of `max_blocks_per_replica` starts every index afresh.
//!
//! Cost: O(replicas) per reload; nothing on the request path.

use std::collections::HashMap;
use std::sync::Arc;

use super::decision::{Held, Indexes};
use super::prefix::cache_index::BlockIndex;
use super::prefix::held::HeldBlocks;
use super::prefix::hot::{HotPrefixes, HotSettings};
use crate::config::{PoolConfig, PrefixMode};
use crate::kv_events::subscriber::Endpoints;
use crate::replica::{Replica, ReplicaId};

/// What a pool's routing learns about its replicas' prefix caches.
#[derive(Debug, Default)]
pub struct PrefixState {
    capacity: usize,
    pub indexes: Indexes,
    /// `exact` mode: what each replica reports holding.
    pub held: Held,
    /// `exact` mode: where each event-publishing replica reports.
    pub kv_sources: Vec<(ReplicaId, Endpoints)>,
    /// `cache` and `exact` modes with `replicate` or `homes`: each prefix's
    /// demand, copies and home. Kept across a reload while its settings
    /// stay the same.
    pub hot: Option<Arc<HotPrefixes>>,
}

impl PrefixState {
    /// The state for `pc`'s `replicas`, carrying over from `previous` what
    /// still applies.
    pub fn build(
        pc: &PoolConfig,
        replicas: &[Arc<Replica>],
        previous: Option<&PrefixState>,
    ) -> PrefixState {
        let capacity = pc.prefix.max_blocks_per_replica;
        let mode = pc.prefix.mode;
        let previous = previous.filter(|p| p.capacity == capacity);
        // `hash` mode keeps an index too: it scores nothing with it, but
        // predicts from it what each replica will report cached.
        let indexes: HashMap<ReplicaId, Arc<BlockIndex>> = if matches!(
            mode,
            PrefixMode::Hash | PrefixMode::Cache | PrefixMode::Exact
        ) {
            replicas
                .iter()
                .map(|r| {
                    let kept = previous.and_then(|p| p.indexes.get(&r.id).cloned());
                    (
                        r.id,
                        kept.unwrap_or_else(|| Arc::new(BlockIndex::new(capacity))),
                    )
                })
                .collect()
        } else {
            HashMap::new()
        };
        // The subscriber tasks (started by the background supervisor) write
        // into these; a replica that stays with the same event source keeps
        // its record across a reload.
        let kv_sources: Vec<(ReplicaId, Endpoints)> = if mode == PrefixMode::Exact {
            replicas
                .iter()
                .zip(&pc.replicas)
                .filter_map(|(r, rc)| {
                    let events = rc.kv_events.clone()?;
                    let replay = rc.kv_events_replay.clone();
                    Some((r.id, Endpoints { events, replay }))
                })
                .collect()
        } else {
            Vec::new()
        };
        let held: HashMap<ReplicaId, Arc<HeldBlocks>> = kv_sources
            .iter()
            .map(|(id, ep)| {
                let kept = previous
                    .filter(|p| p.kv_sources.iter().any(|(pid, pep)| pid == id && pep == ep))
                    .and_then(|p| p.held.get(id).cloned());
                (
                    *id,
                    kept.unwrap_or_else(|| Arc::new(HeldBlocks::new(capacity))),
                )
            })
            .collect();
        // `hash` places by homes but never replicates.
        let scored = mode.scores_by_cost();
        let replicate = pc.prefix.replicate && scored;
        let tracked = replicate || (pc.prefix.homes && (scored || mode == PrefixMode::Hash));
        let hot = tracked.then(|| {
            let settings = HotSettings {
                replicate,
                homes: pc.prefix.homes,
                above: pc.prefix.replicate_above,
                hold_ms: pc.prefix.replicate_hold.as_millis() as u64,
            };
            previous
                .and_then(|p| p.hot.clone())
                .filter(|h| h.settings() == settings)
                .unwrap_or_else(|| Arc::new(HotPrefixes::new(settings)))
        });
        PrefixState {
            capacity,
            indexes: Arc::new(indexes),
            held: Arc::new(held),
            kv_sources,
            hot,
        }
    }
}

//! The routing stage of one pool: between the pool lookup and the balancer,
//! it narrows the candidate replicas and says why.
//!
//! In order, each step working on what the previous one left:
//! 1. **canary**: the request's version (forced by header, sticky by key, or
//!    random by weight) keeps only that version's replicas;
//! 2. **tiers**: the caller's tier keeps only its reserved replicas (or
//!    overflows into lower tiers' when saturated and allowed);
//! 3. **session affinity** (a session header, when enabled) or **prefix
//!    affinity** (`hash`, `cache` or `exact` mode) names a preferred replica.
//!    `exact` scores like `cache` but from the blocks each replica reports
//!    holding (its KV events, [`super::prefix::held`]); a replica whose
//!    events are unknown (not subscribed yet, or missed and not refilled) is
//!    scored from `cache` mode's estimate of what llmlb sent it, and a pick
//!    made on that basis records `prefix_estimated`.
//!
//! Steps 1–2 are hard limits ([`Decision::allowed`]): retries stay inside
//! them. Step 3 is a preference ([`Decision::preferred`]): the forwarder
//! tries it first and falls back to the allowed set on retry. The balancer
//! picks among what is left (a single preferred replica leaves it nothing
//! to choose).
//!
//! Pure apart from the prefix indexes (which learn what was sent where) and
//! the one random draw for requests without a sticky key, which the caller
//! passes in. Cost: O(replicas) plus, in `cache` and `exact` modes,
//! tokenizing the prompt once (`blocks::prompt_token_ids`, the one place a
//! request is tokenized for routing), hashing its blocks once per block size
//! in use and one index lookup per candidate.

use std::collections::HashMap;
use std::sync::Arc;

use http::{HeaderMap, HeaderName};

use super::RouteBranch;
use super::canary::{Canary, Choice, StickyKeys};
use super::metrics::RoutingMetrics;
use super::prefix::blocks::{Prompt, block_hashes, chained_hashes, exact_seed, prompt_token_ids};
use super::prefix::cache_index::BlockIndex;
use super::prefix::held::HeldBlocks;
use super::prefix::predict;
use super::prefix::rendezvous::{self, Node, hash64};
use super::prefix::score::{self, Candidate, CostModel};
use super::saturation::is_saturated;
use super::tiers::PoolTiers;
use crate::balancing::{Replica, ReplicaId, ReplicaView};
use crate::config::{Config, HashKey, PoolConfig, PrefixConfig, PrefixMode, SaturationConfig};
use crate::kv_events::subscriber::Endpoints;
use crate::tokenize::PromptTokenizer;

type Indexes = Arc<HashMap<ReplicaId, Arc<BlockIndex>>>;
type Held = Arc<HashMap<ReplicaId, Arc<HeldBlocks>>>;

#[derive(Debug)]
pub struct Router {
    pool: String,
    prefix: PrefixConfig,
    cost: CostModel,
    saturation: SaturationConfig,
    max_age_ms: u64,
    session_header: HeaderName,
    session_affinity: bool,
    canary: Option<Canary>,
    versions: HashMap<ReplicaId, Arc<str>>,
    nodes: HashMap<ReplicaId, Node>,
    indexes: Indexes,
    /// `exact` mode: what each replica reports holding, and where it reports.
    held: Held,
    kv_sources: Vec<(ReplicaId, Endpoints)>,
    tiers: PoolTiers,
    tokenizer: PromptTokenizer,
}

/// What the routing stage knows about a request.
#[derive(Debug, Clone, Copy)]
pub struct RouteInput<'a> {
    pub model: &'a str,
    pub user: Option<&'a str>,
    pub headers: &'a HeaderMap,
    pub tier: Option<&'a str>,
    pub prompt: Prompt<'a>,
    /// The prompt's token ids when the caller already has them from this
    /// pool's tokenizer ([`Router::prompt_tokens`]); else the router
    /// tokenizes when a mode needs tokens.
    pub tokens: Option<&'a [u32]>,
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
    /// `cache` mode: the prompt's blocks, recorded on the replica it is sent to.
    record: Option<(Indexes, Vec<u64>)>,
    /// `exact` mode: the prompt's tokens, expected on the replica it is sent
    /// to until its events report them.
    expect: Option<(Held, Vec<u32>)>,
    /// Cached prompt tokens predicted per candidate (prefix modes but `off`).
    predicted: Vec<(ReplicaId, u64)>,
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

    /// The request is being sent to `replica`: remember its prompt blocks there.
    pub fn dispatched(&self, replica: &Replica) {
        if let Some((indexes, blocks)) = &self.record
            && let Some(index) = indexes.get(&replica.id)
        {
            index.record(blocks);
        }
        if let Some((held, tokens)) = &self.expect
            && let Some(h) = held.get(&replica.id)
            && let Some(bs) = h.block_size()
        {
            let hashes = chained_hashes(exact_seed(), tokens, bs);
            h.expect(&hashes, crate::telemetry::clock::now_millis());
        }
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

impl Router {
    /// Builds a pool's router; the prefix index of every replica that was in
    /// `previous` is carried over, those of removed replicas are dropped.
    pub fn build(
        config: &Config,
        pc: &PoolConfig,
        replicas: &[Arc<Replica>],
        previous: Option<&Router>,
    ) -> Router {
        let capacity = pc.prefix.max_blocks_per_replica;
        let mode = pc.prefix.mode;
        let same_capacity = |p: &&Router| p.prefix.max_blocks_per_replica == capacity;
        let indexes: HashMap<ReplicaId, Arc<BlockIndex>> = if matches!(
            mode,
            PrefixMode::Hash | PrefixMode::Cache | PrefixMode::Exact
        ) {
            replicas
                .iter()
                .map(|r| {
                    let kept = previous
                        .filter(same_capacity)
                        .and_then(|p| p.indexes.get(&r.id).cloned());
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
                    .filter(same_capacity)
                    .filter(|p| p.kv_sources.iter().any(|(pid, pep)| pid == id && pep == ep))
                    .and_then(|p| p.held.get(id).cloned());
                (
                    *id,
                    kept.unwrap_or_else(|| Arc::new(HeldBlocks::new(capacity))),
                )
            })
            .collect();
        let versions = replicas
            .iter()
            .zip(&pc.replicas)
            .filter_map(|(r, rc)| rc.version.as_deref().map(|v| (r.id, Arc::from(v))))
            .collect();
        Router {
            pool: pc.name.clone(),
            prefix: pc.prefix.clone(),
            cost: CostModel {
                prefill_tokens_per_second: pc.prefix.prefill_tokens_per_second,
                seconds_per_request_ahead: pc.prefix.seconds_per_request_ahead,
            },
            saturation: pc.saturation.clone(),
            max_age_ms: pc.scrape.staleness.as_millis() as u64,
            session_header: HeaderName::from_bytes(pc.session.header.as_bytes())
                .expect("header name checked by config validation"),
            session_affinity: pc.session.affinity,
            canary: pc.canary.as_ref().map(|c| {
                let mut canary = Canary::new(c, &pc.name);
                canary.trusted = config.trusts_version_header();
                canary
            }),
            versions,
            nodes: replicas
                .iter()
                .map(|r| {
                    let node = Node {
                        name_hash: hash64(r.name.as_bytes()),
                        weight: r.weight,
                    };
                    (r.id, node)
                })
                .collect(),
            indexes: Arc::new(indexes),
            held: Arc::new(held),
            kv_sources,
            tiers: PoolTiers::build(config, replicas),
            tokenizer: pool_tokenizer(pc),
        }
    }

    /// The pool's tokenizer (the stand-in unless `[pools.tokenizer]` is set).
    pub fn tokenizer(&self) -> &PromptTokenizer {
        &self.tokenizer
    }

    /// The prompt's token ids as this pool's replicas compute them (see
    /// [`prompt_token_ids`]).
    pub fn prompt_tokens(&self, prompt: Prompt<'_>) -> Vec<u32> {
        prompt_token_ids(&self.tokenizer, prompt)
    }

    /// The request's tokens: the caller's, else tokenized now.
    fn tokens<'i>(&self, input: &RouteInput<'i>) -> std::borrow::Cow<'i, [u32]> {
        match input.tokens {
            Some(t) => std::borrow::Cow::Borrowed(t),
            None => std::borrow::Cow::Owned(self.prompt_tokens(input.prompt)),
        }
    }

    /// Whether no eligible replica among `replicas` has room.
    pub fn all_saturated(&self, replicas: &[Arc<Replica>], now_ms: u64) -> bool {
        !replicas.iter().any(|r| {
            r.is_eligible_at(now_ms)
                && !is_saturated(
                    r,
                    &ReplicaView::at(r, now_ms),
                    &self.saturation,
                    self.max_age_ms,
                )
        })
    }

    /// The prefix index of a replica (`cache` mode, and `exact` mode's
    /// estimate for replicas whose events are unknown).
    pub fn index(&self, id: ReplicaId) -> Option<&Arc<BlockIndex>> {
        self.indexes.get(&id)
    }

    /// What a replica reports holding (`exact` mode, replicas with `kv_events`).
    pub fn held(&self, id: ReplicaId) -> Option<&Arc<HeldBlocks>> {
        self.held.get(&id)
    }

    /// Each event-publishing replica's endpoints and the record its
    /// subscriber keeps (`exact` mode).
    pub fn kv_subscriptions(&self) -> Vec<(ReplicaId, Endpoints, Arc<HeldBlocks>)> {
        self.kv_sources
            .iter()
            .filter_map(|(id, ep)| Some((*id, ep.clone(), Arc::clone(self.held.get(id)?))))
            .collect()
    }

    /// Routes one request among the pool's `replicas`. `random` decides the
    /// version of a request without a sticky key. Err: a bad request (an
    /// unknown forced version).
    pub fn route(
        &self,
        replicas: &[Arc<Replica>],
        input: &RouteInput<'_>,
        random: u64,
        now_ms: u64,
        metrics: &RoutingMetrics,
    ) -> Result<Decision, String> {
        let mut d = Decision::default();
        let mut cands: Vec<Arc<Replica>> = replicas
            .iter()
            .filter(|r| r.is_eligible_at(now_ms))
            .cloned()
            .collect();
        let session = header(input.headers, &self.session_header);
        if let Some(canary) = &self.canary {
            let keys = StickyKeys {
                user: input.user,
                session,
                api_key: crate::gateway::keys::presented_key(input.headers),
            };
            let forced =
                header(input.headers, &canary.header).filter(|v| !v.is_empty() && canary.trusted);
            let choice = canary.choose(forced, &keys, random)?;
            let version = Arc::clone(choice.version());
            let mut ids: Vec<ReplicaId> = replicas
                .iter()
                .filter(|r| self.versions.get(&r.id) == Some(&version))
                .map(|r| r.id)
                .collect();
            ids.sort_unstable();
            let forced = matches!(choice, Choice::Forced(_));
            if forced || cands.iter().any(|r| contains(&ids, r.id)) {
                cands.retain(|r| contains(&ids, r.id));
                d.allowed = Some(ids);
                d.version = Some(version);
                d.branches.push(match choice {
                    Choice::Forced(_) => RouteBranch::VersionForced,
                    Choice::Sticky(..) => RouteBranch::Canary,
                    Choice::Random(_) => RouteBranch::CanaryRandom,
                });
            } else {
                d.branches.push(RouteBranch::CanaryFallback);
            }
        }
        let views: HashMap<ReplicaId, ReplicaView> = cands
            .iter()
            .map(|r| (r.id, ReplicaView::at(r, now_ms)))
            .collect();
        let saturated = |r: &Replica| {
            views
                .get(&r.id)
                .is_some_and(|v| is_saturated(r, v, &self.saturation, self.max_age_ms))
        };
        let (tier_ids, tier_branch) = self.tiers.select(input.tier, &cands, saturated);
        if let Some(mut ids) = tier_ids {
            ids.sort_unstable();
            cands.retain(|r| contains(&ids, r.id));
            d.allowed = Some(match d.allowed.take() {
                Some(prev) => prev.into_iter().filter(|id| contains(&ids, *id)).collect(),
                None => ids,
            });
        }
        d.branches.extend(tier_branch);
        if cands.is_empty() {
            return Ok(d);
        }
        if self.session_affinity
            && let Some(s) = session.filter(|s| !s.is_empty())
        {
            let key = hash64(s.as_bytes());
            self.prefer_by_rendezvous(&mut d, &cands, key, &saturated, RouteBranch::Session);
            return Ok(d);
        }
        match self.prefix.mode {
            PrefixMode::Off => {}
            PrefixMode::Hash => {
                match self.hash_key(input) {
                    Some(key) => self.prefer_by_rendezvous(
                        &mut d,
                        &cands,
                        key,
                        &saturated,
                        RouteBranch::PrefixHit,
                    ),
                    None => d.branches.push(RouteBranch::PrefixNone),
                }
                let (bs, tokens) = (self.prefix.block_size, self.tokens(input));
                let blocks = block_hashes(input.model, &tokens, bs);
                d.predicted = predict::from_sent(&self.indexes, &cands, &blocks, tokens.len(), bs);
                d.record = Some((Arc::clone(&self.indexes), blocks));
            }
            PrefixMode::Cache | PrefixMode::Exact => {
                self.prefer_by_cache(&mut d, &cands, &views, input, now_ms, metrics)
            }
        }
        Ok(d)
    }

    /// `hash` mode's key: the system prompt, else the first tokens.
    fn hash_key(&self, input: &RouteInput<'_>) -> Option<u64> {
        let mut bytes = input.model.as_bytes().to_vec();
        bytes.push(0);
        match (self.prefix.key, input.prompt.system()) {
            (HashKey::System, Some(system)) => bytes.extend_from_slice(system.as_bytes()),
            _ => {
                let tokens = self.tokens(input);
                if tokens.is_empty() {
                    return None;
                }
                for t in tokens.iter().take(self.prefix.tokens) {
                    bytes.extend_from_slice(&t.to_le_bytes());
                }
            }
        }
        Some(hash64(&bytes))
    }

    /// Prefers the key's first unsaturated replica in rendezvous order.
    fn prefer_by_rendezvous(
        &self,
        d: &mut Decision,
        cands: &[Arc<Replica>],
        key: u64,
        saturated: &dyn Fn(&Replica) -> bool,
        hit: RouteBranch,
    ) {
        let nodes: Vec<Node> = cands.iter().map(|r| self.nodes[&r.id]).collect();
        match rendezvous::first_acceptable(key, &nodes, |i| !saturated(&cands[i])) {
            Some((i, rank)) => {
                d.preferred = Some(vec![cands[i].id]);
                d.branches.push(match (hit, rank) {
                    (RouteBranch::Session, 0) => RouteBranch::Session,
                    (RouteBranch::Session, _) => RouteBranch::SessionOverflow,
                    (_, 0) => RouteBranch::PrefixHit,
                    _ => RouteBranch::PrefixOverflow,
                });
            }
            None => d.branches.push(RouteBranch::Saturated),
        }
    }

    /// `cache` and `exact` modes: the candidate with the lowest expected
    /// time to first token, given the prompt tokens each probably holds.
    fn prefer_by_cache(
        &self,
        d: &mut Decision,
        cands: &[Arc<Replica>],
        views: &HashMap<ReplicaId, ReplicaView>,
        input: &RouteInput<'_>,
        now_ms: u64,
        metrics: &RoutingMetrics,
    ) {
        let block = self.prefix.block_size;
        let tokens = self.tokens(input);
        let blocks = block_hashes(input.model, &tokens, block);
        if blocks.is_empty() {
            d.branches.push(RouteBranch::PrefixNone);
            return;
        }
        let holdings = Holdings::new(self, &tokens, &blocks, cands, now_ms, metrics);
        d.predicted = holdings.predicted.clone();
        // A replica at its concurrency limit cannot take the request now,
        // however warm: score only those with a free slot, if any has one.
        let with_slot: Vec<Arc<Replica>> = cands
            .iter()
            .filter(|r| r.has_free_slot())
            .cloned()
            .collect();
        // What the full replicas hold, to tell an overflow from a miss.
        let held_by_full = if with_slot.is_empty() {
            0
        } else {
            cands
                .iter()
                .filter(|r| !r.has_free_slot())
                .map(|r| holdings.cached_tokens(r.id).0)
                .max()
                .unwrap_or(0)
        };
        let cands: &[Arc<Replica>] = if with_slot.is_empty() {
            cands
        } else {
            &with_slot
        };
        let ordered: Vec<ReplicaView> = cands.iter().map(|r| views[&r.id]).collect();
        let ahead = score::requests_ahead(&ordered, self.max_age_ms);
        let nodes: Vec<Node> = cands.iter().map(|r| self.nodes[&r.id]).collect();
        // Tie-break order: rendezvous on the chained hash of the prompt's
        // first `prefix.tokens` tokens, so cold instances agree per prefix
        // and prefixes that share only the chat template still spread.
        let lead = (self.prefix.tokens / block).clamp(1, blocks.len());
        let order = rendezvous::order(blocks[lead - 1], &nodes);
        let mut rank = vec![0; cands.len()];
        for (pos, &i) in order.iter().enumerate() {
            rank[i] = pos;
        }
        let cached: Vec<(u64, bool)> = cands.iter().map(|r| holdings.cached_tokens(r.id)).collect();
        let scored: Vec<Candidate> = (0..cands.len())
            .map(|i| Candidate {
                ahead: ahead[i],
                rates: ordered[i].rates,
                cached_tokens: cached[i].0,
                rank: rank[i],
            })
            .collect();
        let Some((i, _)) = score::best(&self.cost, tokens.len() as u64, &scored) else {
            return;
        };
        let most = cached
            .iter()
            .map(|c| c.0)
            .max()
            .unwrap_or(0)
            .max(held_by_full);
        d.branches.push(if most == 0 {
            RouteBranch::PrefixMiss
        } else if cached[i].0 == most {
            RouteBranch::PrefixHit
        } else {
            RouteBranch::PrefixOverflow
        });
        if cached[i].1 {
            d.branches.push(RouteBranch::PrefixEstimated);
        }
        d.preferred = Some(vec![cands[i].id]);
        d.record = Some((Arc::clone(&self.indexes), blocks));
        if self.prefix.mode == PrefixMode::Exact {
            d.expect = Some((Arc::clone(&self.held), tokens.into_owned()));
        }
    }
}

/// The prompt tokens each candidate probably holds: from its KV events in
/// `exact` mode when they are known, else from what llmlb sent it. Checks
/// each replica's restart counter on the way.
struct Holdings {
    /// Replica → (cached tokens, estimated rather than reported).
    by_replica: HashMap<ReplicaId, (u64, bool)>,
    /// What each replica should report cached (see [`predict::cap`]).
    predicted: Vec<(ReplicaId, u64)>,
}

impl Holdings {
    fn new(
        router: &Router,
        tokens: &[u32],
        blocks: &[u64],
        cands: &[Arc<Replica>],
        now_ms: u64,
        metrics: &RoutingMetrics,
    ) -> Holdings {
        let exact = router.prefix.mode == PrefixMode::Exact;
        // Exact-mode hashes, once per block size the replicas report.
        let mut by_size: Vec<(usize, Vec<u64>)> = Vec::new();
        let mut by_replica = HashMap::new();
        let mut predicted = Vec::with_capacity(cands.len());
        for r in cands {
            let counter = r.load_snapshot().and_then(|s| s.prefix_cache_queries);
            let held = router.held.get(&r.id);
            let index = router.indexes.get(&r.id);
            let restarted = held.is_some_and(|h| h.observe_counter(counter))
                | index.is_some_and(|i| i.observe_counter(counter));
            if restarted {
                metrics
                    .index_resets
                    .with_label_values(&[&router.pool, &r.name])
                    .inc();
                tracing::info!(pool = %router.pool, replica = %r.name, "replica restarted: its prefix index was cleared");
            }
            let reported = held
                .filter(|h| h.known())
                .and_then(|h| Some((h, h.block_size()?)));
            let value = match reported {
                Some((h, bs)) => {
                    let pos = match by_size.iter().position(|(s, _)| *s == bs) {
                        Some(p) => p,
                        None => {
                            by_size.push((bs, chained_hashes(exact_seed(), tokens, bs)));
                            by_size.len() - 1
                        }
                    };
                    (
                        (h.matched_at(&by_size[pos].1, now_ms) * bs) as u64,
                        false,
                        bs,
                    )
                }
                None => {
                    let (matched, bs) = (
                        index.map_or(0, |i| i.matched(blocks)),
                        router.prefix.block_size,
                    );
                    ((matched * bs) as u64, exact, bs)
                }
            };
            predicted.push((r.id, predict::cap(value.0, tokens.len(), value.2)));
            by_replica.insert(r.id, (value.0, value.1));
        }
        Holdings {
            by_replica,
            predicted,
        }
    }

    fn cached_tokens(&self, id: ReplicaId) -> (u64, bool) {
        self.by_replica.get(&id).copied().unwrap_or((0, false))
    }
}

/// The tokenizer named by `[pools.tokenizer]` (validated when the config
/// was loaded; loaded once and shared while its files are unchanged).
fn pool_tokenizer(pc: &PoolConfig) -> PromptTokenizer {
    let Some(t) = &pc.tokenizer else {
        return PromptTokenizer::StandIn;
    };
    PromptTokenizer::load(&t.dir).unwrap_or_else(|e| {
        tracing::error!(pool = %pc.name, error = %e, "tokenizer unusable since validation; using the stand-in");
        PromptTokenizer::StandIn
    })
}

/// Membership in a sorted id list.
fn contains(sorted: &[ReplicaId], id: ReplicaId) -> bool {
    sorted.binary_search(&id).is_ok()
}

fn header<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::AdmissionMetrics;
    use crate::routing::Topology;
    use crate::telemetry::Metrics;
    use crate::tokenize::ChatMessage;

    fn topology(text: &str) -> (Topology, RoutingMetrics) {
        let config = crate::config::parse(text).unwrap();
        let metrics = Metrics::new();
        let admission = AdmissionMetrics::new(metrics.registry());
        let routing = RoutingMetrics::new(metrics.registry());
        (
            Topology::build(&config, &metrics, &admission, None),
            routing,
        )
    }

    fn replicas(n: usize, extra: impl Fn(usize) -> String) -> String {
        (0..n)
            .map(|i| {
                format!(
                    "[[pools.replicas]]\nurl = \"http://127.0.0.1:{}\"\nname = \"r{i}\"\n{}\n",
                    i + 1,
                    extra(i)
                )
            })
            .collect()
    }

    fn input<'a>(
        headers: &'a HeaderMap,
        user: Option<&'a str>,
        prompt: Prompt<'a>,
    ) -> RouteInput<'a> {
        RouteInput {
            model: "m",
            user,
            headers,
            tier: None,
            prompt,
            tokens: None,
        }
    }

    /// Routes `chat` in `pool` and sends it to the preferred replica.
    fn dispatch_chat<'p>(
        pool: &'p crate::routing::Pool,
        chat: &[ChatMessage],
        metrics: &RoutingMetrics,
    ) -> &'p Arc<Replica> {
        let headers = HeaderMap::new();
        let d = pool
            .router
            .route(
                &pool.replicas,
                &input(&headers, None, Prompt::Chat(chat)),
                0,
                1,
                metrics,
            )
            .unwrap();
        let id = d.preferred.as_ref().unwrap()[0];
        let r = pool.replicas.iter().find(|r| r.id == id).unwrap();
        d.dispatched(r);
        r
    }

    #[test]
    fn canary_falls_back_when_the_version_is_down_but_forced_does_not() {
        let text = format!(
            "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n[pools.canary]\nweights = {{ v1 = 0, v2 = 100 }}\n{}",
            replicas(2, |i| format!("version = \"v{}\"", i + 1))
        );
        let (t, metrics) = topology(&text);
        let pool = &t.pools[0];
        let headers = HeaderMap::new();
        let d = pool
            .router
            .route(
                &pool.replicas,
                &input(&headers, Some("u"), Prompt::Text("x")),
                0,
                1,
                &metrics,
            )
            .unwrap();
        assert_eq!(d.branches, vec![RouteBranch::Canary]);
        assert_eq!(d.allowed, Some(vec![pool.replicas[1].id]));
        for _ in 0..3 {
            pool.replicas[1].health.record(false, 3, 2);
        }
        let d = pool
            .router
            .route(
                &pool.replicas,
                &input(&headers, Some("u"), Prompt::Text("x")),
                0,
                1,
                &metrics,
            )
            .unwrap();
        assert_eq!(d.branches, vec![RouteBranch::CanaryFallback]);
        assert_eq!(d.allowed, None);
        let mut forced = HeaderMap::new();
        forced.insert("x-llmlb-version", "v2".parse().unwrap());
        let d = pool
            .router
            .route(
                &pool.replicas,
                &input(&forced, Some("u"), Prompt::Text("x")),
                0,
                1,
                &metrics,
            )
            .unwrap();
        assert_eq!(d.branches, vec![RouteBranch::VersionForced]);
        assert!(d.narrow(pool.eligible()).is_empty());
    }

    #[test]
    fn cache_mode_prefers_warm_until_its_queue_costs_more_than_the_prefill() {
        let text = format!(
            "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n[pools.prefix]\nmode = \"cache\"\n{}",
            replicas(2, |_| String::new())
        );
        let (t, metrics) = topology(&text);
        let pool = &t.pools[0];
        let headers = HeaderMap::new();
        let long = "All answers must be in formal English and cite the policy section. ".repeat(60);
        let chat = vec![
            ChatMessage::new("system", long),
            ChatMessage::new("user", "hello"),
        ];
        let route = || {
            pool.router
                .route(
                    &pool.replicas,
                    &input(&headers, None, Prompt::Chat(&chat)),
                    0,
                    1,
                    &metrics,
                )
                .unwrap()
        };
        let first = route();
        assert_eq!(first.branches, vec![RouteBranch::PrefixMiss]);
        let home = first.preferred.clone().unwrap()[0];
        let home_replica = pool.replicas.iter().find(|r| r.id == home).unwrap();
        first.dispatched(home_replica);
        let d = route();
        assert_eq!(
            (d.branches.clone(), d.preferred.clone()),
            (vec![RouteBranch::PrefixHit], Some(vec![home]))
        );
        // Load the warm replica until a cold one is faster.
        let mut guards = Vec::new();
        let overflowed = loop {
            guards.push(home_replica.acquire());
            let d = route();
            if d.preferred != Some(vec![home]) {
                break d;
            }
            assert!(guards.len() < 200, "never overflowed");
        };
        assert_eq!(overflowed.branches, vec![RouteBranch::PrefixOverflow]);
        // The cached blocks save `cached / 10,000` s of prefill; each request
        // ahead costs 0.02 s: the warm replica loses at the first count whose
        // queue costs at least that much (ties go by rendezvous rank).
        let tokens = pool.router.prompt_tokens(Prompt::Chat(&chat));
        let blocks = block_hashes("m", &tokens, 16);
        let saving = (blocks.len() * 16) as f64 / 10_000.0;
        let n = guards.len() as f64;
        assert!(
            (n - 1.0) * 0.02 <= saving + 1e-9 && n * 0.02 >= saving - 1e-9,
            "{n} vs {saving}"
        );
    }

    /// The whole routing stage (real indexes, real in-flight guards) under
    /// one dominant system prompt: 8 replicas, each request held for the
    /// time of 80 arrivals. Once warm, no replica holds more than 1.5× the
    /// mean in-flight load, and the prompt lives on every replica.
    #[test]
    fn dominant_system_prompt_is_no_hot_spot() {
        let text = format!(
            "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n[pools.prefix]\nmode = \"cache\"\n{}",
            replicas(8, |_| String::new())
        );
        let (t, metrics) = topology(&text);
        let pool = &t.pools[0];
        let system =
            "You are the assistant of a large online shop; follow the policy. ".repeat(120);
        let mut held: std::collections::VecDeque<crate::balancing::InFlightGuard> =
            std::collections::VecDeque::new();
        let mut worst: f64 = 0.0;
        for i in 0..1_200 {
            if held.len() == 80 {
                held.pop_front();
            }
            let chat = vec![
                ChatMessage::new("system", system.clone()),
                ChatMessage::new("user", format!("Question number {i}?")),
            ];
            let r = dispatch_chat(pool, &chat, &metrics);
            held.push_back(r.acquire());
            if i >= 400 {
                let loads: Vec<u64> = pool.replicas.iter().map(|r| r.in_flight()).collect();
                let mean = loads.iter().sum::<u64>() as f64 / loads.len() as f64;
                worst = worst.max(*loads.iter().max().unwrap() as f64 / mean);
            }
        }
        assert!(worst <= 1.5, "max/mean in flight {worst}");
        assert!(
            pool.replicas
                .iter()
                .all(|r| !pool.router.index(r.id).unwrap().is_empty())
        );
    }

    #[test]
    fn session_sticks_and_overflows_when_its_replica_is_saturated() {
        let text = format!(
            "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n[pools.session]\naffinity = true\n\
             [pools.saturation]\nmax_in_flight = 1\n[pools.prefix]\nmode = \"hash\"\n{}",
            replicas(4, |_| String::new())
        );
        let (t, metrics) = topology(&text);
        let pool = &t.pools[0];
        let mut headers = HeaderMap::new();
        headers.insert("x-session-id", "conversation-9".parse().unwrap());
        let route = || {
            pool.router
                .route(
                    &pool.replicas,
                    &input(&headers, None, Prompt::Text("hi")),
                    0,
                    1,
                    &metrics,
                )
                .unwrap()
        };
        let d = route();
        assert_eq!(d.branches, vec![RouteBranch::Session]);
        let home = d.preferred.clone().unwrap()[0];
        assert_eq!(route().preferred, Some(vec![home]));
        let busy = pool
            .replicas
            .iter()
            .find(|r| r.id == home)
            .unwrap()
            .acquire();
        let d = route();
        assert_eq!(d.branches, vec![RouteBranch::SessionOverflow]);
        assert_ne!(d.preferred, Some(vec![home]));
        drop(busy);
        // No session header: prefix affinity (hash of the first tokens) applies.
        let plain = HeaderMap::new();
        let d = pool
            .router
            .route(
                &pool.replicas,
                &input(&plain, None, Prompt::Text("hi")),
                0,
                1,
                &metrics,
            )
            .unwrap();
        assert_eq!(d.branches, vec![RouteBranch::PrefixHit]);
    }

    #[test]
    fn cache_mode_skips_a_warm_replica_at_its_concurrency_limit() {
        let text = format!(
            "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\nmax_inflight = 1\n[pools.prefix]\nmode = \"cache\"\n{}",
            replicas(2, |_| String::new())
        );
        let (t, metrics) = topology(&text);
        let pool = &t.pools[0];
        let headers = HeaderMap::new();
        let prompt = "Summarise the attached contract clause by clause. ".repeat(30);
        let route = || {
            pool.router
                .route(
                    &pool.replicas,
                    &input(&headers, None, Prompt::Text(&prompt)),
                    0,
                    1,
                    &metrics,
                )
                .unwrap()
        };
        let first = route();
        let home = first.preferred.clone().unwrap()[0];
        let home_replica = pool.replicas.iter().find(|r| r.id == home).unwrap();
        first.dispatched(home_replica);
        let _full = home_replica.acquire();
        let d = route();
        assert_ne!(d.preferred, Some(vec![home]));
        assert_eq!(d.branches, vec![RouteBranch::PrefixOverflow]);
    }

    #[test]
    fn narrow_prefers_then_falls_back_to_allowed() {
        let text = format!(
            "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n{}",
            replicas(3, |_| String::new())
        );
        let (t, _) = topology(&text);
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
    fn tier_pool_overflows_to_the_model_pool_only_when_saturated() {
        let text = format!(
            "[[tiers]]\nname = \"paid\"\npriority = \"high\"\npool = \"reserved\"\noverflow = true\n\
             [[tiers]]\nname = \"free\"\npriority = \"low\"\n\
             [[pools]]\nname = \"shared\"\nmodels = [\"m\"]\n{}\
             [[pools]]\nname = \"reserved\"\nmodels = [\"m-reserved\"]\n[pools.saturation]\nmax_in_flight = 1\n\
             [[pools.replicas]]\nurl = \"http://127.0.0.1:9\"\nname = \"gold\"\n",
            replicas(1, |_| String::new())
        );
        let (t, _) = topology(&text);
        let r = t.resolve("m", Some("paid")).unwrap();
        assert_eq!(
            (r.pool.name.as_str(), r.branches.clone()),
            ("reserved", vec![RouteBranch::Tier])
        );
        assert_eq!(t.resolve("m", Some("free")).unwrap().pool.name, "shared");
        assert!(t.resolve("unknown", Some("paid")).is_none());
        let _busy = t.pools[1].replicas[0].acquire();
        let r = t.resolve("m", Some("paid")).unwrap();
        assert_eq!(
            (r.pool.name.as_str(), r.branches),
            ("shared", vec![RouteBranch::TierOverflow])
        );
    }

    /// A pool with `[pools.tokenizer]` routes on the model's tokens: the
    /// blocks `cache` mode records are those of the real token ids.
    #[test]
    fn pool_tokenizer_feeds_cache_mode() {
        let dir = "../shared/tokenizers/tiny-llama";
        let text = format!(
            "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n[pools.prefix]\nmode = \"cache\"\n\
             [pools.tokenizer]\ndir = \"{dir}\"\n{}",
            replicas(2, |_| String::new())
        );
        let (t, metrics) = topology(&text);
        let pool = &t.pools[0];
        let model = PromptTokenizer::load(std::path::Path::new(dir)).unwrap();
        assert!(pool.router.tokenizer().same_as(&model));
        let chat = vec![
            ChatMessage::new("system", "Answer in formal English. ".repeat(30)),
            ChatMessage::new("user", "hello"),
        ];
        let ids = model.encode_chat(&chat).unwrap();
        assert_eq!(pool.router.prompt_tokens(Prompt::Chat(&chat)), ids);
        assert_ne!(ids, PromptTokenizer::StandIn.encode_chat(&chat).unwrap());
        let id = dispatch_chat(pool, &chat, &metrics).id;
        let index = pool.router.index(id).unwrap();
        let headers = HeaderMap::new();
        let blocks = block_hashes("m", &ids, 16);
        assert_eq!(index.matched(&blocks), ids.len() / 16);
        // Tokens handed in by the caller are used as they are.
        let given: Vec<u32> = (0..64).collect();
        let mut routed = input(&headers, None, Prompt::Chat(&chat));
        routed.tokens = Some(&given);
        let d = pool
            .router
            .route(&pool.replicas, &routed, 0, 1, &metrics)
            .unwrap();
        assert_eq!(d.branches, vec![RouteBranch::PrefixMiss]);
    }
}

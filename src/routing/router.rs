//! The routing stage of one pool: between the pool lookup and the balancer,
//! it narrows the candidate replicas and says why.
//!
//! In order, each step working on what the previous one left:
//! 1. **canary** ([`super::canary`]): the request's version (forced by
//!    header, sticky by key, or random by weight) keeps only that version's
//!    replicas;
//! 2. **tiers** ([`super::tiers`]): the caller's tier keeps only its
//!    reserved replicas (or overflows into lower tiers' when saturated and
//!    allowed);
//! 3. **session affinity** ([`super::affinity`], a session header, when
//!    enabled) or **prefix affinity** names a preferred replica: `hash` mode
//!    by rendezvous on a prompt key ([`super::hash_key`]), `cache` and
//!    `exact` modes by expected time to first token ([`super::cache`]).
//!
//! Steps 1–2 are hard limits ([`Decision::allowed`]): retries stay inside
//! them. Step 3 is a preference ([`Decision::preferred`]): the forwarder
//! tries it first and falls back to the allowed set on retry. The balancer
//! picks among what is left. What a reload carries over lives in
//! [`super::carry_over`].
//!
//! Pure apart from the prefix indexes (which learn what was sent where) and
//! the one random draw for requests without a sticky key, which the caller
//! passes in. Cost: O(replicas) plus, in `cache` and `exact` modes,
//! tokenizing the prompt once (`blocks::prompt_token_ids`, the one place a
//! request is tokenized for routing), hashing its blocks once per block size
//! in use and one index lookup per candidate.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use http::{HeaderMap, HeaderName};

use super::RouteError;
use super::affinity::{self, Affinity, Key};
use super::cache;
use super::canary::{PoolCanary, StickyKeys};
use super::carry_over::PrefixState;
use super::decision::Decision;
use super::hash_key::hash_key;
use super::prefix::blocks::{CacheKey, Prompt, prompt_ids, prompt_token_ids};
use super::prefix::cache_index::BlockIndex;
use super::prefix::held::HeldBlocks;
use super::prefix::hot::Replication;
use super::prefix::score::{AdapterWait, CostModel};
use super::saturation::{all_saturated, is_saturated};
use super::tiers::PoolTiers;
use crate::config::{Config, LoraConfig, PoolConfig, PrefixConfig, PrefixMode, SaturationConfig};
use crate::kv_events::subscriber::Endpoints;
use crate::replica::{Replica, ReplicaId, ReplicaView};
use crate::tokenize::{PromptTokenizer, Unpredictable};

#[derive(Debug)]
pub struct Router {
    pub(super) prefix: PrefixConfig,
    pub(crate) cost: CostModel,
    saturation: SaturationConfig,
    pub(crate) max_age_ms: u64,
    session_header: HeaderName,
    session_affinity: bool,
    canary: Option<PoolCanary>,
    pub(super) affinity: Affinity,
    pub(super) state: PrefixState,
    tiers: PoolTiers,
    tokenizer: PromptTokenizer,
    lora: LoraConfig,
    /// Where dispatch records go for the other llmlb instances (`[fleet]`
    /// with `share_prefixes`; `cache` and `hash` modes).
    outbox: std::sync::OnceLock<crate::fleet::PrefixOutbox>,
}

/// What the routing stage knows about a request.
#[derive(Debug, Clone, Copy)]
pub struct RouteInput<'a> {
    pub model: &'a str,
    pub user: Option<&'a str>,
    /// The API key the request presents (a canary sticky key), found by
    /// the gateway.
    pub api_key: Option<&'a str>,
    pub headers: &'a HeaderMap,
    pub tier: Option<&'a str>,
    pub prompt: Prompt<'a>,
    /// The prompt's token ids when the caller already has them from this
    /// pool's tokenizer ([`Router::prompt_tokens`]); else the router
    /// tokenizes when a mode needs tokens.
    pub tokens: Option<&'a [u32]>,
    /// The request's `cache_salt`.
    pub salt: Option<&'a str>,
    /// Why the prompt's cached prefix cannot be predicted (found when the
    /// request was read or tokenized), if it cannot.
    pub unpredictable: Option<Unpredictable>,
    /// The request's kind for the closed-loop metrics (`plain`, `tools`,
    /// `template_args`); routing makes it `adapter` for a LoRA adapter.
    pub kind: &'static str,
    /// The most output tokens the request asks for (`max_completion_tokens`,
    /// else `max_tokens`): in `exact` mode, when the request should end
    /// and stop holding its prompt's blocks on the replica.
    pub max_tokens: Option<u32>,
}

impl Router {
    /// Builds a pool's router; the prefix state of every replica that was in
    /// `previous` is carried over, that of removed replicas is dropped.
    pub fn build(
        config: &Config,
        pc: &PoolConfig,
        replicas: &[Arc<Replica>],
        previous: Option<&Router>,
    ) -> Router {
        Router {
            prefix: pc.prefix.clone(),
            cost: CostModel {
                prefill_tokens_per_second: pc.prefix.prefill_tokens_per_second,
                seconds_per_request_ahead: pc.prefix.seconds_per_request_ahead,
                kv_wait: pc.prefix.kv_wait,
                evictions: pc.prefix.evictions,
                preemptions: pc.prefix.preemptions,
                rate_band: pc.prefix.rate_band,
                fit_band: pc.prefix.fit_band,
            },
            saturation: pc.saturation.clone(),
            max_age_ms: pc.scrape.staleness.as_millis() as u64,
            session_header: HeaderName::from_bytes(pc.session.header.as_bytes())
                .expect("header name checked by config validation"),
            session_affinity: pc.session.affinity,
            canary: PoolCanary::build(config, pc, replicas),
            affinity: Affinity::build(replicas),
            state: PrefixState::build(pc, replicas, previous.map(|p| &p.state)),
            tiers: PoolTiers::build(config, replicas),
            tokenizer: pool_tokenizer(pc),
            lora: pc.lora.clone(),
            outbox: std::sync::OnceLock::new(),
        }
    }

    /// Whether the pool has a canary: the one step that reads the
    /// request's API key (a sticky key).
    pub fn has_canary(&self) -> bool {
        self.canary.is_some()
    }

    /// Whether `model` names a LoRA adapter of this pool: listed in
    /// `[pools.lora] adapters`, or reported by a replica's KV events.
    pub fn is_adapter(&self, model: &str) -> bool {
        self.lora.adapters.iter().any(|a| a == model)
            || self.state.held.values().any(|h| h.has_adapter(model))
    }

    /// What keys the request's cached blocks besides its tokens.
    pub fn cache_key(&self, input: &RouteInput<'_>) -> CacheKey {
        self.key_of(input.model, input.salt)
    }

    /// What keys the blocks of a request for `model` with `salt` besides
    /// its tokens.
    pub fn key_of(&self, model: &str, salt: Option<&str>) -> CacheKey {
        CacheKey {
            adapter: self.is_adapter(model).then(|| model.to_string()),
            salt: salt.map(String::from),
        }
    }

    /// In `cache` and `exact` modes, the prompt tokens (`tokens`, keyed by
    /// `model` and `key`) cached on the one of `replicas` with a free slot
    /// that caches the most of them at `now_ms`, as routing would count
    /// them; 0 in the other modes. The pool queue's prefix handoff reads it
    /// when a slot frees.
    pub fn cached_where_free(
        &self,
        replicas: &[Arc<Replica>],
        model: &str,
        tokens: &[u32],
        key: &CacheKey,
        now_ms: u64,
    ) -> u64 {
        if !self.prefix.mode.scores_by_cost() {
            return 0;
        }
        let free: Vec<Arc<Replica>> = replicas
            .iter()
            .filter(|r| r.is_eligible_at(now_ms) && r.has_free_slot())
            .cloned()
            .collect();
        if free.is_empty() {
            return 0;
        }
        let views = views_at(&free, now_ms);
        cache::cached_most(self, &free, &views, model, tokens, key)
    }

    /// Publishes this pool's dispatch records through `outbox` from now on
    /// (`cache` and `hash` modes only: `exact` agrees through the
    /// replicas' own KV events).
    pub fn share_prefixes(&self, outbox: crate::fleet::PrefixOutbox) {
        if matches!(self.prefix.mode, PrefixMode::Cache | PrefixMode::Hash) {
            let _ = self.outbox.set(outbox);
        }
    }

    /// Folds what another llmlb instance sent to `replica` (one of
    /// `replicas`, the pool's) into this instance's view: the blocks count
    /// as held there, and in `hash` mode with homes the arrival counts
    /// toward the prefix's demand. Unknown replicas are ignored.
    pub fn fold_remote(
        &self,
        replicas: &[Arc<Replica>],
        replica: &str,
        key: Option<u64>,
        blocks: &[u64],
        now_ms: u64,
    ) {
        let Some(r) = replicas.iter().find(|r| r.name == replica) else {
            return;
        };
        if let Some(index) = self.state.indexes.get(&r.id) {
            index.record(blocks);
        }
        if let (Some(key), Some(_), PrefixMode::Hash) = (key, &self.state.hot, self.prefix.mode) {
            let cands: Vec<Arc<Replica>> = replicas
                .iter()
                .filter(|r| r.is_eligible_at(now_ms))
                .cloned()
                .collect();
            let views: HashMap<ReplicaId, ReplicaView> = cands
                .iter()
                .map(|r| (r.id, ReplicaView::at(r, now_ms)))
                .collect();
            cache::home_of(self, key, &cands, &views, now_ms);
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

    /// The request's tokens: the caller's, else tokenized now; and why
    /// they cannot be predicted from, if they cannot.
    fn tokens<'i>(&self, input: &RouteInput<'i>) -> (Cow<'i, [u32]>, Option<Unpredictable>) {
        match input.tokens {
            Some(t) => (Cow::Borrowed(t), input.unpredictable),
            None => {
                let (ids, reason) = prompt_ids(&self.tokenizer, input.prompt);
                (Cow::Owned(ids), input.unpredictable.or(reason))
            }
        }
    }

    /// Whether no eligible replica among `replicas` has room.
    pub fn all_saturated(&self, replicas: &[Arc<Replica>], now_ms: u64) -> bool {
        all_saturated(replicas, &self.saturation, self.max_age_ms, now_ms)
    }

    /// Hot prefixes replicated right now, when the pool replicates them
    /// (`cache` and `exact` modes with `replicate`).
    pub fn replication(&self) -> Option<Replication> {
        self.state
            .hot
            .as_ref()
            .filter(|h| h.settings().replicate)
            .map(|h| h.replication())
    }

    /// The prefix index of a replica (`cache` mode, and `exact` mode's
    /// estimate for replicas whose events are unknown).
    pub fn index(&self, id: ReplicaId) -> Option<&Arc<BlockIndex>> {
        self.state.indexes.get(&id)
    }

    /// What a replica reports holding (`exact` mode, replicas with `kv_events`).
    pub fn held(&self, id: ReplicaId) -> Option<&Arc<HeldBlocks>> {
        self.state.held.get(&id)
    }

    /// Each event-publishing replica's endpoints and the record its
    /// subscriber keeps (`exact` mode).
    pub fn kv_subscriptions(&self) -> Vec<(ReplicaId, Endpoints, Arc<HeldBlocks>)> {
        self.state
            .kv_sources
            .iter()
            .filter_map(|(id, ep)| Some((*id, ep.clone(), Arc::clone(self.state.held.get(id)?))))
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
    ) -> Result<Decision, RouteError> {
        let mut d = Decision::default();
        let mut cands: Vec<Arc<Replica>> = replicas
            .iter()
            .filter(|r| r.is_eligible_at(now_ms))
            .cloned()
            .collect();
        let session = self.narrow_by_canary(input, random, replicas, &mut cands, &mut d)?;
        let session_key = if self.session_affinity {
            affinity::session_key(session)
        } else {
            None
        };
        let adapter = self.is_adapter(input.model);
        // The candidates' load, read only by the steps that weigh it: tiers
        // (their overflow), session affinity, LoRA placement and prefix
        // affinity. A request none of them looks at builds no map.
        let weighed = !self.tiers.is_empty()
            || session_key.is_some()
            || adapter
            || self.prefix.mode != PrefixMode::Off;
        let views: HashMap<ReplicaId, ReplicaView> = if weighed {
            views_at(&cands, now_ms)
        } else {
            HashMap::new()
        };
        let saturated = |r: &Replica| {
            debug_assert!(weighed, "a step read the load of an unweighed request");
            views
                .get(&r.id)
                .is_some_and(|v| is_saturated(r, v, &self.saturation, self.max_age_ms))
        };
        self.tiers.narrow(input.tier, &mut cands, saturated, &mut d);
        if cands.is_empty() {
            return Ok(d);
        }
        let by_cost = session_key.is_none() && self.prefix.mode.scores_by_cost();
        let lora = adapter
            .then(|| {
                self.place_adapter(&mut d, &mut cands, &views, &saturated, input.model, by_cost)
            })
            .flatten();
        if let Some(key) = session_key {
            self.affinity
                .prefer(&mut d, &cands, key, &saturated, Key::Session);
            return Ok(d);
        }
        let step = Candidates {
            cands: &cands,
            views: &views,
            saturated: &saturated,
            now_ms,
        };
        let at = d.branches.len();
        let waits = lora.as_ref().map(|l| &l.waits);
        self.prefer_by_prefix(&mut d, &step, input, waits.unwrap_or(&HashMap::new()));
        if let Some(l) = lora {
            l.settle(
                &mut d,
                at,
                &cands,
                input.model,
                &saturated,
                self.lora.max_imbalance,
            );
        }
        Ok(d)
    }

    /// Step 1, when the pool has a canary: `cands` narrowed to the
    /// request's version. Returns the request's session header, which only
    /// the canary's sticky keys and session affinity read.
    fn narrow_by_canary<'i>(
        &self,
        input: &RouteInput<'i>,
        random: u64,
        replicas: &[Arc<Replica>],
        cands: &mut Vec<Arc<Replica>>,
        d: &mut Decision,
    ) -> Result<Option<&'i str>, RouteError> {
        let session = (self.canary.is_some() || self.session_affinity)
            .then(|| header(input.headers, &self.session_header))
            .flatten();
        if let Some(c) = &self.canary {
            let keys = StickyKeys {
                user: input.user,
                session,
                api_key: input.api_key,
            };
            let forced = header(input.headers, &c.canary.header);
            c.narrow(forced, &keys, random, replicas, cands, d)?;
        }
        Ok(session)
    }

    /// A LoRA adapter's request's placement (`[pools.lora] placement`): with
    /// `by_cost` (`cache` and `exact` modes, no session), what it waits for
    /// on each candidate, for the prefix step's cost; otherwise the
    /// placement order narrows `cands` and sets the preference.
    fn place_adapter(
        &self,
        d: &mut Decision,
        cands: &mut Vec<Arc<Replica>>,
        views: &HashMap<ReplicaId, ReplicaView>,
        saturated: &dyn Fn(&Replica) -> bool,
        model: &str,
        by_cost: bool,
    ) -> Option<AdapterCost> {
        d.adapter = Some(Arc::from(model));
        if !self.lora.placement {
            return None;
        }
        if !by_cost {
            // Later steps choose among these; without one, they are the
            // preference.
            let bound = self.lora.max_imbalance;
            d.preferred = super::lora::narrow(model, cands, saturated, bound, d);
            return None;
        }
        Some(AdapterCost {
            waits: super::lora::waits(model, cands, views),
        })
    }

    /// Step 3 without a session: the preferred replica by the prompt's
    /// prefix, in the pool's prefix mode; and, when the pool shares what
    /// it sent with other instances, the record to share.
    fn prefer_by_prefix(
        &self,
        d: &mut Decision,
        step: &Candidates<'_>,
        input: &RouteInput<'_>,
        waits: &HashMap<ReplicaId, AdapterWait>,
    ) {
        if self.prefix.mode == PrefixMode::Off {
            return;
        }
        let key = self.cache_key(input);
        d.kind = if key.adapter.is_some() {
            "adapter"
        } else {
            input.kind
        };
        let mut shared_key = None;
        match self.prefix.mode {
            PrefixMode::Off => {}
            PrefixMode::Hash => shared_key = self.prefer_hashed(d, step, input, &key),
            PrefixMode::Cache | PrefixMode::Exact => {
                let (tokens, unpredictable) = self.tokens(input);
                if let Some(reason) = unpredictable {
                    d.unpredictable = Some(reason);
                    d.branches.push(super::RouteBranch::PrefixUnpredictable);
                    return;
                }
                let prompt = cache::KeyedPrompt {
                    model: input.model,
                    tokens,
                    key: &key,
                    waits,
                    max_tokens: input.max_tokens,
                };
                cache::prefer(self, d, step.cands, step.views, prompt, step.now_ms)
            }
        }
        if let Some(outbox) = self.outbox.get()
            && d.record.is_some()
        {
            d.share = Some((outbox.clone(), shared_key));
        }
    }

    /// `hash` mode: the replica the prompt's key lands on by rendezvous
    /// (or its hot-prefix home), and what is sent recorded for the
    /// prediction. Returns the key, when the prompt has one.
    fn prefer_hashed(
        &self,
        d: &mut Decision,
        step: &Candidates<'_>,
        input: &RouteInput<'_>,
        key: &CacheKey,
    ) -> Option<u64> {
        // Tokenized once: the key may read the tokens, the prediction
        // always does.
        let (tokens, unpredictable) = self.tokens(input);
        let shared_key = hash_key(&self.prefix, input.model, input.prompt, || {
            Cow::Borrowed(&tokens)
        });
        match shared_key {
            Some(k) => {
                let home = cache::home_of(self, k, step.cands, step.views, step.now_ms);
                self.affinity
                    .prefer_home(d, step.cands, k, home, step.saturated, Key::Prefix)
            }
            None => d.branches.push(super::RouteBranch::PrefixNone),
        }
        // A prompt that cannot be predicted is placed by its key all the
        // same, but nothing is predicted for it.
        d.unpredictable = unpredictable;
        if unpredictable.is_none() {
            cache::record_for_prediction(
                self,
                d,
                step.cands,
                step.views,
                input.model,
                &tokens,
                key,
            );
        }
        shared_key
    }
}

/// A LoRA request placed by cost: what it waits for on each candidate.
struct AdapterCost {
    waits: HashMap<ReplicaId, AdapterWait>,
}

impl AdapterCost {
    /// After the prefix step (whose branches start at `at`): the branch of
    /// where its pick stands, or, without a pick, the placement order's
    /// preference and branch (as without `by_cost`, over the same
    /// candidates).
    fn settle(
        self,
        d: &mut Decision,
        at: usize,
        cands: &[Arc<Replica>],
        model: &str,
        saturated: &dyn Fn(&Replica) -> bool,
        bound: u32,
    ) {
        let picked = d
            .preferred
            .as_ref()
            .and_then(|p| cands.iter().find(|r| p.first() == Some(&r.id)));
        match picked {
            Some(r) => d.branches.insert(at, super::lora::branch_at(model, r)),
            None => {
                let mut narrowed = cands.to_vec();
                let mut order = Decision::default();
                d.preferred =
                    super::lora::narrow(model, &mut narrowed, saturated, bound, &mut order);
                d.branches.splice(at..at, order.branches);
            }
        }
    }
}

/// What the narrowing steps left for the preference: the candidates, their
/// views at `now_ms`, and which of them are saturated.
struct Candidates<'a> {
    cands: &'a [Arc<Replica>],
    views: &'a HashMap<ReplicaId, ReplicaView>,
    saturated: &'a dyn Fn(&Replica) -> bool,
    now_ms: u64,
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

/// Each candidate's view at `now_ms`, by id.
fn views_at(cands: &[Arc<Replica>], now_ms: u64) -> HashMap<ReplicaId, ReplicaView> {
    cands
        .iter()
        .map(|r| (r.id, ReplicaView::at(r, now_ms)))
        .collect()
}

fn header<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::test_fleet::{dispatch_chat, input, replicas, route, topology};
    use crate::routing::RouteBranch;
    use crate::routing::prefix::blocks::block_hashes;
    use crate::tokenize::ChatMessage;

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
        let t = topology(&text);
        let pool = &t.pools()[0];
        let model = PromptTokenizer::load(std::path::Path::new(dir)).unwrap();
        assert!(pool.router.tokenizer().same_as(&model));
        let chat = vec![
            ChatMessage::new("system", "Answer in formal English. ".repeat(30)),
            ChatMessage::new("user", "hello"),
        ];
        let ids = model.encode_chat(&chat).unwrap();
        assert_eq!(pool.router.prompt_tokens(Prompt::Chat(&chat)), ids);
        assert_ne!(ids, PromptTokenizer::StandIn.encode_chat(&chat).unwrap());
        let id = dispatch_chat(pool, &chat).id;
        let index = pool.router.index(id).unwrap();
        let headers = HeaderMap::new();
        let blocks = block_hashes("m", &ids, 16);
        assert_eq!(index.matched(&blocks), ids.len() / 16);
        // Tokens handed in by the caller are used as they are.
        let given: Vec<u32> = (0..64).collect();
        let mut routed = input(&headers, None, Prompt::Chat(&chat));
        routed.tokens = Some(&given);
        let d = route(pool, &routed);
        assert_eq!(d.branches, vec![RouteBranch::PrefixMiss]);
    }
}

//! `cache` and `exact` modes' step: prefer the candidate with the lowest
//! expected time to first token, given the prompt tokens each probably
//! holds in its prefix cache and the requests queued ahead of it
//! ([`super::prefix::score`]).
//!
//! What a replica holds comes from its KV events in `exact` mode when its
//! record is known ([`super::prefix::held`]), else from what llmlb sent it
//! ([`super::prefix::cache_index`], no more than the KV capacity the
//! replica's scrape reports), and in `exact` mode also from that index
//! when no replica's events show any of the prompt (a prefix evicted
//! everywhere goes back where it was last sent); a pick made on that
//! estimate in `exact` mode records `prefix_estimated`. With `homes`, a prefix nothing holds
//! is scored as if its home ([`super::prefix::home`]) held the part its
//! requests share (`prefix_home` when that decided the pick). A replica at its concurrency limit is
//! skipped while another has a free slot, however warm. Ties go by
//! rendezvous rank on the prompt's leading blocks, so cold instances agree
//! per prefix. The branch says whether the most-cached replica won
//! (`prefix_hit`), lost to its queue (`prefix_overflow`), or nothing was
//! cached (`prefix_miss`); a prompt shorter than a block scores nothing
//! (`prefix_none`).
//!
//! A replica that restarted (its restart count, kept by the scrape loop,
//! moved) has its index and record emptied before they are read.
//!
//! Cost: hashing the prompt's blocks once per block size in use, one index
//! lookup per candidate, O(candidates) scoring.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use super::RouteBranch;
use super::decision::{Decision, Expect, Recorded};
use super::prefix::blocks::{CacheKey, block_hashes_keyed, exact_seed, keyed_hashes};
use super::prefix::cache_index::BlockIndex;
use super::prefix::held::HeldBlocks;
use super::prefix::hot::Hot;
use super::prefix::predict;
use super::prefix::rendezvous;
use super::prefix::score::{self, AdapterWait, Candidate};
use super::router::Router;
use crate::config::PrefixMode;
use crate::replica::{Rates, Replica, ReplicaId, ReplicaView};

/// A request's prompt as prefix routing hashes it: the model named, the
/// token ids and what else keys its blocks; and, for a LoRA request with
/// placement, what it waits for on each replica ([`super::lora::waits`];
/// empty otherwise).
pub(super) struct KeyedPrompt<'a> {
    pub model: &'a str,
    pub tokens: Cow<'a, [u32]>,
    pub key: &'a CacheKey,
    pub waits: &'a HashMap<ReplicaId, AdapterWait>,
    /// The most output tokens the request asks for.
    pub max_tokens: Option<u32>,
}

/// Sets the decision's preference among `cands` for `prompt`.
pub(super) fn prefer(
    router: &Router,
    d: &mut Decision,
    cands: &[Arc<Replica>],
    views: &HashMap<ReplicaId, ReplicaView>,
    prompt: KeyedPrompt<'_>,
    now_ms: u64,
) {
    let KeyedPrompt {
        model,
        tokens,
        key: cache_key,
        waits,
        max_tokens,
    } = prompt;
    let prefix = &router.prefix;
    let block = prefix.block_size;
    let blocks = block_hashes_keyed(model, &tokens, block, cache_key);
    if blocks.is_empty() {
        d.branches.push(RouteBranch::PrefixNone);
        return;
    }
    let holdings = Holdings::new(router, &tokens, cache_key, &blocks, cands, views);
    d.predicted = holdings.predicted.clone();
    // The prefix's key: the chained hash of its first `prefix.tokens`
    // tokens, so cold instances agree per prefix and prefixes that share
    // only the chat template still spread.
    let lead = (prefix.tokens / block).clamp(1, blocks.len());
    let key = blocks[lead - 1];
    // Rendezvous nodes of every candidate, for a prefix's home and copies
    // (none without the demand tracker).
    let all_nodes = match router.state.hot {
        Some(_) => router.affinity.nodes(cands),
        None => Vec::new(),
    };
    let hot = hot_of(router, key, &blocks, cands, &all_nodes, views, now_ms);
    let (with_slot, held_by_full) = with_free_slots(cands, &holdings);
    let all = cands;
    let cands: &[Arc<Replica>] = if with_slot.is_empty() {
        cands
    } else {
        &with_slot
    };
    let held: Vec<Holding> = cands.iter().map(|r| holdings.holding(r.id)).collect();
    let most = held
        .iter()
        .map(|h| h.cached)
        .max()
        .unwrap_or(0)
        .max(held_by_full);
    let shared_tokens = ((hot.shared_blocks * block) as u64).min(tokens.len() as u64);
    // Every arrival of the prefix shares at least the blocks its key is
    // made of, the first one included. The home is counted as keeping them
    // only while no replica holds as much: a prefix held elsewhere is a hit
    // there, not a reason to prefill it again at home.
    let kept = shared_tokens.max((lead * block) as u64);
    let facts = PrefixFacts {
        copies: copies_of(key, &hot, &all_nodes, all),
        home: hot.home.map(|i| all[i].id),
        shared: most.min(shared_tokens),
        kept: if most < kept { kept } else { 0 },
    };
    let scored = candidates(router, key, cands, views, &held, &facts, waits);
    let prompt_len = tokens.len() as u64;
    let Some((i, ttft)) = score::best(&router.cost, prompt_len, &scored) else {
        return;
    };
    let pick = Pick {
        i,
        ttft,
        most,
        held: &held,
        scored: &scored,
        prompt_len,
    };
    pick.note_branches(router, cands[i].id, &facts, cands, &mut d.branches);
    d.prefer_scored(cands[i].id, ttft);
    let ends = ends_ms(now_ms, ttft, max_tokens, &scored[i].rates);
    to_record(router, d, blocks, tokens, cache_key, ends);
}

/// The most tokens of the prompt (`tokens` of `model`, keyed by `key`)
/// any of `cands` caches, counted as [`prefer`] counts them.
pub(super) fn cached_most(
    router: &Router,
    cands: &[Arc<Replica>],
    views: &HashMap<ReplicaId, ReplicaView>,
    model: &str,
    tokens: &[u32],
    key: &CacheKey,
) -> u64 {
    let blocks = block_hashes_keyed(model, tokens, router.prefix.block_size, key);
    if blocks.is_empty() {
        return 0;
    }
    let holdings = Holdings::new(router, tokens, key, &blocks, cands, views);
    let cached = cands.iter().map(|r| holdings.holding(r.id).cached);
    cached.max().unwrap_or(0)
}

/// Output tokens assumed for a request that does not bound its answer,
/// on a replica whose answer length is not learned yet.
const UNBOUNDED_OUTPUT: f64 = 256.0;

/// When a request sent now to the chosen replica should end, in
/// `now_ms`'s milliseconds: after its expected time to first token there
/// (`ttft`, the cost model's) and its output tokens at the replica's
/// learned decode step (none learned: no time for the output). The output
/// is the request's `max_tokens`; without one, the replica's learned
/// answer length ([`UNBOUNDED_OUTPUT`] until it has one). Only the order
/// of the requests in flight on one replica matters
/// ([`HeldBlocks::matched_at_turn`]): a request sent behind a longer
/// queue, or asking for a longer answer, ends later.
fn ends_ms(now_ms: u64, ttft: f64, max_tokens: Option<u32>, rates: &Rates) -> u64 {
    let out = max_tokens
        .map(f64::from)
        .or(rates.output_tokens)
        .unwrap_or(UNBOUNDED_OUTPUT);
    let decode = rates.decode_step_seconds.map_or(0.0, |s| out * s);
    now_ms.saturating_add(((ttft + decode) * 1000.0) as u64)
}

/// What the request's dispatch records: its blocks into the pool's index
/// (what was sent where) and, in `exact` mode, its prompt as expected on
/// the replica until the replica reports it or the request ends.
fn to_record(
    router: &Router,
    d: &mut Decision,
    blocks: Vec<u64>,
    tokens: Cow<'_, [u32]>,
    cache_key: &CacheKey,
    ends_ms: u64,
) {
    d.record = Some(Recorded {
        indexes: Arc::clone(&router.state.indexes),
        blocks,
        block_size: router.prefix.block_size,
    });
    if router.prefix.mode == PrefixMode::Exact {
        d.expect = Some(Expect {
            held: Arc::clone(&router.state.held),
            tokens: tokens.into_owned(),
            key: cache_key.clone(),
            ends_ms,
        });
    }
}

/// The best-scored candidate (`i`) and what it was chosen among: each
/// candidate's holding and score, the most any replica holds.
struct Pick<'a> {
    i: usize,
    /// The cost model's expected time to first token there, in seconds.
    ttft: f64,
    most: u64,
    held: &'a [Holding],
    scored: &'a [Candidate],
    prompt_len: u64,
}

impl Pick<'_> {
    /// Why replica `id` won, noted in `out` and logged
    /// ([`Self::log`]).
    fn note_branches(
        &self,
        router: &Router,
        id: ReplicaId,
        facts: &PrefixFacts,
        cands: &[Arc<Replica>],
        out: &mut Vec<RouteBranch>,
    ) {
        let noted = out.len();
        self.add_branches(router, id, facts, out);
        self.log(router, cands, &out[noted..]);
    }

    /// Why replica `id` won: the most-cached one (`prefix_hit`), another
    /// (`prefix_overflow`) or nothing cached (`prefix_miss`); and whether
    /// on an estimate, as a hot prefix's copy, or as its home.
    fn add_branches(
        &self,
        router: &Router,
        id: ReplicaId,
        facts: &PrefixFacts,
        out: &mut Vec<RouteBranch>,
    ) {
        let held = self.held[self.i];
        out.push(if self.most == 0 {
            RouteBranch::PrefixMiss
        } else if held.cached == self.most {
            RouteBranch::PrefixHit
        } else {
            RouteBranch::PrefixOverflow
        });
        if held.estimated {
            out.push(RouteBranch::PrefixEstimated);
        }
        if facts.copies.contains(&id) {
            out.push(RouteBranch::PrefixReplicated);
        }
        if facts.home == Some(id) && !wins_as_held(router, self.prompt_len, self.scored, self.i) {
            out.push(RouteBranch::PrefixHome);
        }
    }

    /// The pick and what each candidate was scored on, as one `DEBUG`
    /// event of target `llmlb::prefix_pick` (off unless `RUST_LOG` asks
    /// for it): why a request left its prefix's replica, for example.
    fn log(&self, router: &Router, cands: &[Arc<Replica>], branches: &[RouteBranch]) {
        if !tracing::enabled!(target: "llmlb::prefix_pick", tracing::Level::DEBUG) {
            return;
        }
        let mut list = String::new();
        for (i, (r, c)) in cands.iter().zip(self.scored).enumerate() {
            let held = self.held[i];
            // The scraped queue as estimated now, or llmlb's own count
            // when some candidate's scrape is stale.
            let (ahead, count, free) = match c.ahead {
                score::Ahead::Scraped {
                    waiting,
                    free_kv_tokens,
                    ..
                } => ("waiting", waiting, free_kv_tokens),
                score::Ahead::Local { in_flight } => ("in_flight", in_flight, None),
            };
            // Free KV and empty cache room, in tokens, where known.
            let known = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
            let _ = std::fmt::Write::write_fmt(
                &mut list,
                format_args!(
                    "{}{}:cached={}{},kept={},prefilling={},queued={},{ahead}={count},free_kv={},room={},preempt={};",
                    if i == self.i { "*" } else { "" },
                    r.name,
                    c.cached_tokens,
                    if held.estimated { "~" } else { "" },
                    c.kept_tokens,
                    c.prefilling,
                    c.queued_tokens,
                    known(free),
                    known(c.room_tokens),
                    router.cost.preempted_tokens(
                        c.ahead,
                        self.prompt_len.saturating_sub(c.cached_tokens),
                        self.prompt_len
                    ),
                ),
            );
        }
        let branch = branches.first().map_or("", |b| b.as_str());
        tracing::debug!(
            target: "llmlb::prefix_pick",
            prompt = self.prompt_len,
            most = self.most,
            ttft_ms = (self.ttft * 1000.0).round() as u64,
            branch,
            candidates = %list,
            "prefix pick"
        );
    }
}

/// What a prefix brings to its candidates' scores.
struct PrefixFacts {
    /// A hot prefix's copies: they count as holding the part its requests
    /// share (the first request sent to a cold copy warms it).
    copies: Vec<ReplicaId>,
    /// The prefix's home: where its next requests will look for the part
    /// they share, held now or not.
    home: Option<ReplicaId>,
    /// Tokens a copy counts as holding.
    shared: u64,
    /// Tokens the home counts as keeping.
    kept: u64,
}

/// The candidates with a free slot (none: every candidate is scored), and
/// the most any full candidate holds, to tell an overflow from a miss (0
/// when no candidate has a slot). A replica at its concurrency limit cannot
/// take the request now, however warm.
fn with_free_slots(cands: &[Arc<Replica>], holdings: &Holdings) -> (Vec<Arc<Replica>>, u64) {
    let with_slot: Vec<Arc<Replica>> = cands
        .iter()
        .filter(|r| r.has_free_slot())
        .cloned()
        .collect();
    let held_by_full = if with_slot.is_empty() {
        0
    } else {
        cands
            .iter()
            .filter(|r| !r.has_free_slot())
            .map(|r| holdings.holding(r.id).cached)
            .max()
            .unwrap_or(0)
    };
    (with_slot, held_by_full)
}

/// A hot prefix's copies: its home, then the first replicas of its order
/// over every candidate (`all`, full or not), up to `hot.copies`; none for a
/// prefix kept on one replica.
fn copies_of(
    key: u64,
    hot: &Hot,
    all_nodes: &[rendezvous::Node],
    all: &[Arc<Replica>],
) -> Vec<ReplicaId> {
    if hot.copies <= 1 {
        return Vec::new();
    }
    let mut order = rendezvous::order(key, all_nodes);
    if let Some(h) = hot.home {
        order.retain(|&i| i != h);
        order.insert(0, h);
    }
    order.iter().take(hot.copies).map(|&i| all[i].id).collect()
}

/// Each candidate's scoring input: what is ahead of the request there, its
/// rates, what it holds (a copy of the prefix at least its shared part),
/// what it keeps (the home; what it holds now, evicted before the
/// request's turn or not), its cache room, its rank in the rendezvous
/// order on the prefix's `key` (the tie-break) and what a LoRA request
/// waits for there.
fn candidates(
    router: &Router,
    key: u64,
    cands: &[Arc<Replica>],
    views: &HashMap<ReplicaId, ReplicaView>,
    held: &[Holding],
    facts: &PrefixFacts,
    waits: &HashMap<ReplicaId, AdapterWait>,
) -> Vec<Candidate> {
    let ordered: Vec<ReplicaView> = cands.iter().map(|r| views[&r.id]).collect();
    let ahead = score::requests_ahead(&ordered, router.max_age_ms);
    let order = rendezvous::order(key, &router.affinity.nodes(cands));
    let mut rank = vec![0; cands.len()];
    for (pos, &i) in order.iter().enumerate() {
        rank[i] = pos;
    }
    (0..cands.len())
        .map(|i| Candidate {
            ahead: ahead[i],
            rates: ordered[i].rates,
            prefilling: ordered[i].prefilling,
            queued_tokens: ordered[i].uncached_prefill,
            cached_tokens: if facts.copies.contains(&cands[i].id) {
                held[i].cached.max(facts.shared)
            } else {
                held[i].cached
            },
            // What it keeps for the prefix: its home's part, and what it
            // holds now even if the requests queued there evict it first.
            kept_tokens: if facts.home == Some(cands[i].id) {
                facts.kept.max(held[i].held_now)
            } else {
                held[i].held_now
            },
            room_tokens: held[i].room,
            rank: rank[i],
            adapter: waits.get(&cands[i].id).copied().unwrap_or_default(),
        })
        .collect()
}

/// Whether candidate `i`, which won, would win without what it is counted
/// as keeping (a home that won only for that is noted as such).
fn wins_as_held(router: &Router, prompt_len: u64, scored: &[Candidate], i: usize) -> bool {
    if scored[i].kept_tokens <= scored[i].cached_tokens {
        return true;
    }
    let as_held: Vec<Candidate> = scored
        .iter()
        .map(|c| Candidate {
            kept_tokens: 0,
            ..*c
        })
        .collect();
    score::best(&router.cost, prompt_len, &as_held).map(|b| b.0) == Some(i)
}

/// How many replicas should hold the prefix `key`, and what its arrivals
/// share ([`super::prefix::hot`]): one copy when replication is off or the
/// prefix's demand fits one replica.
fn hot_of(
    router: &Router,
    key: u64,
    blocks: &[u64],
    cands: &[Arc<Replica>],
    nodes: &[rendezvous::Node],
    views: &HashMap<ReplicaId, ReplicaView>,
    now_ms: u64,
) -> Hot {
    let Some(hot) = &router.state.hot else {
        return Hot {
            copies: 1,
            shared_blocks: 0,
            home: None,
        };
    };
    let in_flight = cands.iter().map(|r| views[&r.id].in_flight).sum();
    hot.arrive_blocks(key, blocks, now_ms, in_flight, nodes)
}

/// `hash` mode with homes: the home of prefix `key` among `cands` (an index
/// into them), its arrival counted; `None` without homes (in `hash` mode
/// the demand tracker exists only for homes).
pub(super) fn home_of(
    router: &Router,
    key: u64,
    cands: &[Arc<Replica>],
    views: &HashMap<ReplicaId, ReplicaView>,
    now_ms: u64,
) -> Option<usize> {
    // No tracker, no homes: and no candidate nodes built per request.
    router.state.hot.as_ref()?;
    let nodes = router.affinity.nodes(cands);
    hot_of(router, key, &[], cands, &nodes, views, now_ms).home
}

/// `hash` mode: no scoring, but the prompt's blocks are recorded on the
/// replica it goes to, and what each candidate will report cached is
/// predicted from them (the closed-loop metrics).
pub(super) fn record_for_prediction(
    router: &Router,
    d: &mut Decision,
    cands: &[Arc<Replica>],
    views: &HashMap<ReplicaId, ReplicaView>,
    model: &str,
    tokens: &[u32],
    key: &CacheKey,
) {
    let bs = router.prefix.block_size;
    let blocks = block_hashes_keyed(model, tokens, bs, key);
    for r in cands {
        if let Some(i) = router.state.indexes.get(&r.id) {
            i.observe_restarts(r.restarts());
            fit_to_replica(i, &views[&r.id], bs);
        }
    }
    d.predicted = predict::from_sent(&router.state.indexes, cands, &blocks, tokens.len(), bs);
    d.record = Some(Recorded {
        indexes: Arc::clone(&router.state.indexes),
        blocks,
        block_size: bs,
    });
}

/// Bounds a replica's index to the KV capacity it reports, in the index's
/// blocks of `block_size` tokens.
fn fit_to_replica(index: &BlockIndex, view: &ReplicaView, block_size: usize) {
    if let Some(tokens) = view.load.and_then(|l| l.kv_capacity_tokens) {
        index.fit((tokens / block_size.max(1) as u64) as usize);
    }
}

/// The prompt tokens each candidate probably holds: from its KV events in
/// `exact` mode when they are known, else from what llmlb sent it.
struct Holdings {
    by_replica: HashMap<ReplicaId, Holding>,
    /// What each replica should report cached (see [`predict::cap`]).
    predicted: Vec<(ReplicaId, u64)>,
}

/// What one candidate probably holds.
#[derive(Debug, Clone, Copy, Default)]
struct Holding {
    /// Prompt tokens cached there.
    cached: u64,
    /// Whether `cached` is estimated from what llmlb sent rather than
    /// reported by the replica's events.
    estimated: bool,
    /// Empty cache room in tokens, when the replica's capacity is known.
    room: Option<u64>,
    /// `exact`, from the replica's events: prompt tokens it holds or has
    /// been sent now, counting those the requests queued there will evict
    /// before this one's turn (0 otherwise). The cost counts them as kept.
    held_now: u64,
}

impl Holdings {
    fn new(
        router: &Router,
        tokens: &[u32],
        key: &CacheKey,
        blocks: &[u64],
        cands: &[Arc<Replica>],
        views: &HashMap<ReplicaId, ReplicaView>,
    ) -> Holdings {
        let exact = router.prefix.mode == PrefixMode::Exact;
        // Exact-mode hashes, once per block size the replicas report.
        let mut by_size: Vec<(usize, Vec<u64>)> = Vec::new();
        let mut by_replica = HashMap::new();
        let mut predicted = Vec::with_capacity(cands.len());
        for r in cands {
            let held = router.state.held.get(&r.id);
            let index = router.state.indexes.get(&r.id);
            refresh(router, r, held, index, &views[&r.id]);
            let reported = held
                .filter(|h| h.known())
                .and_then(|h| Some((h, h.block_size()?)));
            let capacity = views[&r.id].load.and_then(|l| l.kv_capacity_tokens);
            // Empty room: the reported capacity less what the replica holds
            // and has been sent, by its events when they are known, else by
            // what llmlb sent it.
            let room = match reported {
                Some((h, bs)) => capacity.map(|cap| cap.saturating_sub((h.occupied() * bs) as u64)),
                None => index
                    .and_then(|i| i.room())
                    .map(|blocks| (blocks * router.prefix.block_size) as u64),
            };
            let value = match reported {
                Some((h, bs)) => {
                    let pos = match by_size.iter().position(|(s, _)| *s == bs) {
                        Some(p) => p,
                        None => {
                            by_size.push((bs, keyed_hashes(exact_seed(), tokens, bs, key)));
                            by_size.len() - 1
                        }
                    };
                    let blocks = capacity.map(|cap| (cap / bs as u64) as usize);
                    let m = h.matched_at_turn(&by_size[pos].1, blocks);
                    let tokens = |n: usize| (n * bs) as u64;
                    (tokens(m.at_turn), false, bs, tokens(m.now))
                }
                None => {
                    let bs = router.prefix.block_size;
                    let matched = index.map_or(0, |i| i.matched(blocks));
                    ((matched * bs) as u64, exact, bs, 0)
                }
            };
            let (cached, estimated, bs, held_now) = value;
            predicted.push((r.id, predict::cap(cached, tokens.len(), bs)));
            by_replica.insert(
                r.id,
                Holding {
                    cached,
                    estimated,
                    room,
                    held_now,
                },
            );
        }
        if exact && by_replica.values().all(|h| h.cached == 0) {
            as_last_sent(
                router,
                blocks,
                tokens.len(),
                &mut by_replica,
                &mut predicted,
            );
        }
        Holdings {
            by_replica,
            predicted,
        }
    }

    fn holding(&self, id: ReplicaId) -> Holding {
        self.by_replica.get(&id).copied().unwrap_or_default()
    }
}

/// Empties a restarted replica's record and index (the scrape loop counts
/// restarts; what it held is gone) and bounds its index to its capacity.
fn refresh(
    router: &Router,
    r: &Replica,
    held: Option<&Arc<HeldBlocks>>,
    index: Option<&Arc<BlockIndex>>,
    view: &ReplicaView,
) {
    let restarts = r.restarts();
    if let Some(h) = held {
        h.observe_restarts(restarts);
    }
    if let Some(i) = index {
        i.observe_restarts(restarts);
        fit_to_replica(i, view, router.prefix.block_size);
    }
}

/// `exact` mode, a prompt no replica's events show held or on its way: each
/// candidate counts as holding what llmlb last sent it of the prompt
/// (its index, bounded by the replica's reported capacity), an estimate.
/// A prefix evicted everywhere then goes back where it was last sent
/// rather than to the shortest queue, so each replica keeps seeing the
/// same few prefixes, as in `cache` mode, and holds more of them. What is
/// predicted for each (`predicted`) follows what it is scored on.
fn as_last_sent(
    router: &Router,
    blocks: &[u64],
    prompt_len: usize,
    by_replica: &mut HashMap<ReplicaId, Holding>,
    predicted: &mut [(ReplicaId, u64)],
) {
    let bs = router.prefix.block_size;
    for (id, p) in predicted {
        let matched = router
            .state
            .indexes
            .get(id)
            .map_or(0, |i| i.matched(blocks));
        if let (Some(h), true) = (by_replica.get_mut(id), matched > 0) {
            h.cached = (matched * bs) as u64;
            h.estimated = true;
            *p = predict::cap(h.cached, prompt_len, bs);
        }
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;

    use crate::pool::test_fleet::{
        dispatch_chat, dispatch_chat_with_branches, hold_hot_prompt, hot_prompt_chat, input,
        pool_of, route,
    };
    use crate::routing::prefix::blocks::block_hashes;
    use crate::routing::{Prompt, RouteBranch, RouteInput};
    use crate::tokenize::ChatMessage;

    #[test]
    fn cache_mode_prefers_warm_until_its_queue_costs_more_than_the_prefill() {
        let t = pool_of("[pools.prefix]\nmode = \"cache\"", 2);
        let pool = &t.pools()[0];
        let headers = HeaderMap::new();
        let long = "All answers must be in formal English and cite the policy section. ".repeat(60);
        let chat = vec![
            ChatMessage::new("system", long),
            ChatMessage::new("user", "hello"),
        ];
        let go = || route(pool, &input(&headers, None, Prompt::Chat(&chat)));
        let first = go();
        assert_eq!(first.branches, vec![RouteBranch::PrefixMiss]);
        let home = first.preferred.clone().unwrap()[0];
        let home_replica = pool.replicas.iter().find(|r| r.id == home).unwrap();
        let _sent = first.dispatched(home_replica);
        let d = go();
        assert_eq!(
            (d.branches.clone(), d.preferred.clone()),
            (vec![RouteBranch::PrefixHit], Some(vec![home]))
        );
        // Load the warm replica until a cold one is faster.
        let mut guards = Vec::new();
        let overflowed = loop {
            guards.push(home_replica.acquire());
            let d = go();
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

    /// A prompt's cached prefix takes no more KV room only while a request
    /// in flight there carries it: vLLM counts a cached block no running
    /// request uses as free, and takes it again for the next request.
    #[test]
    fn a_cached_prefix_is_kept_out_of_the_kv_tokens_sent_only_while_carried() {
        let t = pool_of("[pools.prefix]\nmode = \"cache\"", 1);
        let pool = &t.pools()[0];
        let replica = &pool.replicas[0];
        replica.store_load(crate::replica::LoadSnapshot {
            taken_at_ms: 1,
            ..Default::default()
        });
        let headers = HeaderMap::new();
        let (_, chat) = short_and_long_chats();
        let prompt = pool.router.prompt_tokens(Prompt::Chat(&chat)).len() as u64;
        let cached = (prompt - 1) / 16 * 16;
        let since = || replica.scraped_load(1).unwrap().tokens_since;
        let send = || {
            let d = route(pool, &input(&headers, None, Prompt::Chat(&chat)));
            let mut guard = replica.acquire_tokens(prompt, 10);
            let _ = d.dispatched_with(&mut guard);
            guard
        };
        let first = send();
        assert_eq!(since(), prompt + 10);
        let second = send();
        assert_eq!(since(), 2 * (prompt + 10) - cached, "carried by the first");
        drop((first, second));
        let _third = send();
        assert_eq!(
            since(),
            3 * (prompt + 10) - cached,
            "cached, carried by none"
        );
    }

    /// The whole routing stage (real indexes, real in-flight guards) under
    /// one dominant system prompt: 8 replicas, each request held for the
    /// time of 80 arrivals. Once warm, no replica holds more than 1.5× the
    /// mean in-flight load, and the prompt lives on every replica.
    #[test]
    fn dominant_system_prompt_is_no_hot_spot() {
        let t = pool_of("[pools.prefix]\nmode = \"cache\"", 8);
        let pool = &t.pools()[0];
        let system =
            "You are the assistant of a large online shop; follow the policy. ".repeat(120);
        let mut held: std::collections::VecDeque<crate::replica::InFlightGuard> =
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
            let r = dispatch_chat(pool, &chat);
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
    fn the_index_lists_no_more_than_the_replica_reports_room_for() {
        use crate::replica::LoadSnapshot;
        let t = pool_of("[pools.prefix]\nmode = \"cache\"", 2);
        let pool = &t.pools()[0];
        let chat = hot_prompt_chat(0);
        let r = dispatch_chat(pool, &chat);
        let headers = HeaderMap::new();
        let predicted = || {
            route(pool, &input(&headers, None, Prompt::Chat(&chat)))
                .predicted_for(r.id)
                .unwrap()
        };
        let whole = predicted();
        assert!(whole > 200, "{whole}");
        // The replica reports a cache of 64 tokens (4 blocks of 16): its
        // index keeps the prompt's first 4 blocks, the tail goes first.
        r.store_load(LoadSnapshot {
            kv_capacity_tokens: Some(64),
            taken_at_ms: 1,
            ..LoadSnapshot::default()
        });
        assert_eq!(predicted(), 64);
        assert_eq!(pool.router.index(r.id).unwrap().len(), 4);
    }

    #[test]
    fn with_homes_prefixes_that_prefer_one_replica_are_spread() {
        let chat = |p: usize, q: usize| {
            vec![
                ChatMessage::new(
                    "system",
                    format!("Desk {p}: answer with the rules. ").repeat(40),
                ),
                ChatMessage::new("user", format!("Case {q}?")),
            ]
        };
        // Eight prefixes whose rendezvous order starts with the same
        // replica: without homes, each goes there (fresh pool each time).
        let plain = |p: usize| {
            let t = pool_of("[pools.prefix]\nmode = \"cache\"", 2);
            let first = t.pools()[0].replicas[0].id;
            dispatch_chat(&t.pools()[0], &chat(p, 0)).id == first
        };
        let prefixes: Vec<usize> = (0..).filter(|&p| plain(p)).take(8).collect();
        // With homes, at most a quarter over an even split by demand, and
        // each prefix's next request, with nothing cached left (no room
        // reported), goes back where its first went.
        let t = pool_of("[pools.prefix]\nmode = \"cache\"\nhomes = true", 2);
        let pool = &t.pools()[0];
        let first: Vec<_> = prefixes
            .iter()
            .map(|&p| dispatch_chat(pool, &chat(p, 0)).id)
            .collect();
        let on_first = first
            .iter()
            .filter(|&&id| id == pool.replicas[0].id)
            .count();
        assert!(
            (3..=5).contains(&on_first),
            "{on_first} of 8 on the replica all prefer"
        );
        for r in &pool.replicas {
            r.store_load(crate::replica::LoadSnapshot {
                kv_capacity_tokens: Some(16),
                taken_at_ms: 1,
                ..Default::default()
            });
        }
        for (&p, id) in prefixes.iter().zip(&first) {
            let (r, branches) = dispatch_chat_with_branches(pool, &chat(p, 1));
            assert_eq!(r.id, *id, "prefix {p}: {branches:?}");
        }
    }

    #[test]
    fn hash_mode_with_homes_spreads_prefixes_and_keeps_each_at_home() {
        let chat = |p: usize, q: usize| {
            vec![
                ChatMessage::new("system", format!("Desk {p}: answer with the rules.")),
                ChatMessage::new("user", format!("Case {q}?")),
            ]
        };
        // Eight system prompts whose rendezvous order starts with the same
        // replica: plain `hash` sends all eight there.
        let plain = pool_of("[pools.prefix]\nmode = \"hash\"", 2);
        let prefixes: Vec<usize> = (0..)
            .filter(|&p| {
                dispatch_chat(&plain.pools()[0], &chat(p, 0)).id == plain.pools()[0].replicas[0].id
            })
            .take(8)
            .collect();
        let t = pool_of("[pools.prefix]\nmode = \"hash\"\nhomes = true", 2);
        let pool = &t.pools()[0];
        let first = pool.replicas[0].id;
        let homes: Vec<_> = prefixes
            .iter()
            .map(|&p| dispatch_chat(pool, &chat(p, 0)).id)
            .collect();
        let on_first = homes.iter().filter(|&&id| id == first).count();
        assert!(
            (3..=5).contains(&on_first),
            "{on_first} of 8 on the replica all prefer"
        );
        // Every later request of a prefix goes to its home.
        for (&p, home) in prefixes.iter().zip(&homes) {
            for q in 1..4 {
                let (r, branches) = dispatch_chat_with_branches(pool, &chat(p, q));
                assert_eq!(r.id, *home, "prefix {p}: {branches:?}");
                assert_eq!(branches, vec![RouteBranch::PrefixHit]);
            }
        }
    }

    /// The most requests one replica holds once one long prompt brings all
    /// the traffic to 4 replicas, 12 in flight at a time.
    fn busiest_under_one_hot_prompt(settings: &str) -> (u64, Vec<RouteBranch>) {
        let t = pool_of(settings, 4);
        let pool = &t.pools()[0];
        let mut held = std::collections::VecDeque::new();
        let mut busiest = 0;
        let mut last = Vec::new();
        for i in 0..300 {
            if held.len() == 12 {
                held.pop_front();
            }
            let (r, branches) = dispatch_chat_with_branches(pool, &hot_prompt_chat(i));
            held.push_back(r.acquire());
            if i >= 100 {
                busiest = busiest.max(pool.replicas.iter().map(|r| r.in_flight()).max().unwrap());
            }
            last = branches;
        }
        (busiest, last)
    }

    #[test]
    fn a_hot_prefix_is_kept_on_several_replicas_before_a_queue_builds() {
        // Without replication a cold replica is tried only when a warm
        // one's queue costs as much as the prefill it would repeat (about
        // 10 requests of 0.02 s against 0.2 s): two warm replicas carry
        // the 12 requests and two stay idle.
        let (alone, _) = busiest_under_one_hot_prompt("[pools.prefix]\nmode = \"cache\"");
        assert!(alone >= 6, "busiest {alone}");
        // With it, the prompt is a replica's worth of demand several times
        // over: its copies share the 12 requests by queue.
        let (spread, branches) = busiest_under_one_hot_prompt(
            "[pools.prefix]\nmode = \"cache\"\nreplicate = true\nreplicate_above = 2",
        );
        assert!(
            spread <= 4,
            "busiest {spread} (without replication {alone})"
        );
        assert!(
            branches.contains(&RouteBranch::PrefixReplicated),
            "{branches:?}"
        );
    }

    #[test]
    fn the_pool_reports_its_replicated_prefixes() {
        let t = pool_of(
            "[pools.prefix]\nmode = \"cache\"\nreplicate = true\nreplicate_above = 2",
            4,
        );
        let pool = &t.pools()[0];
        assert_eq!(pool.router.replication().unwrap().prefixes, 0);
        let _held = hold_hot_prompt(pool, 40);
        let r = pool.router.replication().unwrap();
        assert_eq!(r.prefixes, 1);
        assert!(r.extra_copies >= 2, "{r:?}");
        let off = pool_of("[pools.prefix]\nmode = \"cache\"", 4);
        assert!(off.pools()[0].router.replication().is_none());
    }

    #[test]
    fn cache_mode_skips_a_warm_replica_at_its_concurrency_limit() {
        let t = pool_of("max_inflight = 1\n[pools.prefix]\nmode = \"cache\"", 2);
        let pool = &t.pools()[0];
        let headers = HeaderMap::new();
        let prompt = "Summarise the attached contract clause by clause. ".repeat(30);
        let go = || route(pool, &input(&headers, None, Prompt::Text(&prompt)));
        let first = go();
        let home = first.preferred.clone().unwrap()[0];
        let home_replica = pool.replicas.iter().find(|r| r.id == home).unwrap();
        let _sent = first.dispatched(home_replica);
        let _full = home_replica.acquire();
        let d = go();
        assert_ne!(d.preferred, Some(vec![home]));
        assert_eq!(d.branches, vec![RouteBranch::PrefixOverflow]);
    }

    /// What the queue's prefix handoff reads: the prompt tokens the warm
    /// replica caches while it has a free slot, nothing once it is full
    /// (the slot that frees is elsewhere) or for another prompt.
    #[test]
    fn cached_where_free_counts_only_replicas_with_a_free_slot() {
        let t = pool_of("max_inflight = 1\n[pools.prefix]\nmode = \"cache\"", 2);
        let pool = &t.pools()[0];
        let router = &pool.router;
        let headers = HeaderMap::new();
        let prompt = "Summarise the attached contract clause by clause. ".repeat(30);
        let first = route(pool, &input(&headers, None, Prompt::Text(&prompt)));
        let home = first.preferred.clone().unwrap()[0];
        let home_replica = pool.replicas.iter().find(|r| r.id == home).unwrap();
        let _sent = first.dispatched(home_replica);
        let key = router.key_of("m", None);
        let tokens = router.prompt_tokens(Prompt::Text(&prompt));
        let other = router.prompt_tokens(Prompt::Text(&"Translate the menu. ".repeat(60)));
        let cached = |ids: &[u32]| router.cached_where_free(&pool.replicas, "m", ids, &key, 1);
        let warm = cached(&tokens);
        assert!(
            warm >= 128 && warm <= tokens.len() as u64,
            "{warm} of {}",
            tokens.len()
        );
        assert_eq!(cached(&other), 0);
        let _full = home_replica.acquire();
        assert_eq!(cached(&tokens), 0);
    }

    /// A chat of a system prompt repeated 40 times and a question.
    fn long_chat(system: &str, q: &str) -> Vec<ChatMessage> {
        vec![
            ChatMessage::new("system", system.repeat(40)),
            ChatMessage::new("user", q.to_string()),
        ]
    }

    /// A chat, and another whose system prompt is three times as long:
    /// with room for the first and 4 blocks more, the second alone
    /// overfills the cache.
    fn short_and_long_chats() -> (Vec<ChatMessage>, Vec<ChatMessage>) {
        let short = long_chat("Answer in the customer's language. ", "where is it?");
        let long = long_chat(
            &"Summarise the ticket history before proposing a refund. ".repeat(3),
            "refund?",
        );
        (short, long)
    }

    /// A batch of one event: the replica stored blocks `keys` (its own
    /// hashes) holding `tokens`, 16 a block.
    fn stored(keys: std::ops::Range<u64>, tokens: &[u32]) -> crate::kv_events::EventBatch {
        use crate::kv_events::{BlockKey, EventBatch, KvEvent};
        EventBatch {
            ts: 0.0,
            events: vec![KvEvent::BlockStored {
                block_hashes: keys.map(BlockKey).collect(),
                parent_block_hash: None,
                token_ids: tokens.to_vec(),
                block_size: 16,
                lora_name: None,
                medium: None,
                extra_keys: Vec::new(),
            }],
            dp_rank: None,
        }
    }

    /// Every replica's record known, the block size (16) told by a block
    /// of another prompt.
    fn known_records(pool: &crate::pool::Pool) {
        use crate::kv_events::subscriber::EventSink;
        for r in &pool.replicas {
            let held = pool.router.held(r.id).unwrap();
            held.caught_up();
            held.apply(&stored(1..2, &[7; 16]));
        }
    }

    /// One `exact` pool of two replicas, each naming its KV-event endpoint.
    fn exact_topology() -> crate::pool::Topology {
        use crate::pool::test_fleet::{replicas, topology};
        topology(&format!(
            "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n[pools.prefix]\nmode = \"exact\"\n{}",
            replicas(2, |i| format!(
                "kv_events = \"tcp://127.0.0.1:{}\"",
                5557 + i
            ))
        ))
    }

    #[test]
    fn exact_mode_counts_a_prompt_sent_and_not_yet_stored_until_its_request_ends() {
        let t = exact_topology();
        let pool = &t.pools()[0];
        // Both records known and empty of this prompt.
        known_records(pool);
        let headers = HeaderMap::new();
        let long = "Reply in the customer's language and quote the order number. ".repeat(40);
        let chat = |q: &str| {
            vec![
                ChatMessage::new("system", long.clone()),
                ChatMessage::new("user", q.to_string()),
            ]
        };
        let at = |q: &str, now_ms: u64| {
            pool.router
                .route(
                    &pool.replicas,
                    &input(&headers, None, Prompt::Chat(&chat(q))),
                    0,
                    now_ms,
                )
                .unwrap()
        };
        let first = at("hello", 1);
        assert_eq!(first.branches, vec![RouteBranch::PrefixMiss]);
        let home = first.preferred.clone().unwrap()[0];
        let replica = pool.replicas.iter().find(|r| r.id == home).unwrap();
        let sent = first
            .dispatched(replica)
            .sent
            .expect("exact mode expects the prompt");
        // A minute later its prefill has still not been reported (a long
        // queue): the prefix on its way there still counts.
        let second = at("how are you", 60_000);
        assert_eq!(second.preferred, Some(vec![home]));
        assert_eq!(second.branches, vec![RouteBranch::PrefixHit]);
        // The request ended without the replica ever reporting the blocks:
        // no replica's events show the prefix, so the next request goes
        // where it was last sent, on llmlb's estimate.
        drop(sent);
        let third = at("goodbye", 60_001);
        assert_eq!(third.preferred, Some(vec![home]));
        assert_eq!(
            third.branches,
            vec![RouteBranch::PrefixHit, RouteBranch::PrefixEstimated]
        );
        // And predicts, for the closed loop, what it scored.
        assert!(third.predicted_for(home).unwrap() > 0);
    }

    /// Both replicas of an `exact` pool known, with room for the old
    /// prompt's blocks and `slack` blocks more (one holds another block);
    /// the first has stored the old prompt's blocks, its request ended.
    /// Returns the old prompt and its tokens.
    fn old_prefix_on_the_first(
        pool: &crate::pool::Pool,
        slack: usize,
    ) -> (Vec<ChatMessage>, Vec<u32>) {
        use crate::kv_events::subscriber::EventSink;
        let old = long_chat(
            "Quote the order number and answer in the customer's language. ",
            "where is it?",
        );
        let headers = HeaderMap::new();
        let d = route(pool, &input(&headers, None, Prompt::Chat(&old)));
        let old_tokens = d.expect.as_ref().unwrap().tokens.clone();
        let blocks = old_tokens.len() / 16;
        known_records(pool);
        for r in &pool.replicas {
            r.store_load(crate::replica::LoadSnapshot {
                kv_capacity_tokens: Some(((blocks + slack) * 16) as u64),
                taken_at_ms: 1,
                ..Default::default()
            });
        }
        let held = pool.router.held(pool.replicas[0].id).unwrap();
        held.apply(&stored(
            100..100 + blocks as u64,
            &old_tokens[..blocks * 16],
        ));
        (old, old_tokens)
    }

    /// A chat whose system prompt is `repeats` sentences × 40.
    fn refund_chat(repeats: usize) -> Vec<ChatMessage> {
        long_chat(
            &"Summarise the ticket history before proposing a refund. ".repeat(repeats),
            "refund?",
        )
    }

    /// A replica near capacity whose old prefix the prompts queued there
    /// will evict before the next request of that prefix runs is not
    /// preferred for it when what is queued costs more than the prefix
    /// saves: the blocks it reports are doomed.
    #[test]
    fn exact_mode_does_not_prefer_a_replica_about_to_evict_the_prefix() {
        let t = exact_topology();
        let pool = &t.pools()[0];
        let headers = HeaderMap::new();
        let at = |c: &[ChatMessage]| route(pool, &input(&headers, None, Prompt::Chat(c)));
        // Room for the old prefix and a few blocks more.
        let (old, old_tokens) = old_prefix_on_the_first(pool, 4);
        assert!(old_tokens.len() / 16 >= 30, "a long prompt");
        let new = refund_chat(3);
        let (warm, cold) = (&pool.replicas[0], &pool.replicas[1]);
        let d = at(&old);
        assert_eq!(d.preferred, Some(vec![warm.id]));
        assert_eq!(d.branches, vec![RouteBranch::PrefixHit]);
        // A request of another, longer prompt is sent there and holds its
        // turn: its blocks will push the old prefix out.
        let _busy = warm.acquire();
        let sent = at(&new);
        assert!(sent.expect.as_ref().unwrap().tokens.len() > old_tokens.len());
        let _sent = sent.dispatched(warm);
        let d = at(&old);
        assert_eq!(d.preferred, Some(vec![cold.id]), "{:?}", d.branches);
        assert_eq!(d.predicted_for(warm.id), Some(0));
    }

    /// Where the prompt queued on the replica evicts most of the old
    /// prefix, only its beginning is predicted cached there, but the
    /// replica still counts as keeping the whole prefix: the request goes
    /// back there and stores it again, rather than copying it to the cold
    /// replica, while the queue there costs less than the prefix saves.
    #[test]
    fn exact_mode_keeps_a_prefix_where_it_lives_though_its_tail_will_be_evicted() {
        let t = exact_topology();
        let pool = &t.pools()[0];
        let headers = HeaderMap::new();
        let at = |c: &[ChatMessage]| route(pool, &input(&headers, None, Prompt::Chat(c)));
        // Room for the old prefix and one block more; a shorter prompt
        // queued there.
        let (old, old_tokens) = old_prefix_on_the_first(pool, 1);
        let new = refund_chat(1);
        let (warm, cold) = (&pool.replicas[0], &pool.replicas[1]);
        let _sent = at(&new).dispatched(warm);
        let d = at(&old);
        let predicted = d.predicted_for(warm.id).unwrap();
        assert!(
            predicted > 0 && predicted < old_tokens.len() as u64 / 4,
            "most of the prefix is doomed: {predicted}"
        );
        assert_eq!(d.preferred, Some(vec![warm.id]), "{:?}", d.branches);
        // Four more requests there cost more than the prefix saves.
        let _busy: Vec<_> = (0..4).map(|_| warm.acquire()).collect();
        let d = at(&old);
        assert_eq!(d.preferred, Some(vec![cold.id]), "{:?}", d.branches);
    }

    /// A replica whose requests in flight carry more than its cache holds
    /// counts only the blocks of those that end last: a prefix only a
    /// request ending earlier carries there is a miss there, even while
    /// that request waits.
    #[test]
    fn exact_mode_counts_only_the_requests_ending_last_where_more_is_in_flight_than_fits() {
        use crate::replica::LoadSnapshot;
        let t = exact_topology();
        let pool = &t.pools()[0];
        let headers = HeaderMap::new();
        let (old, new) = short_and_long_chats();
        let at = |c: &[ChatMessage]| route(pool, &input(&headers, None, Prompt::Chat(c)));
        let old_tokens = at(&old).expect.as_ref().unwrap().tokens.clone();
        let blocks = old_tokens.len() / 16;
        let (warm, cold) = (&pool.replicas[0], &pool.replicas[1]);
        known_records(pool);
        for r in &pool.replicas {
            r.store_load(LoadSnapshot {
                kv_capacity_tokens: Some(((blocks + 4) * 16) as u64),
                taken_at_ms: 1,
                ..LoadSnapshot::default()
            });
        }
        // A request of the old prompt waits there: it counts.
        let _waiting = at(&old).dispatched(warm);
        assert!(at(&old).predicted_for(warm.id).unwrap() > 0);
        // A later one of a prompt longer than the whole cache: by a new
        // request's turn the old prompt will be gone.
        let _newer = at(&new).dispatched(warm);
        let d = at(&old);
        assert_eq!(d.predicted_for(warm.id), Some(0));
        assert_eq!(d.preferred, Some(vec![cold.id]), "{:?}", d.branches);
    }

    /// A request that does not bound its answer is expected to answer as
    /// long as the replica's answers are, once learned (256 tokens before).
    #[test]
    fn a_request_without_max_tokens_ends_after_the_learned_answer_length() {
        use crate::replica::{EngineTiming, LoadSnapshot};
        // Whether a prompt sent without `max_tokens`, then a longer one
        // asking for 64 tokens, both to a replica whose requests in flight
        // then carry more than it holds, still counts there; `answers`: the
        // replica's finished requests' mean output length, when learned.
        let first_counts = |answers: Option<f64>| {
            let t = exact_topology();
            let pool = &t.pools()[0];
            let headers = HeaderMap::new();
            let (old, new) = short_and_long_chats();
            let at = |c: &[ChatMessage], max_tokens| {
                let input = RouteInput {
                    max_tokens,
                    ..input(&headers, None, Prompt::Chat(c))
                };
                route(pool, &input)
            };
            let blocks = at(&old, None).expect.as_ref().unwrap().tokens.len() / 16;
            known_records(pool);
            // 0.1 s a decode step and, when given, the answer length.
            let timing = |n: f64| EngineTiming {
                inter_token_seconds: Some(10.0 * n),
                inter_tokens: Some(100.0 * n),
                output_tokens: answers.map(|a| a * n),
                finished_requests: answers.map(|_| n),
                ..EngineTiming::default()
            };
            for r in &pool.replicas {
                let load = |n: f64| LoadSnapshot {
                    timing: timing(n),
                    kv_capacity_tokens: Some(((blocks + 4) * 16) as u64),
                    taken_at_ms: 1,
                    ..LoadSnapshot::default()
                };
                r.learned.observe(&load(0.0), &load(1.0));
                r.store_load(load(1.0));
            }
            let warm = &pool.replicas[0];
            let _unbounded = at(&old, None).dispatched(warm);
            let _bounded = at(&new, Some(64)).dispatched(warm);
            at(&old, None).predicted_for(warm.id).unwrap() > 0
        };
        assert!(
            first_counts(None),
            "256 tokens: it ends after the 64-token one"
        );
        assert!(!first_counts(Some(8.0)), "8 tokens: it ends first");
    }
}

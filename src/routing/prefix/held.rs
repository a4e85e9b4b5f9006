//! `exact` mode's record of what one replica really holds in its prefix
//! cache, built from the replica's own KV-cache events
//! ([`crate::kv_events`]), not from what llmlb sent it.
//!
//! Every stored block is keyed by llmlb's own chained hash of its token ids
//! ([`super::blocks::chain_keyed`], seeded by [`super::blocks::exact_seed`]),
//! so a prompt routed later is hashed the same way and vLLM's hash algorithm
//! and seed never have to match. vLLM's hash is kept only in a map to
//! llmlb's, to apply `BlockRemoved`. What else vLLM keyed a block with
//! enters llmlb's hash as [`CacheKey`] does for a prompt: the event's
//! `lora_name` every block, the `cache_salt` in its `extra_keys` a prompt's
//! first block; so a block stored under an adapter or a salt matches only
//! prompts of that adapter or salt. Blocks keyed by what a request cannot
//! reproduce (multimodal items, prompt embeddings) are skipped, as are blocks
//! whose parent is not known (they cannot be chained, and a prefix match
//! could not reach them anyway). The adapter names seen are kept
//! ([`HeldBlocks::has_adapter`]).
//!
//! **Known or not.** The record is *known* when llmlb has seen every event
//! since the replica's cache was empty (the first message had sequence 0, a
//! replay filled the history, `AllBlocksCleared`, or a restart). After a
//! missed stretch (a sequence gap or a late start without replay) it is a
//! lower bound only: it turns *unknown* until the replica has stored as many
//! blocks as the record held at most before (or `capacity` when it never
//! held any), by which time its LRU cache has turned over. The router scores
//! unknown replicas from its `cache`-mode estimate instead (see
//! `routing::cache`). A replica restart (the scrape loop saw its prefix-cache
//! counter go down, or its event sequence starts again) empties the record, which
//! is then known: a fresh replica's cache is empty.
//!
//! **Sent, not yet stored.** The blocks of a prompt llmlb has sent to a
//! replica count as held there from the moment it is sent until the
//! replica's `BlockStored` reports them, or the request ends (answered,
//! failed, cut off: the [`Expected`] handle the sender keeps is dropped).
//! When queues are long a request waits seconds in the replica's own queue
//! before its prefill stores anything; meanwhile the next request of the
//! same conversation or system prompt sees its prefix on its way and
//! follows it instead of being costed as a miss everywhere and scattered.
//! Sent blocks are keyed as the prompt is (adapter, salt), kept apart from
//! the reported ones ([`HeldBlocks::snapshot`] does not list them), counted
//! once per block however many requests carry it, and bounded by
//! `capacity` too. Prompts sent before any event told the block size are
//! kept as tokens ([`EARLY_TOKENS`]) and hashed into the sent blocks by
//! that first event. A reported block the replica evicts while a request
//! llmlb has in flight there carries it counts as sent again: that request
//! has not run yet (vLLM evicts only blocks no running request uses), and
//! it will compute the block again. Reported and sent blocks together are
//! what the replica will hold, which is also what the eviction charge
//! measures the empty room against ([`HeldBlocks::occupied`]).
//!
//! **Minus what it will evict.** Reported blocks the replica will evict to
//! make room for what it has been sent, before a request placed now gets
//! its turn, do not count ([`super::evict_order`]: the oldest blocks no
//! request in flight carries, once reported plus sent exceed the
//! replica's capacity).
//!
//! **More in flight than fits.** When the requests in flight there carry
//! more distinct blocks than the replica's capacity, not all of them will
//! still be cached when a request placed now runs, carried or not: the
//! replica runs the requests ahead as room allows, a running request keeps
//! its blocks until it ends, and each new prompt takes the least recently
//! used. What is left then is what the requests that end last hold. So
//! only the blocks of the requests expected to end last, as many as the
//! capacity holds, count (reported or sent); a request's end is when it was
//! sent plus its expected time to first token there plus its output tokens
//! at the replica's decode step (see `routing::cache`). With answers of one
//! length that is about the newest requests; a long answer sent earlier
//! keeps its prefix counted past shorter ones sent after it
//! ([`super::ending`]).
//!
//! Memory: at most `capacity` blocks (two hash-map entries each, about 64
//! bytes); stores beyond it are dropped and counted, which keeps the record
//! a correct lower bound. Concurrency: one mutex per replica, held for one
//! event batch (by the subscriber task) or one prompt's lookups (by a
//! request), never across an `.await`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// How many prompt tokens sent before the block size is known are kept
/// (1 MiB); later prompts in that moment are not expected.
pub const EARLY_TOKENS: usize = 1 << 18;

use std::collections::HashSet;

use super::blocks::{CacheKey, chain_keyed, exact_seed, keyed_hashes};
use super::cache_index::restart_seen;
use super::evict_order::EvictOrder;
use crate::kv_events::subscriber::EventSink;
use crate::kv_events::{BlockKey, EventBatch, KvEvent, StoredBlocks};

#[derive(Debug)]
pub struct HeldBlocks {
    inner: Mutex<Held>,
}

/// A copy of the record's state, for status, tests and comparisons.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldSummary {
    pub known: bool,
    pub blocks: usize,
    pub block_size: Option<usize>,
    /// Stores dropped because the record was full.
    pub dropped: u64,
    /// Event batches applied.
    pub batches: u64,
    /// Subscriptions made (1 after the first connection, more after reconnects).
    pub subscriptions: u64,
}

/// A prompt sent before the block size was known.
#[derive(Debug)]
struct Early {
    id: u64,
    tokens: Vec<u32>,
    key: CacheKey,
    ends_ms: u64,
}

#[derive(Debug)]
struct Held {
    seed: u64,
    /// llmlb hash → how many of the replica's blocks carry it.
    ours: HashMap<u64, u32>,
    /// The replica's hash → llmlb's.
    theirs: HashMap<BlockKey, u64>,
    block_size: Option<usize>,
    /// Blocks sent and not yet reported → how many requests in flight
    /// carry them.
    pending: HashMap<u64, u32>,
    /// Each request in flight → what it was sent with.
    expecting: HashMap<u64, Sent>,
    /// The reported blocks' last-use order, and what requests in flight carry.
    order: EvictOrder,
    /// Prompts sent before the block size was known, by request, with
    /// their key: hashed into `pending` by the first event that tells it.
    early: Vec<Early>,
    /// The id of the next prompt sent.
    next_id: u64,
    /// LoRA adapter names the replica's events stored blocks under.
    adapters: HashSet<String>,
    capacity: usize,
    /// `None`: known. `Some(n)`: unknown until `n` more blocks are stored.
    refill: Option<usize>,
    high_water: usize,
    dropped: u64,
    batches: u64,
    subscriptions: u64,
    restarts_seen: Option<u64>,
}

/// How many leading blocks of a prompt a replica has, as a pick reads them
/// ([`HeldBlocks::matched_at_turn`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Matched {
    /// Held or on their way, less those the requests queued there will
    /// evict before a request placed now gets its turn.
    pub at_turn: usize,
    /// Held or on their way now, those included. Where the requests in
    /// flight carry more than the capacity, the same as `at_turn` (only
    /// the blocks of those ending last count, now as at the turn).
    pub now: usize,
}

impl HeldBlocks {
    /// An empty record, unknown until the first events say otherwise.
    pub fn new(capacity: usize) -> HeldBlocks {
        let capacity = capacity.max(1);
        HeldBlocks {
            inner: Mutex::new(Held {
                seed: exact_seed(),
                ours: HashMap::new(),
                theirs: HashMap::new(),
                block_size: None,
                pending: HashMap::new(),
                expecting: HashMap::new(),
                order: EvictOrder::default(),
                early: Vec::new(),
                next_id: 0,
                adapters: HashSet::new(),
                capacity,
                refill: Some(capacity),
                high_water: 0,
                dropped: 0,
                batches: 0,
                subscriptions: 0,
                restarts_seen: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        // Worst case after a panic under the lock: a half-applied batch,
        // which the next gap or restart repairs.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the record is complete (see the module docs).
    pub fn known(&self) -> bool {
        self.lock().refill.is_none()
    }

    /// The replica's block size, once an event told it.
    pub fn block_size(&self) -> Option<usize> {
        self.lock().block_size
    }

    /// How many leading blocks of `hashes` (exact-mode hashes) the replica holds.
    pub fn matched(&self, hashes: &[u64]) -> usize {
        let held = self.lock();
        hashes
            .iter()
            .take_while(|h| held.ours.contains_key(h))
            .count()
    }

    /// What [`matched_at_turn`](Self::matched_at_turn) counts at the turn.
    #[cfg(test)]
    pub fn matched_or_sent(&self, hashes: &[u64], capacity: Option<usize>) -> usize {
        self.matched_at_turn(hashes, capacity).at_turn
    }

    /// The leading blocks of `hashes` the replica will hold at a request's
    /// turn: like [`matched`](Self::matched), also counting blocks sent
    /// there and not yet reported, and not counting reported blocks it
    /// will evict before a request placed now runs, with room for
    /// `capacity` blocks (the replica's reported KV cache; `None`: what its
    /// events taught, if anything); when the requests in flight there carry
    /// more than that capacity, only the blocks of those ending last count
    /// (see the module docs). And those it holds or has been sent now, the
    /// ones it will evict first included.
    pub fn matched_at_turn(&self, hashes: &[u64], capacity: Option<usize>) -> Matched {
        let held = self.lock();
        let capacity = capacity.or(held.order.learned_capacity());
        let ending = held.order.carried();
        if let Some(cut) = capacity.and_then(|c| ending.cutoff(c)) {
            let n = hashes
                .iter()
                .take_while(|h| {
                    ending.kept(**h, cut)
                        && (held.pending.contains_key(h) || held.ours.contains_key(h))
                })
                .count();
            return Matched { at_turn: n, now: n };
        }
        let doom = held
            .order
            .doom(held.theirs.len(), held.pending.len(), capacity);
        // One walk: `now` runs while a block is sent or held, `at_turn`
        // stops at the first held one that is doomed.
        let mut at_turn = None;
        let mut now = 0;
        for h in hashes {
            let sent = held.pending.contains_key(h);
            if !sent && !held.ours.contains_key(h) {
                break;
            }
            if at_turn.is_none() && !sent && held.order.doomed(*h, doom) {
                at_turn = Some(now);
            }
            now += 1;
        }
        Matched {
            at_turn: at_turn.unwrap_or(now),
            now,
        }
    }

    /// Blocks the replica reports holding plus those sent and not yet
    /// reported: what it will hold once its queue is prefilled.
    pub fn occupied(&self) -> usize {
        let held = self.lock();
        held.theirs.len() + held.pending.len()
    }

    /// Records that a prompt of these tokens, keyed by `key`, is being sent
    /// to the replica: its blocks count as held there until the replica
    /// reports them or the returned handle is dropped (the request ended).
    /// Before an event has told the block size, the tokens are kept (at
    /// most [`EARLY_TOKENS`] in all) and their blocks count from that event on.
    /// `ends_ms` is when the request should end (module docs, "More in
    /// flight than fits").
    #[must_use = "the prompt counts as sent only while the handle lives"]
    pub fn expect_prompt(
        self: &Arc<Self>,
        tokens: &[u32],
        key: &CacheKey,
        ends_ms: u64,
    ) -> Expected {
        let mut held = self.lock();
        let id = held.next_id;
        held.next_id += 1;
        match held.block_size {
            Some(bs) => {
                let hashes = keyed_hashes(held.seed, tokens, bs, key);
                held.expect(id, &hashes, ends_ms);
            }
            None => {
                let kept: usize = held.early.iter().map(|e| e.tokens.len()).sum();
                if kept + tokens.len() <= EARLY_TOKENS {
                    held.early.push(Early {
                        id,
                        tokens: tokens.to_vec(),
                        key: key.clone(),
                        ends_ms,
                    });
                }
            }
        }
        Expected {
            held: Arc::clone(self),
            id,
        }
    }

    /// Whether the replica's events stored blocks under the LoRA adapter `name`.
    pub fn has_adapter(&self, name: &str) -> bool {
        self.lock().adapters.contains(name)
    }

    pub fn summary(&self) -> HeldSummary {
        let h = self.lock();
        HeldSummary {
            known: h.refill.is_none(),
            blocks: h.theirs.len(),
            block_size: h.block_size,
            dropped: h.dropped,
            batches: h.batches,
            subscriptions: h.subscriptions,
        }
    }

    /// Every llmlb hash held, sorted: two records hold the same view exactly
    /// when these are equal.
    pub fn snapshot(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.lock().ours.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Feeds the replica's restart count (kept by the scrape loop); a
    /// change since the last check means the replica restarted: the record
    /// is emptied (and known). Returns whether it was.
    pub fn observe_restarts(&self, count: u64) -> bool {
        let mut held = self.lock();
        let reset = restart_seen(&mut held.restarts_seen, count);
        if reset {
            held.clear();
        }
        reset
    }
}

/// What one request in flight was sent with.
#[derive(Debug)]
struct Sent {
    /// When it should end.
    ends_ms: u64,
    /// Its blocks counted in `pending`.
    pending: Vec<u64>,
    /// All its prompt's blocks, in order.
    prompt: Vec<u64>,
}

/// A prompt sent to a replica whose blocks count as held there while this
/// lives (see [`HeldBlocks::expect_prompt`]); kept by the request and
/// dropped when it ends.
#[derive(Debug)]
pub struct Expected {
    held: Arc<HeldBlocks>,
    id: u64,
}

impl Drop for Expected {
    fn drop(&mut self) {
        self.held.lock().forget(self.id);
    }
}

impl EventSink for HeldBlocks {
    fn subscribed(&self) {
        self.lock().subscriptions += 1;
    }

    fn apply(&self, batch: &EventBatch) -> u64 {
        let mut held = self.lock();
        held.batches += 1;
        let before = held.dropped;
        let mut evicted_carried = Vec::new();
        for e in &batch.events {
            held.apply(e, &mut evicted_carried);
        }
        held.expect_again(evicted_carried);
        held.dropped - before
    }

    fn restarted(&self) {
        self.lock().clear();
    }

    fn lost(&self) {
        let mut held = self.lock();
        let need = if held.high_water > 0 {
            held.high_water
        } else {
            held.capacity
        };
        held.refill = Some(need.max(1));
    }

    fn caught_up(&self) {
        self.lock().refill = None;
    }
}

impl Held {
    /// Counts `hashes` as sent for request `id`, those not reported
    /// already; when full, the rest are not counted.
    fn expect(&mut self, id: u64, hashes: &[u64], ends_ms: u64) {
        let mut mine = Vec::new();
        for &h in hashes {
            if self.ours.contains_key(&h) {
                continue;
            }
            let full = self.pending.len() >= self.capacity;
            match self.pending.get_mut(&h) {
                Some(n) => *n += 1,
                None if full => break,
                None => {
                    self.pending.insert(h, 1);
                }
            }
            mine.push(h);
        }
        self.order.carry((ends_ms, id), hashes);
        self.expecting.insert(
            id,
            Sent {
                ends_ms,
                pending: mine,
                prompt: hashes.to_vec(),
            },
        );
    }

    /// Request `id` ended: its blocks no longer count as sent (those still
    /// carried by another request do).
    fn forget(&mut self, id: u64) {
        self.early.retain(|e| e.id != id);
        let Some(sent) = self.expecting.remove(&id) else {
            return;
        };
        self.order.release((sent.ends_ms, id), &sent.prompt);
        for h in sent.pending {
            if let Some(n) = self.pending.get_mut(&h) {
                *n -= 1;
                if *n == 0 {
                    self.pending.remove(&h);
                }
            }
        }
    }

    /// The replica evicted reported blocks (`evicted_carried`, in one
    /// batch) while requests llmlb has in flight there carried them. A
    /// request's blocks cannot be evicted while it runs, so those requests
    /// are waiting (or were preempted) and will compute the blocks again:
    /// each counts as sent for as long as they are in flight. One pass over
    /// the requests in flight per batch, whatever the number of blocks.
    fn expect_again(&mut self, evicted_carried: Vec<u64>) {
        if evicted_carried.is_empty() {
            return;
        }
        let room = self.capacity.saturating_sub(self.pending.len());
        let evicted: HashSet<u64> = evicted_carried
            .into_iter()
            .filter(|h| !self.ours.contains_key(h))
            .take(room)
            .collect();
        let mut carriers: HashMap<u64, u32> = HashMap::new();
        for sent in self.expecting.values_mut() {
            for &h in &sent.prompt {
                if evicted.contains(&h) {
                    *carriers.entry(h).or_insert(0) += 1;
                    // A block this request counted once and the replica
                    // stored since is still listed: listed once.
                    if !sent.pending.contains(&h) {
                        sent.pending.push(h);
                    }
                }
            }
        }
        self.pending.extend(carriers);
    }

    fn store(&mut self, stored: StoredBlocks<'_>) {
        if stored.block_size == 0 {
            return;
        }
        if self.block_size.is_none() {
            // The prompts sent before now count with this block size.
            for e in std::mem::take(&mut self.early) {
                let hashes = keyed_hashes(self.seed, &e.tokens, stored.block_size, &e.key);
                self.expect(e.id, &hashes, e.ends_ms);
            }
        }
        self.block_size = Some(stored.block_size);
        if let Some(n) = self.refill {
            let left = n.saturating_sub(stored.block_hashes.len());
            self.refill = (left > 0).then_some(left);
        }
        if let Some(name) = stored.lora_name
            && !self.adapters.contains(name)
        {
            self.adapters.insert(name.to_string());
        }
        let starts_prompt = stored.parent_block_hash.is_none();
        let parent = match stored.parent_block_hash {
            None => Some(self.seed),
            Some(p) => self.theirs.get(&p).copied(),
        };
        let Some(parent) = parent else {
            return;
        };
        let fresh = self.chain(stored, parent, starts_prompt);
        self.order.stored(&fresh);
        self.high_water = self.high_water.max(self.theirs.len());
    }

    /// Adds the stored blocks chained on `parent`; returns the new ones.
    fn chain(
        &mut self,
        stored: StoredBlocks<'_>,
        mut parent: u64,
        starts_prompt: bool,
    ) -> Vec<u64> {
        let mut fresh = Vec::new();
        for (i, (key, block)) in stored.blocks().enumerate() {
            let extra = stored.extra_keys.get(i);
            if extra.is_some_and(|e| e.opaque) {
                // Keyed by what no request of ours reproduces: neither
                // this block nor its descendants can match.
                break;
            }
            let first = starts_prompt && i == 0;
            let cache_key = CacheKey {
                adapter: stored.lora_name.map(String::from),
                salt: extra.and_then(|e| e.salt.clone()).filter(|_| first),
            };
            let ours = chain_keyed(parent, block, cache_key.extra(first));
            parent = ours;
            if self.theirs.contains_key(&key) {
                continue;
            }
            if self.theirs.len() >= self.capacity {
                self.dropped += 1;
                continue;
            }
            self.theirs.insert(key, ours);
            self.pending.remove(&ours);
            *self.ours.entry(ours).or_insert(0) += 1;
            fresh.push(ours);
        }
        fresh
    }

    fn clear(&mut self) {
        self.ours.clear();
        self.theirs.clear();
        // What was sent before a restart or a clear is not on its way any
        // more; the requests' handles find nothing to take back.
        self.pending.clear();
        self.expecting.clear();
        self.order.clear();
        self.early.clear();
        self.refill = None;
    }

    /// Applies one event; reported blocks it evicts that a request in
    /// flight carries are added to `evicted_carried`.
    fn apply(&mut self, e: &KvEvent, evicted_carried: &mut Vec<u64>) {
        match e {
            KvEvent::BlockStored { .. } => {
                if let Some(stored) = e.stored() {
                    self.store(stored);
                }
            }
            KvEvent::BlockRemoved { block_hashes, .. } => {
                if self.refill.is_none() {
                    // An eviction: the replica had no empty block left.
                    self.order.learn_capacity(self.theirs.len());
                }
                for key in block_hashes {
                    let Some(ours) = self.theirs.remove(key) else {
                        continue;
                    };
                    if let Some(n) = self.ours.get_mut(&ours) {
                        *n -= 1;
                        if *n == 0 {
                            self.ours.remove(&ours);
                            self.order.removed(ours);
                            if self.order.carries(ours) {
                                evicted_carried.push(ours);
                            }
                        }
                    }
                }
            }
            KvEvent::AllBlocksCleared => self.clear(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv_events::BlockExtra;
    use crate::routing::prefix::blocks::chained_hashes;

    fn stored(keys: &[u64], parent: Option<u64>, tokens: &[u32], bs: usize) -> KvEvent {
        KvEvent::BlockStored {
            block_hashes: keys.iter().map(|&k| BlockKey(k)).collect(),
            parent_block_hash: parent.map(BlockKey),
            token_ids: tokens.to_vec(),
            block_size: bs,
            lora_name: None,
            medium: None,
            extra_keys: Vec::new(),
        }
    }

    fn batch(events: Vec<KvEvent>) -> EventBatch {
        EventBatch {
            ts: 0.0,
            events,
            dp_rank: Some(0),
        }
    }

    #[test]
    fn stored_chains_match_the_prompt_hashes_and_removal_applies() {
        let h = HeldBlocks::new(100);
        h.caught_up();
        let tokens: Vec<u32> = (0..10).collect();
        // Stored in two events, the second chained on the first by vLLM's hash.
        h.apply(&batch(vec![stored(&[501, 502], None, &tokens[..4], 2)]));
        h.apply(&batch(vec![stored(&[503], Some(502), &tokens[4..6], 2)]));
        let want = chained_hashes(exact_seed(), &tokens, 2);
        assert_eq!(h.matched(&want), 3);
        assert_eq!(h.block_size(), Some(2));
        h.apply(&batch(vec![KvEvent::BlockRemoved {
            block_hashes: vec![BlockKey(502)],
            medium: None,
        }]));
        assert_eq!(h.matched(&want), 1, "the run stops at the removed block");
        h.apply(&batch(vec![KvEvent::AllBlocksCleared]));
        assert_eq!(h.matched(&want), 0);
        assert!(h.known());
    }

    #[test]
    fn unknown_parent_and_opaque_blocks_are_skipped() {
        let h = HeldBlocks::new(100);
        let mut media = stored(&[1], None, &[1, 2], 2);
        if let KvEvent::BlockStored { extra_keys, .. } = &mut media {
            *extra_keys = vec![BlockExtra {
                salt: None,
                opaque: true,
            }];
        }
        h.apply(&batch(vec![media, stored(&[2], Some(999), &[3, 4], 2)]));
        assert_eq!(h.summary().blocks, 0);
    }

    /// Blocks stored under an adapter or a salt match only prompts keyed
    /// the same way, and the adapter's name is learned.
    #[test]
    fn adapter_and_salt_blocks_are_kept_under_their_key() {
        let h = HeldBlocks::new(100);
        h.caught_up();
        let tokens: Vec<u32> = (0..6).collect();
        let mut lora = stored(&[1, 2, 3], None, &tokens, 2);
        if let KvEvent::BlockStored {
            lora_name,
            extra_keys,
            ..
        } = &mut lora
        {
            *lora_name = Some("sql".into());
            *extra_keys = vec![
                BlockExtra {
                    salt: Some("tenant-a".into()),
                    opaque: false,
                },
                BlockExtra::default(),
                BlockExtra::default(),
            ];
        }
        h.apply(&batch(vec![lora]));
        let key = |adapter: Option<&str>, salt: Option<&str>| CacheKey {
            adapter: adapter.map(String::from),
            salt: salt.map(String::from),
        };
        let hashes = |k: &CacheKey| keyed_hashes(exact_seed(), &tokens, 2, k);
        assert_eq!(h.matched(&hashes(&key(Some("sql"), Some("tenant-a")))), 3);
        assert_eq!(h.matched(&hashes(&key(Some("sql"), None))), 0);
        assert_eq!(h.matched(&hashes(&key(None, Some("tenant-a")))), 0);
        assert_eq!(h.matched(&hashes(&key(Some("chat"), Some("tenant-a")))), 0);
        assert_eq!(h.matched(&chained_hashes(exact_seed(), &tokens, 2)), 0);
        assert!(h.has_adapter("sql") && !h.has_adapter("chat"));
        // A later event chained on the salted block continues the chain.
        let mut more = stored(&[4], Some(3), &[6, 7], 2);
        if let KvEvent::BlockStored { lora_name, .. } = &mut more {
            *lora_name = Some("sql".into());
        }
        h.apply(&batch(vec![more]));
        let longer: Vec<u32> = (0..8).collect();
        let k = key(Some("sql"), Some("tenant-a"));
        assert_eq!(h.matched(&keyed_hashes(exact_seed(), &longer, 2, &k)), 4);
    }

    #[test]
    fn a_gap_makes_it_unknown_until_it_turned_over() {
        let h = HeldBlocks::new(100);
        assert!(!h.known(), "nothing seen yet");
        h.caught_up();
        let tokens: Vec<u32> = (0..8).collect();
        h.apply(&batch(vec![stored(&[1, 2, 3, 4], None, &tokens, 2)]));
        h.lost();
        assert!(!h.known());
        h.apply(&batch(vec![stored(&[5, 6, 7], None, &[9; 6], 2)]));
        assert!(!h.known(), "3 of the 4 blocks it held");
        h.apply(&batch(vec![stored(&[8], None, &[7, 7], 2)]));
        assert!(h.known());
    }

    #[test]
    fn sent_blocks_count_until_reported_or_their_request_ends() {
        let h = Arc::new(HeldBlocks::new(100));
        h.caught_up();
        // An event of another prompt tells the block size (2).
        h.apply(&batch(vec![stored(&[9], None, &[7, 7], 2)]));
        let tokens: Vec<u32> = (0..6).collect();
        let want = chained_hashes(exact_seed(), &tokens, 2);
        let first = h.expect_prompt(&tokens[..4], &CacheKey::default(), 0);
        assert_eq!(h.matched(&want), 0, "not reported yet");
        assert_eq!(h.matched_or_sent(&want, None), 2);
        assert_eq!(h.occupied(), 1 + 2);
        // A second request carrying the same prefix, and one more block.
        let second = h.expect_prompt(&tokens, &CacheKey::default(), 0);
        assert_eq!(h.matched_or_sent(&want, None), 3);
        drop(first);
        assert_eq!(
            h.matched_or_sent(&want, None),
            3,
            "the second request still carries all three"
        );
        drop(second);
        assert_eq!(h.matched_or_sent(&want, None), 0, "both requests ended");
        assert_eq!(h.occupied(), 1);
        // Reported: the record holds them whatever the request does.
        let third = h.expect_prompt(&tokens, &CacheKey::default(), 0);
        h.apply(&batch(vec![stored(&[1, 2, 3], None, &tokens, 2)]));
        assert!(h.lock().pending.is_empty());
        drop(third);
        assert_eq!(h.matched_or_sent(&want, None), 3, "confirmed");
        assert!(h.lock().expecting.is_empty());
    }

    /// A known record holding one prompt of `blocks` blocks of 2 tokens,
    /// keyed 1, 2, ... by the replica; its tokens and llmlb's hashes.
    fn holding_one_prompt(blocks: u64) -> (Arc<HeldBlocks>, Vec<u32>, Vec<u64>) {
        let h = Arc::new(HeldBlocks::new(100));
        h.caught_up();
        let tokens: Vec<u32> = (0..2 * blocks as u32).collect();
        let keys: Vec<u64> = (1..=blocks).collect();
        h.apply(&batch(vec![stored(&keys, None, &tokens, 2)]));
        let want = chained_hashes(exact_seed(), &tokens, 2);
        (h, tokens, want)
    }

    fn removed(keys: &[u64]) -> KvEvent {
        KvEvent::BlockRemoved {
            block_hashes: keys.iter().map(|&k| BlockKey(k)).collect(),
            medium: None,
        }
    }

    /// A reported block evicted while a request in flight carries it: that
    /// request has not run, and will store it again.
    #[test]
    fn an_evicted_block_a_waiting_request_carries_counts_as_sent() {
        let (h, tokens, want) = holding_one_prompt(3);
        // Sent while all three are held: nothing of it is pending.
        let waiting = h.expect_prompt(&tokens[..4], &CacheKey::default(), 0);
        assert!(h.lock().pending.is_empty());
        // The replica evicts the second and third blocks; the waiting
        // request carries the second, not the third.
        h.apply(&batch(vec![removed(&[3, 2])]));
        assert_eq!(h.matched(&want), 1);
        assert_eq!(
            h.matched_or_sent(&want, None),
            2,
            "the second is on its way"
        );
        // Stored again, then evicted again before its request is seen to
        // end (preempted, or ended at the replica first): on its way again.
        h.apply(&batch(vec![stored(&[2], Some(1), &tokens[2..4], 2)]));
        assert!(h.lock().pending.is_empty());
        h.apply(&batch(vec![removed(&[2])]));
        assert_eq!(h.matched_or_sent(&want, None), 2);
        drop(waiting);
        assert_eq!(h.matched_or_sent(&want, None), 1, "its request ended");
        assert!(h.lock().pending.is_empty());
        // Evicted with no request in flight: gone.
        h.apply(&batch(vec![removed(&[1])]));
        assert_eq!(h.matched_or_sent(&want, None), 0);
    }

    /// Evicted and stored again within one batch: held, not on its way.
    #[test]
    fn a_carried_block_evicted_and_stored_again_in_one_batch_is_held() {
        let (h, tokens, want) = holding_one_prompt(2);
        let _waiting = h.expect_prompt(&tokens, &CacheKey::default(), 0);
        h.apply(&batch(vec![
            removed(&[2]),
            stored(&[2], Some(1), &tokens[2..], 2),
        ]));
        assert!(h.lock().pending.is_empty());
        assert_eq!(h.matched(&want), 2);
    }

    /// A prompt sent under an adapter or a salt counts only for prompts
    /// keyed the same way.
    #[test]
    fn sent_blocks_are_kept_under_their_key() {
        let h = Arc::new(HeldBlocks::new(100));
        h.caught_up();
        h.apply(&batch(vec![stored(&[9], None, &[7, 7], 2)]));
        let tokens: Vec<u32> = (0..6).collect();
        let sql = CacheKey {
            adapter: Some("sql".into()),
            salt: None,
        };
        let _sent = h.expect_prompt(&tokens, &sql, 0);
        let under =
            |k: &CacheKey| h.matched_or_sent(&keyed_hashes(exact_seed(), &tokens, 2, k), None);
        assert_eq!(under(&sql), 3);
        assert_eq!(under(&CacheKey::default()), 0, "the base model's prompt");
        let chat = CacheKey {
            adapter: Some("chat".into()),
            salt: None,
        };
        assert_eq!(under(&chat), 0, "another adapter");
    }

    #[test]
    fn prompts_sent_before_the_block_size_is_known_count_once_it_is() {
        let h = Arc::new(HeldBlocks::new(100));
        h.caught_up();
        let early: Vec<u32> = (100..106).collect();
        let first = h.expect_prompt(&early, &CacheKey::default(), 0);
        let late: Vec<u32> = (200..204).collect();
        let second = h.expect_prompt(&late, &CacheKey::default(), 0);
        drop(second);
        // The first event, of another prompt, tells the block size (2).
        h.apply(&batch(vec![stored(&[1], None, &[7, 7], 2)]));
        let want = chained_hashes(exact_seed(), &early, 2);
        assert_eq!(
            h.matched_or_sent(&want, None),
            3,
            "counted from the event on"
        );
        let other = chained_hashes(exact_seed(), &late, 2);
        assert_eq!(h.matched_or_sent(&other, None), 0, "its request had ended");
        drop(first);
        assert_eq!(h.matched_or_sent(&want, None), 0);
        // Once the size is known, a prompt is expected at once.
        let next: Vec<u32> = (300..304).collect();
        let _third = h.expect_prompt(&next, &CacheKey::default(), 0);
        let want = chained_hashes(exact_seed(), &next, 2);
        assert_eq!(h.matched_or_sent(&want, None), 2);
    }

    #[test]
    fn sent_blocks_are_bounded_and_a_restart_forgets_them() {
        let h = Arc::new(HeldBlocks::new(3));
        h.caught_up();
        h.apply(&batch(vec![stored(&[9], None, &[7, 7], 2)]));
        let tokens: Vec<u32> = (0..10).collect();
        let sent = h.expect_prompt(&tokens, &CacheKey::default(), 0);
        assert_eq!(h.lock().pending.len(), 3, "five blocks, room for three");
        h.restarted();
        assert!(h.lock().pending.is_empty());
        drop(sent);
        assert!(h.lock().pending.is_empty());
    }

    #[test]
    fn early_prompts_are_bounded_and_a_restart_forgets_them() {
        let h = Arc::new(HeldBlocks::new(100));
        h.caught_up();
        let big = vec![1u32; EARLY_TOKENS];
        let _big = h.expect_prompt(&big, &CacheKey::default(), 0);
        let _small = h.expect_prompt(&[5, 6], &CacheKey::default(), 0);
        assert_eq!(h.lock().early.len(), 1, "the second is over the bound");
        h.restarted();
        assert!(h.lock().early.is_empty());
    }

    /// The stores a full record drops reach
    /// `llmlb_kv_events_stores_dropped_total` through the counting sink.
    #[test]
    fn dropped_stores_are_counted() {
        use crate::kv_events::metrics::KvEventMetrics;
        let metrics = KvEventMetrics::register(&prometheus::Registry::new());
        let h = Arc::new(HeldBlocks::new(2));
        let sink = metrics.counting("p", "r", h.clone());
        sink.caught_up();
        sink.apply(&batch(vec![stored(&[1, 2, 3], None, &[1, 2, 3], 1)]));
        sink.apply(&batch(vec![stored(&[4], None, &[4], 1)]));
        let counted = metrics.dropped.with_label_values(&["p", "r"]).get();
        assert_eq!((counted, h.summary().dropped), (2, 2));
    }

    #[test]
    fn bounded_and_restart_clears() {
        let h = HeldBlocks::new(2);
        h.caught_up();
        h.apply(&batch(vec![stored(&[1, 2, 3], None, &[1, 2, 3], 1)]));
        let s = h.summary();
        assert_eq!((s.blocks, s.dropped), (2, 1));
        assert!(!h.observe_restarts(0));
        assert!(h.observe_restarts(1));
        assert_eq!(h.summary().blocks, 0);
        assert!(h.known());
    }

    /// More blocks in flight than the capacity: only the blocks of the
    /// requests expected to end last count, reported or sent.
    #[test]
    fn past_capacity_only_the_requests_ending_last_count() {
        let h = Arc::new(HeldBlocks::new(100));
        h.caught_up();
        let old: Vec<u32> = (0..4).collect();
        h.apply(&batch(vec![stored(&[1, 2], None, &old, 2)]));
        let mid: Vec<u32> = (100..104).collect();
        let new: Vec<u32> = (200..204).collect();
        let hashes = |t: &[u32]| chained_hashes(exact_seed(), t, 2);
        let key = CacheKey::default();
        let a = h.expect_prompt(&old, &key, 10);
        let _b = h.expect_prompt(&mid, &key, 20);
        let c = h.expect_prompt(&new, &key, 30);
        // Six blocks carried, room for four: the prefix of the request that
        // ends first, reported as held, will be gone by a new request's turn.
        assert_eq!(h.matched_or_sent(&hashes(&old), Some(4)), 0);
        assert_eq!(h.matched_or_sent(&hashes(&mid), Some(4)), 2);
        assert_eq!(h.matched_or_sent(&hashes(&new), Some(4)), 2);
        // Room for six: all of it counts.
        assert_eq!(h.matched_or_sent(&hashes(&old), Some(6)), 2);
        // A long answer sent first ends last: its prefix is the one kept.
        drop(a);
        let _a = h.expect_prompt(&old, &key, 40);
        assert_eq!(h.matched_or_sent(&hashes(&old), Some(4)), 2);
        assert_eq!(h.matched_or_sent(&hashes(&mid), Some(4)), 0);
        // The newest ends: four carried, within the capacity.
        drop(c);
        assert_eq!(h.matched_or_sent(&hashes(&mid), Some(4)), 2);
    }
}

//! Live state of one replica: identity, weight, the proxy's own load counts,
//! its last scraped load, and its health (active checks and outlier ejection).
//!
//! Everything mutable is an atomic or an `ArcSwap` so the request path never
//! takes a lock. The in-flight count and the outstanding-token estimate are
//! held by an RAII [`InFlightGuard`] that travels inside the response body and
//! is released at end of stream or when the client goes away.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use arc_swap::ArcSwapOption;
use prometheus::IntGauge;
use tokio::sync::Notify;

use super::ActiveHealth;
use super::carried::CarriedBlocks;
use super::learned::LearnedRates;
use super::outlier::Outlier;
use super::view::ScrapedLoad;
use super::{LoadSnapshot, RestartWatch};
use crate::telemetry::clock::now_millis;
use crate::telemetry::{Metrics, ReplicaSeries};

/// Process-unique identity of a replica, stable across config reloads while the
/// replica stays in the config.
pub type ReplicaId = u64;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

#[derive(Debug)]
pub struct Replica {
    pub id: ReplicaId,
    /// Label for metrics and logs (`host:port` unless configured).
    pub name: String,
    /// `name` needs no quoting in the access line (checked once here).
    pub name_plain: bool,
    /// `host:port` used to build upstream URIs.
    pub authority: http::uri::Authority,
    /// `http` or `https`, from the replica's URL.
    pub scheme: http::uri::Scheme,
    /// The `Host` header of a request to it: the authority, without a port
    /// that is the scheme's default (what hyper would derive from the URI,
    /// made once instead of per request).
    pub host: http::HeaderValue,
    /// Its idle keep-alive connections, for the next requests to it.
    pub conns: crate::net::IdleConns,
    pub weight: u32,
    /// Concurrency limit when the pool queues (`max_inflight`).
    pub max_inflight: Option<u32>,
    /// Requests sent here whose first token has not come, at most
    /// (`max_prefilling`); the rest wait in the pool's queue.
    pub max_prefilling: Option<u32>,
    /// In-flight requests and outstanding tokens, shared with the replica's
    /// successor when a reload changes its weight or limit.
    counts: Arc<Counts>,
    /// Since the last stored scrape: requests dispatched, requests finished,
    /// requests whose first byte came, tokens (prompt + expected output,
    /// less a cached prefix a request in flight here carries) dispatched;
    /// each scrape starts them at the requests it could not see yet.
    dispatched_since_scrape: AtomicU64,
    completed_since_scrape: AtomicU64,
    first_bytes_since_scrape: AtomicU64,
    /// llmlb's requests there without a first byte when the scrape was stored.
    prefilling_at_scrape: AtomicU64,
    tokens_since_scrape: AtomicU64,
    load: ArcSwapOption<LoadSnapshot>,
    /// Passive health.
    pub outlier: Outlier,
    /// Active health checks.
    pub health: ActiveHealth,
    /// Prefill and decode rates learned from consecutive scrapes.
    pub learned: LearnedRates,
    /// LoRA adapters running or loaded there (llmlb's requests and scraped).
    pub adapters: super::adapters::Adapters,
    /// Set by an operator (`POST /admin/replicas/{name}/drain`): no new work,
    /// streams already running finish.
    draining: AtomicBool,
    /// The replica answered 400 to a stream llmlb had added
    /// `stream_options` to and took it without: llmlb stops adding it.
    refuses_stream_options: AtomicBool,
    /// Its last answer to a stream llmlb had added `stream_options` to was
    /// not a 400: the next such stream keeps no copy of its headers for a
    /// send without the field.
    takes_stream_options: AtomicBool,
    in_flight_gauge: IntGauge,
    /// Its metric series, looked up once (see [`Replica::series`]).
    series: OnceLock<ReplicaSeries>,
    /// Called when a request here passes its first token, under
    /// `max_prefilling`: the pool's queue looks again.
    prefill_hook: ArcSwapOption<PrefillHook>,
}

/// What a replica calls when a request's prefill ends and a prefill slot
/// may have freed.
pub struct PrefillHook(pub Box<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for PrefillHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PrefillHook")
    }
}

impl Replica {
    pub fn new(
        name: String,
        authority: http::uri::Authority,
        weight: u32,
        in_flight_gauge: IntGauge,
    ) -> Replica {
        let scheme = http::uri::Scheme::HTTP;
        Replica {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            name_plain: crate::telemetry::log_line::is_plain(&name),
            name,
            host: host_header(&authority, &scheme),
            conns: Default::default(),
            authority,
            scheme,
            weight,
            max_inflight: None,
            max_prefilling: None,
            counts: Arc::default(),
            dispatched_since_scrape: AtomicU64::new(0),
            completed_since_scrape: AtomicU64::new(0),
            first_bytes_since_scrape: AtomicU64::new(0),
            prefilling_at_scrape: AtomicU64::new(0),
            tokens_since_scrape: AtomicU64::new(0),
            load: ArcSwapOption::empty(),
            outlier: Outlier::default(),
            health: ActiveHealth::default(),
            learned: LearnedRates::default(),
            adapters: Default::default(),
            draining: AtomicBool::new(false),
            refuses_stream_options: AtomicBool::new(false),
            takes_stream_options: AtomicBool::new(false),
            in_flight_gauge,
            series: OnceLock::new(),
            prefill_hook: ArcSwapOption::empty(),
        }
    }

    pub fn in_flight(&self) -> u64 {
        self.counts.in_flight.load(Ordering::Acquire)
    }

    /// The prompt tokens of this proxy's requests here without a first
    /// byte yet that the replica was predicted not to hold cached.
    pub fn uncached_prefill(&self) -> u64 {
        self.counts.uncached_prefill.load(Ordering::Relaxed)
    }

    pub fn outstanding_tokens(&self) -> u64 {
        self.counts.outstanding_tokens.load(Ordering::Relaxed)
    }

    /// Output tokens still to stream for the in-flight requests that are
    /// past their first byte.
    pub fn decoding_output(&self) -> u64 {
        self.counts.decoding_output.load(Ordering::Relaxed)
    }

    /// In-flight requests that have not had their first byte yet: their
    /// prompt is still queued or prefilling, so any prefill the replica
    /// takes on before theirs delays their first token.
    pub fn prefilling(&self) -> u64 {
        self.counts.prefilling.load(Ordering::Relaxed)
    }

    /// Takes over `old`'s in-flight and token counts (builder style, before
    /// sharing): a reload that changes a replica's weight or limit builds a
    /// new `Replica` (same id), and the requests still running on the old
    /// one keep counting against the new one's limit until they end.
    pub fn carrying_counts_of(mut self, old: &Replica) -> Replica {
        self.id = old.id;
        self.counts = Arc::clone(&old.counts);
        self
    }

    /// This replica's metric series in `pool`, looked up by label the first
    /// time (a replica belongs to one pool and one registry).
    pub fn series(&self, pool: &str, metrics: &Metrics) -> &ReplicaSeries {
        self.series
            .get_or_init(|| ReplicaSeries::new(metrics, pool, &self.name))
    }

    /// Resolves when one of this replica's in-flight requests ends (a slot
    /// may have freed). Create it, then re-check, then await, so a release
    /// between the check and the await is not missed.
    pub fn slot_freed(&self) -> tokio::sync::futures::Notified<'_> {
        self.counts.freed.notified()
    }

    /// Sets the URL scheme, `http` unless told (builder style, before sharing).
    pub fn with_scheme(mut self, scheme: http::uri::Scheme) -> Replica {
        self.host = host_header(&self.authority, &scheme);
        self.scheme = scheme;
        self
    }

    /// The absolute URI of `path_and_query` on this replica, from parts
    /// already parsed (the client's own path is not parsed again).
    pub fn uri(
        &self,
        path_and_query: http::uri::PathAndQuery,
    ) -> Result<http::Uri, http::uri::InvalidUriParts> {
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = Some(path_and_query);
        http::Uri::from_parts(parts)
    }

    /// Sets the concurrency limit (builder style, before sharing).
    pub fn with_limit(mut self, max_inflight: Option<u32>) -> Replica {
        self.max_inflight = max_inflight;
        self
    }

    /// Sets the bound on requests before their first token (builder style).
    pub fn with_prefill_limit(mut self, max_prefilling: Option<u32>) -> Replica {
        self.max_prefilling = max_prefilling;
        self
    }

    /// What to call when a request here passes its first token while
    /// `max_prefilling` holds others back (replaced at each reload).
    pub fn on_prefill_done(&self, hook: Arc<PrefillHook>) {
        self.prefill_hook.store(Some(hook));
    }

    /// The requests this process may have here before their first token:
    /// `max_prefilling`, or under a fleet store the part of it that this
    /// instance's lease is of `max_inflight`, rounded up (so each instance
    /// holding a slot may prefill one). `None`: no bound.
    pub fn prefill_limit(&self) -> Option<u64> {
        let k = u64::from(self.max_prefilling?);
        let share = self.counts.fleet_cap.load(Ordering::Acquire);
        match self.max_inflight {
            Some(limit) if share < limit => {
                Some((k * u64::from(share)).div_ceil(u64::from(limit.max(1))))
            }
            _ => Some(k),
        }
    }

    /// The requests this process may run here at once now: its limit, and
    /// under `max_prefilling` no more than those past their first token
    /// plus the prefill bound. `None`: no limit.
    pub fn open_slots_limit(&self) -> Option<u64> {
        let limit = self.limit().map(u64::from);
        match (limit, self.prefill_limit()) {
            (Some(l), Some(p)) => {
                let decoding = self.in_flight().saturating_sub(self.prefilling());
                Some(l.min(decoding + p))
            }
            (l, _) => l,
        }
    }

    /// The requests this process may run here at once: `max_inflight`,
    /// or less when several llmlb instances share it (`[fleet]`: this
    /// instance's lease of it). `None`: no limit.
    pub fn limit(&self) -> Option<u32> {
        let share = self.counts.fleet_cap.load(Ordering::Acquire);
        self.max_inflight.map(|l| l.min(share))
    }

    /// Sets this instance's share of `max_inflight` (`u32::MAX`: all of
    /// it); waiters for a slot look again when it grew.
    pub fn set_fleet_cap(&self, cap: u32) {
        let before = self.counts.fleet_cap.swap(cap, Ordering::AcqRel);
        if cap > before {
            self.counts.freed.notify_waiters();
        }
    }

    /// Requests waiting for a slot that could use this replica (the fleet
    /// store reports them as this instance's demand).
    pub fn waiting(&self) -> u32 {
        self.counts.waiting.load(Ordering::Relaxed)
    }

    /// Counts one request waiting for a slot here until the guard drops.
    pub fn wait_here(self: &Arc<Self>) -> WaitingGuard {
        self.counts.waiting.fetch_add(1, Ordering::Relaxed);
        WaitingGuard(Arc::clone(self))
    }

    /// Starts the replica with no slot until the fleet store grants some
    /// (builder style, before sharing).
    pub fn with_fleet_cap(self, cap: u32) -> Replica {
        self.counts.fleet_cap.store(cap, Ordering::Relaxed);
        self
    }

    /// Whether the replica is under its concurrency limit and its prefill
    /// bound (always, without them).
    pub fn has_free_slot(&self) -> bool {
        self.limit()
            .is_none_or(|limit| self.in_flight() < u64::from(limit))
            && !self.prefill_full()
    }

    /// Whether `max_prefilling` of this process's requests here are before
    /// their first token (never, without the bound).
    fn prefill_full(&self) -> bool {
        self.prefill_limit().is_some_and(|p| self.prefilling() >= p)
    }

    /// Counts one more request in flight until the guard is dropped.
    pub fn acquire(self: &Arc<Self>) -> InFlightGuard {
        self.acquire_tokens(0, 0)
    }

    /// Counts one more request in flight that should cost `prompt_tokens` of
    /// prefill and up to `output_tokens` of decode, until the guard is
    /// dropped. Ignores the concurrency limit; see [`Replica::try_acquire_tokens`].
    pub fn acquire_tokens(
        self: &Arc<Self>,
        prompt_tokens: u64,
        output_tokens: u64,
    ) -> InFlightGuard {
        self.counts.in_flight.fetch_add(1, Ordering::AcqRel);
        self.guard(prompt_tokens, output_tokens)
    }

    /// Like [`Replica::acquire_tokens`], but only when the replica is under
    /// its `max_inflight`: the check and the increment are one atomic step,
    /// so two requests racing for the last slot cannot both take it. The
    /// prefill bound is checked apart (two racing requests may both pass
    /// it by one; it bounds bursts, not memory).
    pub fn try_acquire_tokens(
        self: &Arc<Self>,
        prompt_tokens: u64,
        output_tokens: u64,
    ) -> Option<InFlightGuard> {
        let limit = self.limit().map_or(u64::MAX, u64::from);
        if self.prefill_full() {
            return None;
        }
        self.counts
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()?;
        Some(self.guard(prompt_tokens, output_tokens))
    }

    fn guard(self: &Arc<Self>, prompt_tokens: u64, output_tokens: u64) -> InFlightGuard {
        let total = prompt_tokens + output_tokens;
        self.counts
            .outstanding_tokens
            .fetch_add(total, Ordering::Relaxed);
        self.counts.prefilling.fetch_add(1, Ordering::Relaxed);
        self.counts
            .uncached_prefill
            .fetch_add(prompt_tokens, Ordering::Relaxed);
        self.dispatched_since_scrape.fetch_add(1, Ordering::Relaxed);
        self.tokens_since_scrape.fetch_add(total, Ordering::Relaxed);
        self.in_flight_gauge.inc();
        InFlightGuard {
            replica: Arc::clone(self),
            prefilled: false,
            prompt_left: prompt_tokens,
            uncached_left: prompt_tokens,
            output_left: output_tokens,
            adapter: None,
            carried: Vec::new(),
        }
    }

    /// The prompt blocks of the requests in flight here, in the prefix
    /// index's hashes (prefix modes; see [`InFlightGuard::carry`]).
    #[cfg(test)]
    pub fn carried(&self) -> &CarriedBlocks {
        &self.counts.carried
    }

    /// Takes back `tokens` of a request's prompt from the KV tokens counted
    /// since the scrape: the cached part a request in flight here carries
    /// (its blocks are in use; the new request shares them instead of
    /// taking free ones). Call after the request's guard is taken.
    pub fn kv_tokens_shared(&self, tokens: u64) {
        let _ = self
            .tokens_since_scrape
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                Some(t.saturating_sub(tokens))
            });
    }

    /// llmlb's requests here the scrape cannot have counted, and their KV
    /// tokens: those in flight beyond every request the replica reports
    /// running or waiting (still on the wire, or in its API server's
    /// backlog, which vLLM's gauges leave out). They are ahead of any
    /// request sent now, so they carry over into the since-scrape counts:
    /// as dispatched, and at the mean uncached prompt of llmlb's requests
    /// there without a first byte (their answers' blocks left out). Other
    /// senders' requests in the scrape hide some of them; then fewer carry
    /// over, never more.
    /// `prefilling`: llmlb's requests here without a first byte, read once
    /// by the caller (the unseen ones are at most as many).
    fn unseen_by(&self, snapshot: &LoadSnapshot, prefilling: u64) -> (u64, u64) {
        let (Some(running), Some(waiting)) = (snapshot.running, snapshot.waiting) else {
            return (0, 0);
        };
        let unseen = self
            .in_flight()
            .saturating_sub(running + waiting)
            .min(prefilling);
        if unseen == 0 {
            return (0, 0);
        }
        let per_request = self.uncached_prefill() / prefilling;
        (unseen, per_request * unseen)
    }

    /// Stores a new scrape and restarts the since-scrape counts.
    /// Returns whether the scrape shows the replica restarted since the
    /// last one ([`RestartWatch`]).
    pub fn store_load(&self, snapshot: LoadSnapshot) -> bool {
        let restarted = self.counts.restarts.observe(snapshot.prefix_cache_queries);
        if let Some(previous) = self.load.load().as_deref() {
            self.learned.observe(previous, &snapshot);
        }
        let prefilling = self.prefilling();
        let (unseen, unseen_tokens) = self.unseen_by(&snapshot, prefilling);
        self.load.store(Some(Arc::new(snapshot)));
        self.dispatched_since_scrape
            .store(unseen, Ordering::Relaxed);
        self.completed_since_scrape.store(0, Ordering::Relaxed);
        self.first_bytes_since_scrape.store(0, Ordering::Relaxed);
        (self.prefilling_at_scrape).store(prefilling - unseen, Ordering::Relaxed);
        self.tokens_since_scrape
            .store(unseen_tokens, Ordering::Relaxed);
        restarted
    }

    /// A request here passed its first token: under `max_prefilling`, the
    /// requests waiting for this replica look again.
    fn prefill_ended(&self) {
        if self.max_prefilling.is_some() {
            self.counts.freed.notify_waiters();
            if let Some(hook) = self.prefill_hook.load().as_deref() {
                (hook.0)();
            }
        }
    }

    /// How many restarts the scrapes have shown (carried across reloads).
    pub fn restarts(&self) -> u64 {
        self.counts.restarts.restarts()
    }

    /// The last stored scrape, if any.
    pub fn load_snapshot(&self) -> Option<Arc<LoadSnapshot>> {
        self.load.load_full()
    }

    /// The last scrape as balancers see it, aged at `now_ms`, with what this
    /// proxy has done since.
    pub fn scraped_load(&self, now_ms: u64) -> Option<ScrapedLoad> {
        let guard = self.load.load();
        let s = guard.as_deref()?;
        Some(ScrapedLoad {
            running: s.running,
            waiting: s.waiting,
            kv_usage: s.kv_usage,
            kv_capacity_tokens: s.kv_capacity_tokens,
            age_ms: now_ms.saturating_sub(s.taken_at_ms),
            dispatched_since: self.dispatched_since_scrape.load(Ordering::Relaxed),
            completed_since: self.completed_since_scrape.load(Ordering::Relaxed),
            first_bytes_since: self.first_bytes_since_scrape.load(Ordering::Relaxed),
            prefilling_at_scrape: self.prefilling_at_scrape.load(Ordering::Relaxed),
            tokens_since: self.tokens_since_scrape.load(Ordering::Relaxed),
        })
    }

    /// Whether the replica may receive new work now.
    pub fn is_eligible(&self) -> bool {
        self.is_eligible_at(now_millis())
    }

    /// Not drained, up by active checks and not ejected by passive health.
    pub fn is_eligible_at(&self, now_ms: u64) -> bool {
        !self.is_draining() && self.health.is_up() && !self.outlier.is_ejected_at(now_ms)
    }

    /// Drains the replica (`true`: no new work) or puts it back (`false`).
    pub fn set_draining(&self, on: bool) {
        self.draining.store(on, Ordering::Relaxed);
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Whether streams go to this replica without the `stream_options`
    /// llmlb would add (it refused them once).
    pub fn refuses_stream_options(&self) -> bool {
        self.refuses_stream_options.load(Ordering::Relaxed)
    }

    /// Notes that the replica refuses `stream_options`; true the first time.
    pub fn note_refuses_stream_options(&self) -> bool {
        !self.refuses_stream_options.swap(true, Ordering::Relaxed)
    }

    /// Whether the replica's last answer to a stream with the
    /// `stream_options` llmlb added was not a 400.
    pub fn takes_stream_options(&self) -> bool {
        self.takes_stream_options.load(Ordering::Relaxed)
    }

    /// Notes how the replica answered a stream with the `stream_options`
    /// llmlb added: `took` when not with a 400.
    pub fn note_takes_stream_options(&self, took: bool) {
        if self.takes_stream_options() != took {
            self.takes_stream_options.store(took, Ordering::Relaxed);
        }
    }

    /// Whether the replica is currently set aside by either kind of health.
    pub fn is_down(&self) -> bool {
        !self.is_eligible()
    }
}

/// A request counted as waiting for a slot on a replica (see
/// [`Replica::wait_here`]).
#[derive(Debug)]
pub struct WaitingGuard(Arc<Replica>);

impl Drop for WaitingGuard {
    fn drop(&mut self) {
        self.0.counts.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The counts a reload carries from a replica to its successor.
#[derive(Debug)]
struct Counts {
    in_flight: AtomicU64,
    /// This instance's share of `max_inflight` when a fleet store splits
    /// it among instances (`u32::MAX`: the whole limit).
    fleet_cap: AtomicU32,
    /// Requests waiting for a slot that could use this replica.
    waiting: AtomicU32,
    /// Estimated tokens the replica still has to process for this proxy's
    /// in-flight requests (prompt not yet prefilled + output not yet streamed).
    outstanding_tokens: AtomicU64,
    /// Of the in-flight requests, those without a first byte yet.
    prefilling: AtomicU64,
    /// Their prompt tokens the replica does not hold cached (as predicted
    /// when each was sent): the prefill queued there.
    uncached_prefill: AtomicU64,
    /// Output tokens still to stream for the requests past their first
    /// byte (the ones decoding).
    decoding_output: AtomicU64,
    /// Woken whenever an in-flight request ends.
    freed: Notify,
    /// Restarts seen in the replica's scrapes.
    restarts: RestartWatch,
    /// The prompt blocks of the in-flight requests (prefix modes).
    carried: CarriedBlocks,
}

impl Default for Counts {
    fn default() -> Counts {
        Counts {
            in_flight: AtomicU64::new(0),
            fleet_cap: AtomicU32::new(u32::MAX),
            waiting: AtomicU32::new(0),
            outstanding_tokens: AtomicU64::new(0),
            prefilling: AtomicU64::new(0),
            uncached_prefill: AtomicU64::new(0),
            decoding_output: AtomicU64::new(0),
            freed: Notify::new(),
            restarts: RestartWatch::default(),
            carried: CarriedBlocks::default(),
        }
    }
}

/// One unit of in-flight load on a replica, released on drop.
#[derive(Debug)]
pub struct InFlightGuard {
    replica: Arc<Replica>,
    /// Whether the replica has started answering (counted out of
    /// `prefilling`).
    prefilled: bool,
    prompt_left: u64,
    /// Of `prompt_left` before the first byte, what is not cached there.
    uncached_left: u64,
    output_left: u64,
    /// The LoRA adapter the request runs there, counted until the drop.
    adapter: Option<Arc<str>>,
    /// Its prompt's blocks, carried there until the drop
    /// ([`CarriedBlocks`]).
    carried: Vec<u64>,
}

impl InFlightGuard {
    pub fn replica(&self) -> &Arc<Replica> {
        &self.replica
    }

    /// The request runs LoRA adapter `adapter` there: counted among the
    /// replica's running adapters until this guard drops.
    pub fn run_adapter(&mut self, adapter: &Arc<str>) {
        if let Some(old) = self.adapter.replace(Arc::clone(adapter)) {
            self.replica.adapters.end(&old);
        }
        self.replica.adapters.start(adapter);
    }

    /// The request's prompt has these prefix-index blocks: carried there
    /// ([`CarriedBlocks`]) until the guard drops. Returns how many
    /// leading blocks of them the other requests in flight there carry.
    pub fn carry(&mut self, blocks: Vec<u64>) -> usize {
        let carried = &self.replica.counts.carried;
        if !self.carried.is_empty() {
            carried.remove(&self.carried);
        }
        let leading = carried.add(&blocks);
        self.carried = blocks;
        leading
    }

    /// `tokens` of the prompt are predicted cached there: not part of the
    /// prefill queued on the replica.
    pub fn expect_cached(&mut self, tokens: u64) {
        let t = tokens.min(self.uncached_left);
        if t > 0 && !self.prefilled {
            self.uncached_left -= t;
            (self.replica.counts.uncached_prefill).fetch_sub(t, Ordering::Relaxed);
        }
    }

    /// The replica has started answering: the prompt is prefilled.
    #[inline]
    pub fn prefill_done(&mut self) {
        // Every frame after the first: nothing left to move.
        if self.prefilled && self.prompt_left == 0 {
            return;
        }
        self.end_prefill();
    }

    fn end_prefill(&mut self) {
        if !std::mem::replace(&mut self.prefilled, true) {
            let counts = &self.replica.counts;
            counts.prefilling.fetch_sub(1, Ordering::Relaxed);
            let u = std::mem::take(&mut self.uncached_left);
            counts.uncached_prefill.fetch_sub(u, Ordering::Relaxed);
            counts
                .decoding_output
                .fetch_add(self.output_left, Ordering::Relaxed);
            (self.replica.first_bytes_since_scrape).fetch_add(1, Ordering::Relaxed);
            self.replica.prefill_ended();
        }
        let p = std::mem::take(&mut self.prompt_left);
        if p > 0 {
            self.replica
                .counts
                .outstanding_tokens
                .fetch_sub(p, Ordering::Relaxed);
        }
    }

    /// `n` output tokens have streamed out.
    pub fn produced(&mut self, n: u64) {
        let n = n.min(self.output_left);
        if n > 0 {
            self.output_left -= n;
            let counts = &self.replica.counts;
            counts.outstanding_tokens.fetch_sub(n, Ordering::Relaxed);
            if self.prefilled {
                counts.decoding_output.fetch_sub(n, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        let r = &self.replica;
        if let Some(a) = self.adapter.take() {
            r.adapters.end(&a);
        }
        if !self.carried.is_empty() {
            r.counts.carried.remove(&self.carried);
        }
        if self.prefilled {
            r.counts
                .decoding_output
                .fetch_sub(self.output_left, Ordering::Relaxed);
        } else {
            r.counts.prefilling.fetch_sub(1, Ordering::Relaxed);
            (r.counts.uncached_prefill).fetch_sub(self.uncached_left, Ordering::Relaxed);
        }
        let left = self.prompt_left + self.output_left;
        if left > 0 {
            r.counts
                .outstanding_tokens
                .fetch_sub(left, Ordering::Relaxed);
        }
        r.counts.in_flight.fetch_sub(1, Ordering::AcqRel);
        r.counts.freed.notify_waiters();
        r.completed_since_scrape.fetch_add(1, Ordering::Relaxed);
        r.in_flight_gauge.dec();
    }
}

/// `host[:port]` for the `Host` header, the port left out when it is the
/// scheme's default (80 for `http`, 443 for `https`).
fn host_header(authority: &http::uri::Authority, scheme: &http::uri::Scheme) -> http::HeaderValue {
    let default_port = match scheme.as_str() {
        "https" => 443,
        _ => 80,
    };
    let text = match authority.port_u16() {
        Some(port) if port == default_port => authority.host(),
        _ => authority.as_str(),
    };
    http::HeaderValue::from_str(text).expect("an authority is a valid header value")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_header_leaves_out_only_the_schemes_default_port() {
        let host = |authority: &str, scheme: http::uri::Scheme| {
            host_header(&authority.parse().unwrap(), &scheme)
        };
        assert_eq!(
            host("10.0.0.7:8000", http::uri::Scheme::HTTP),
            "10.0.0.7:8000"
        );
        assert_eq!(host("vllm-0:80", http::uri::Scheme::HTTP), "vllm-0");
        assert_eq!(host("vllm-0:443", http::uri::Scheme::HTTP), "vllm-0:443");
        assert_eq!(host("vllm-0:443", http::uri::Scheme::HTTPS), "vllm-0");
        assert_eq!(host("vllm-0", http::uri::Scheme::HTTPS), "vllm-0");
    }

    fn replica() -> Arc<Replica> {
        Arc::new(Replica::new(
            "r".into(),
            "127.0.0.1:1".parse().unwrap(),
            1,
            IntGauge::new("g", "g").unwrap(),
        ))
    }

    #[test]
    fn guard_counts_and_releases() {
        let r = replica();
        let a = r.acquire();
        let b = r.acquire();
        assert_eq!(r.in_flight(), 2);
        drop(a);
        assert_eq!(r.in_flight(), 1);
        drop(b);
        assert_eq!(r.in_flight(), 0);
    }

    #[test]
    fn try_acquire_stops_at_the_limit_and_a_successor_shares_the_count() {
        let limited = || {
            Replica::new(
                "r".into(),
                "127.0.0.1:1".parse().unwrap(),
                1,
                IntGauge::new("g", "g").unwrap(),
            )
            .with_limit(Some(2))
        };
        let r = Arc::new(limited());
        let a = r.try_acquire_tokens(1, 1).expect("first slot");
        let _b = r.try_acquire_tokens(1, 1).expect("second slot");
        assert!(r.try_acquire_tokens(1, 1).is_none(), "limit 2 holds");
        let next = Arc::new(limited().carrying_counts_of(&r));
        assert_eq!(next.in_flight(), 2);
        assert!(next.try_acquire_tokens(1, 1).is_none());
        drop(a);
        assert_eq!(next.in_flight(), 1);
        assert!(next.try_acquire_tokens(1, 1).is_some());
    }

    #[test]
    fn max_prefilling_bounds_requests_before_their_first_token() {
        let r = Arc::new(
            Replica::new(
                "r".into(),
                "127.0.0.1:1".parse().unwrap(),
                1,
                IntGauge::new("g", "g").unwrap(),
            )
            .with_limit(Some(16))
            .with_prefill_limit(Some(4)),
        );
        let pokes = Arc::new(AtomicU64::new(0));
        let seen = Arc::clone(&pokes);
        r.on_prefill_done(Arc::new(PrefillHook(Box::new(move || {
            seen.fetch_add(1, Ordering::Relaxed);
        }))));
        let mut held: Vec<_> = (0..4)
            .map(|_| r.try_acquire_tokens(1, 1).unwrap())
            .collect();
        assert!(!r.has_free_slot() && r.try_acquire_tokens(1, 1).is_none());
        assert_eq!(r.open_slots_limit(), Some(4), "none decoding: 0 + 4");
        held[0].prefill_done();
        held[0].prefill_done();
        assert_eq!(pokes.load(Ordering::Relaxed), 1, "one poke per first token");
        assert!(r.has_free_slot());
        assert_eq!(r.open_slots_limit(), Some(5), "one decoding: 1 + 4");
        held.push(r.try_acquire_tokens(1, 1).unwrap());

        // Under a fleet store: the part of 4 that the lease is of 16,
        // rounded up; no slot, no prefill.
        for (cap, part) in [
            (u32::MAX, 4),
            (16, 4),
            (8, 2),
            (5, 2),
            (3, 1),
            (1, 1),
            (0, 0),
        ] {
            r.set_fleet_cap(cap);
            assert_eq!(r.prefill_limit(), Some(part), "lease {cap}");
        }
        r.set_fleet_cap(16);
        assert_eq!(r.open_slots_limit(), Some(5));
        drop(held);
        assert_eq!((r.in_flight(), r.prefilling()), (0, 0));
    }

    #[test]
    fn tokens_decrease_as_the_stream_flows() {
        let r = replica();
        let mut g = r.acquire_tokens(100, 50);
        let other = r.acquire_tokens(10, 10);
        assert_eq!(r.outstanding_tokens(), 170);
        g.prefill_done();
        assert_eq!(r.outstanding_tokens(), 70);
        g.produced(20);
        assert_eq!(r.outstanding_tokens(), 50);
        g.produced(1000); // more than promised: clamps
        assert_eq!(r.outstanding_tokens(), 20);
        drop(g);
        assert_eq!(r.outstanding_tokens(), 20);
        drop(other); // a client that went away releases its whole share
        assert_eq!(r.outstanding_tokens(), 0);
    }

    #[test]
    fn prefilling_counts_requests_until_their_first_byte() {
        let r = replica();
        let mut a = r.acquire_tokens(100, 50);
        let b = r.acquire_tokens(10, 10);
        let mut c = r.acquire();
        assert_eq!(r.prefilling(), 3);
        a.prefill_done();
        a.prefill_done(); // every chunk reports it: counted once
        assert_eq!(r.prefilling(), 2);
        drop(b); // went away before answering
        assert_eq!(r.prefilling(), 1);
        c.prefill_done(); // a prompt of 0 tokens still counts
        assert_eq!(r.prefilling(), 0);
        drop(a);
        drop(c);
        assert_eq!((r.prefilling(), r.in_flight()), (0, 0));
    }

    #[test]
    fn the_uncached_prefill_counts_what_is_not_cached_until_the_first_byte() {
        let r = replica();
        let mut a = r.acquire_tokens(1_000, 50);
        let mut b = r.acquire_tokens(300, 10);
        assert_eq!(r.uncached_prefill(), 1_300);
        a.expect_cached(600);
        b.expect_cached(5_000); // more than its prompt: all of it cached
        assert_eq!(r.uncached_prefill(), 400);
        a.prefill_done();
        assert_eq!(r.uncached_prefill(), 0);
        a.expect_cached(100); // after the first byte: nothing left to take
        let c = r.acquire_tokens(200, 10);
        assert_eq!(r.uncached_prefill(), 200);
        drop(c); // went away before answering
        drop((a, b));
        assert_eq!(r.uncached_prefill(), 0);
    }

    #[test]
    fn decoding_output_counts_only_requests_past_their_first_byte() {
        let r = replica();
        let mut a = r.acquire_tokens(100, 50);
        let mut b = r.acquire_tokens(1_000, 30);
        assert_eq!(r.decoding_output(), 0, "both still prefilling");
        a.prefill_done();
        a.prefill_done();
        assert_eq!(r.decoding_output(), 50);
        a.produced(20);
        b.produced(5); // before its first byte: not decoding yet
        assert_eq!(r.decoding_output(), 30);
        b.prefill_done();
        assert_eq!(r.decoding_output(), 55);
        drop(a);
        assert_eq!(r.decoding_output(), 25);
        drop(b);
        assert_eq!(r.decoding_output(), 0);
    }

    #[test]
    fn the_cached_part_of_a_prompt_is_taken_back_from_the_kv_tokens_sent() {
        let r = replica();
        r.store_load(LoadSnapshot {
            taken_at_ms: 100,
            ..LoadSnapshot::default()
        });
        let _g = r.acquire_tokens(1_600, 64);
        r.kv_tokens_shared(1_536);
        assert_eq!(r.scraped_load(100).unwrap().tokens_since, 128);
        r.kv_tokens_shared(10_000); // more than was counted: stops at 0
        assert_eq!(r.scraped_load(100).unwrap().tokens_since, 0);
    }

    #[test]
    fn since_scrape_counts_restart_on_store() {
        let r = replica();
        assert!(r.scraped_load(10).is_none());
        let g = r.acquire_tokens(5, 5);
        drop(r.acquire());
        r.store_load(LoadSnapshot {
            waiting: Some(3),
            taken_at_ms: 100,
            ..LoadSnapshot::default()
        });
        let _g2 = r.acquire_tokens(7, 1);
        drop(g);
        let l = r.scraped_load(150).unwrap();
        assert_eq!(l.waiting, Some(3));
        assert_eq!(l.age_ms, 50);
        assert_eq!(l.dispatched_since, 1);
        assert_eq!(l.completed_since, 1);
        assert_eq!(l.tokens_since, 8);
    }

    #[test]
    fn requests_a_scrape_cannot_have_counted_stay_counted_after_it() {
        let r = replica();
        let mut running = r.acquire_tokens(1_600, 64);
        running.prefill_done();
        let _on_its_way = r.acquire_tokens(1_000, 100);
        let _also = r.acquire_tokens(2_000, 100);
        // The replica reports one running and one waiting: the third of
        // llmlb's requests has not reached it (on the wire, in its API
        // server), so its place in the queue and its KV tokens carry over,
        // at the mean uncached prompt of the requests without a first byte.
        r.store_load(LoadSnapshot {
            running: Some(1),
            waiting: Some(1),
            kv_usage: Some(0.4),
            taken_at_ms: 100,
            ..LoadSnapshot::default()
        });
        let l = r.scraped_load(100).unwrap();
        assert_eq!(l.dispatched_since, 1);
        assert_eq!(l.tokens_since, 1_500);
        assert_eq!(l.queue_now(), Some(2));
        // Everything seen (or the counts unknown): nothing carries over.
        for (running, waiting) in [(Some(3), Some(0)), (Some(9), Some(4)), (None, Some(0))] {
            r.store_load(LoadSnapshot {
                running,
                waiting,
                taken_at_ms: 200,
                ..LoadSnapshot::default()
            });
            let l = r.scraped_load(200).unwrap();
            assert_eq!((l.dispatched_since, l.tokens_since), (0, 0));
        }
    }

    #[test]
    fn a_guard_carries_its_prompt_blocks_until_it_drops() {
        let r = replica();
        let mut a = r.acquire_tokens(48, 8);
        a.carry(vec![1, 2, 3]);
        let mut b = r.acquire_tokens(48, 8);
        b.carry(vec![1, 2, 4]);
        assert_eq!(r.carried().leading(&[1, 2, 3]), 3);
        drop(a);
        assert_eq!(r.carried().leading(&[1, 2, 3]), 2);
        b.carry(vec![5]); // carried anew: the old blocks go
        assert_eq!(r.carried().leading(&[1]), 0);
        drop(b);
        assert!(r.carried().is_empty());
    }

    #[test]
    fn ineligible_while_down_or_ejected() {
        let r = replica();
        assert!(r.is_eligible_at(1));
        for _ in 0..3 {
            r.health.record(false, 3, 2);
        }
        assert!(!r.is_eligible_at(1));
    }

    #[test]
    fn drained_replica_is_ineligible_until_undrained() {
        let r = replica();
        r.set_draining(true);
        assert!(!r.is_eligible_at(1));
        r.set_draining(false);
        assert!(r.is_eligible_at(1));
    }
}

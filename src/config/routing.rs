//! Config of the routing stage: model aliases and the default pool, canary
//! versions, session affinity, prefix affinity and the saturation thresholds
//! that decide when affinity gives way.

use std::collections::BTreeMap;

use serde::Deserialize;

/// `[pools.prefix] mode`: how prompts with a shared beginning are kept together.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrefixMode {
    /// No prefix affinity: the balancer alone decides.
    #[default]
    Off,
    /// Rendezvous hashing of the system prompt (or the first tokens).
    Hash,
    /// Approximate per-replica index of recently sent prompt blocks, scored
    /// by expected time to first token.
    Cache,
    /// Each replica's real prefix cache, from its KV-cache events
    /// (`kv_events` on the replicas), scored like `cache`.
    Exact,
}

impl PrefixMode {
    /// `cache` and `exact`: the modes that score each replica by the
    /// prompt tokens it holds and its queue.
    pub fn scores_by_cost(self) -> bool {
        matches!(self, PrefixMode::Cache | PrefixMode::Exact)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PrefixMode::Off => "off",
            PrefixMode::Hash => "hash",
            PrefixMode::Cache => "cache",
            PrefixMode::Exact => "exact",
        }
    }
}

/// `[pools.prefix] kv_wait`: what `cache` and `exact` charge a request
/// whose uncached tokens do not fit in a replica's free KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvWait {
    /// Nothing: a replica short of free KV cache is scored by its queue and
    /// prefill alone (the running batch frees blocks as it goes, and a warm
    /// replica keeps its prefix).
    #[default]
    None,
    /// The time the running batch takes to finish (remaining output tokens
    /// per request × the decode step).
    Batch,
}

/// `[pools.prefix] evictions`: whether `cache` and `exact` charge a
/// placement for the cached blocks of other prefixes it pushes out of a
/// replica whose cache is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Evictions {
    /// Charged once, at the prefill rate: the tokens a placement writes
    /// beyond the replica's empty room evict as many cached ones, which a
    /// later request of their prefix prefills again.
    #[default]
    Charged,
    /// Not charged: a cold replica costs its prefill and queue only.
    Free,
}

/// `[pools.prefix] preemptions`: whether `cache` and `exact` charge a
/// placement for the running requests the replica will preempt when its
/// KV cache runs out before their answers end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Preemptions {
    /// Charged at the prefill rate: one prompt's prefill for each prompt's
    /// worth of tokens the placement leaves the replica short of.
    #[default]
    Charged,
    /// Not charged: a replica is scored by its queue, prefill and cache.
    Free,
}

/// `[pools.prefix] key`: what `hash` mode hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HashKey {
    /// The system prompt; requests without one use the first `tokens` tokens.
    #[default]
    System,
    /// The first `tokens` tokens of the rendered prompt.
    Tokens,
}

/// `[pools.prefix]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrefixConfig {
    pub mode: PrefixMode,
    /// `hash`: what is hashed.
    pub key: HashKey,
    /// `hash`: leading tokens hashed with `key = "tokens"` (or when there is
    /// no system prompt). `cache`: leading tokens whose hash orders replicas
    /// when scores tie (a cold start).
    pub tokens: usize,
    /// `cache`: tokens per block (vLLM's default is 16).
    pub block_size: usize,
    /// `cache`: blocks remembered per replica (about 48 bytes each);
    /// `exact`: most blocks recorded per replica from its events (about 64
    /// bytes each), and again for the estimate used while they are unknown.
    pub max_blocks_per_replica: usize,
    /// `cache`: a replica's prefill throughput, in tokens per second.
    pub prefill_tokens_per_second: f64,
    /// `cache`: time to first token each request already on a replica
    /// (running or waiting) adds, in seconds.
    pub seconds_per_request_ahead: f64,
    /// `cache` and `exact`: keep a prefix whose demand is more than one
    /// replica should carry warm on as many replicas as it needs (off by
    /// default: on the simulated fleet it helps at some loads and hurts at
    /// others, see docs/ROUTING.md).
    pub replicate: bool,
    /// In-flight requests of one prefix that one replica carries before the
    /// prefix is copied to another (the floor of a replica's capacity).
    pub replicate_above: f64,
    /// Time constant of the per-prefix demand estimate, and how long demand
    /// stays below k − 1 copies before one is given up.
    #[serde(with = "super::duration")]
    pub replicate_hold: std::time::Duration,
    /// Give every prefix a home replica, chosen by rendezvous order within a
    /// bound on each replica's share of the demand. `cache` and `exact`
    /// prefer it when nothing holds the prefix; `hash` sends the prefix
    /// there instead of to its rendezvous first choice, and overflows in
    /// rendezvous order (off by default: on the simulated fleet it helps
    /// where caches are small for the prefixes and is mixed elsewhere, see
    /// docs/ROUTING.md).
    pub homes: bool,
    /// `cache` and `exact`: the wait charged when a prompt's uncached tokens
    /// do not fit in a replica's free KV cache (`none` by default: on real
    /// vLLM and the simulator, charging the running batch's turnover moved
    /// prefixes off warm replicas and cost hits, see docs/ROUTING.md).
    pub kv_wait: KvWait,
    /// `cache` and `exact`: whether a placement is charged for the cached
    /// blocks it evicts on a replica whose cache is full (`charged` by
    /// default: on real vLLM replicas with caches of two or three system
    /// prompts it kept more prefixes in place, see docs/ROUTING.md).
    pub evictions: Evictions,
    /// `cache` and `exact`: whether a placement is charged for the
    /// preemptions it causes on a replica whose free KV cache will not hold
    /// its prompt and the answers still being written there (`charged` by
    /// default: on real vLLM replicas whose caches hold two prompts it
    /// kept the prefix modes' p99 at or below round-robin's in more rounds,
    /// see docs/ROUTING.md).
    pub preemptions: Preemptions,
    /// `cache` and `exact`: a replica's learned prefill rate within this
    /// factor of the median over one request's candidates counts as the
    /// median, so replicas of the same hardware are compared by their
    /// queues and caches, not by noise in their rates; rates further out
    /// stand, after being weighed against the median by how many requests
    /// they were learned from (1 turns both off).
    pub rate_band: f64,
    /// `cache` and `exact`: when the cheapest replica's free KV cache
    /// cannot take the prompt's uncached tokens (it would wait for running
    /// requests to end) and another's can, at a cost within this factor,
    /// the other one serves it (1 turns it off).
    pub fit_band: f64,
}

impl Default for PrefixConfig {
    fn default() -> Self {
        PrefixConfig {
            mode: PrefixMode::Off,
            key: HashKey::System,
            tokens: 256,
            block_size: 16,
            max_blocks_per_replica: 65_536,
            prefill_tokens_per_second: 10_000.0,
            seconds_per_request_ahead: 0.02,
            replicate: false,
            replicate_above: 8.0,
            replicate_hold: std::time::Duration::from_secs(10),
            homes: false,
            kv_wait: KvWait::None,
            evictions: Evictions::Charged,
            preemptions: Preemptions::Charged,
            rate_band: 1.25,
            fit_band: 1.25,
        }
    }
}

/// `[pools.saturation]`: when a replica counts as too busy for affinity
/// (prefix and session affinity overflow, tier overflow).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SaturationConfig {
    /// Waiting requests inside the replica (scraped, corrected by what llmlb
    /// sent and saw finish since) above which it is saturated.
    pub max_queue: u64,
    /// Requests in flight from llmlb at or above which it is saturated
    /// (unset: no local bound). A replica at its `max_inflight` always is.
    pub max_in_flight: Option<u64>,
    /// KV-cache usage (a fraction, scraped, plus the tokens llmlb sent since
    /// when the replica reports its capacity) at or above which it is
    /// saturated (unset: none). Keeps affinity from piling long prompts on a
    /// replica whose cache is full, where vLLM would preempt.
    pub max_kv_usage: Option<f64>,
}

impl Default for SaturationConfig {
    fn default() -> Self {
        SaturationConfig {
            max_queue: 8,
            max_in_flight: None,
            max_kv_usage: None,
        }
    }
}

/// Where a canary's sticky key comes from, in order of preference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StickySource {
    /// The request body's `user` field.
    User,
    /// The pool's session header (`[pools.session] header`).
    Session,
    /// The presented API key (hashed; never stored).
    ApiKey,
}

impl StickySource {
    pub fn as_str(self) -> &'static str {
        match self {
            StickySource::User => "user",
            StickySource::Session => "session",
            StickySource::ApiKey => "api_key",
        }
    }
}

/// `[pools.canary]`: traffic split between replica versions.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CanaryConfig {
    /// Version → relative weight, e.g. `{ v1 = 95, v2 = 5 }`.
    pub weights: BTreeMap<String, u32>,
    /// Sticky key sources, first present wins.
    #[serde(default = "default_sticky")]
    pub sticky: Vec<StickySource>,
    /// Header that forces a version.
    #[serde(default = "default_version_header")]
    pub header: String,
}

fn default_sticky() -> Vec<StickySource> {
    vec![
        StickySource::User,
        StickySource::Session,
        StickySource::ApiKey,
    ]
}

fn default_version_header() -> String {
    "x-llmlb-version".into()
}

/// `[pools.lora]`: the LoRA adapters the pool's replicas serve. A request
/// naming one is keyed by it in prefix routing (vLLM caches each adapter's
/// blocks apart from the base model's) and placed where it is loaded.
/// Adapter names also count when a replica's KV events or
/// `vllm:lora_requests_info` report them.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoraConfig {
    /// Request `model` values that name an adapter rather than the base model.
    pub adapters: Vec<String>,
    /// Count the wait for other adapters' requests to drain: in `cache` and
    /// `exact` modes in the prefix step's cost, else by preferring replicas
    /// that have the request's adapter loaded (or a free adapter slot).
    pub placement: bool,
    /// Where placement is an order: how many more requests in flight than
    /// the least loaded candidate a replica may have and still be preferred
    /// for holding the adapter; past it, the request goes by load and may
    /// cause a swap.
    pub max_imbalance: u32,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig {
            adapters: Vec::new(),
            placement: true,
            max_imbalance: 2,
        }
    }
}

/// `[pools.session]`: the session header, for canary stickiness and, with
/// `affinity = true`, to keep a session on one replica.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionConfig {
    pub header: String,
    pub affinity: bool,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            header: "x-session-id".into(),
            affinity: false,
        }
    }
}

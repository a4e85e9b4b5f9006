//! The TOML schema, as typed structs. Parsing is strict (`deny_unknown_fields`);
//! cross-field rules live in `validate.rs`.

use serde::Deserialize;
use std::time::Duration;

use super::gateway::{
    GatewayConfig, KeyConfig, LimitsConfig, PriorityConfig, QueueConfig, TenantConfig, TierConfig,
    default_priorities,
};
use super::routing::{CanaryConfig, PrefixConfig, SaturationConfig, SessionConfig};
use super::server::ServerConfig;
use super::watch::{HealthConfig, OutlierConfig, ScrapeConfig};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub server: ServerConfig,
    #[serde(default)]
    pub pools: Vec<PoolConfig>,
    #[serde(default)]
    pub gateway: GatewayConfig,
    #[serde(default)]
    pub tiers: Vec<TierConfig>,
    #[serde(default)]
    pub keys: Vec<KeyConfig>,
    /// Tenants' weights and queue bounds for fair share within a level.
    #[serde(default)]
    pub tenants: Vec<TenantConfig>,
    /// Where per-key rate limit buckets live (local or Redis).
    #[serde(default)]
    pub limits: LimitsConfig,
    /// Queue priority levels, highest first.
    #[serde(default = "default_priorities")]
    pub priorities: Vec<PriorityConfig>,
    /// Pool for requests whose model no pool lists (unset: 404).
    #[serde(default)]
    pub default_pool: Option<String>,
    /// Other names for served models: alias → model (the body is rewritten).
    #[serde(default)]
    pub aliases: std::collections::BTreeMap<String, String>,
    /// Access log (and, later, traces).
    #[serde(default)]
    pub telemetry: super::TelemetryConfig,
    /// The store shared by several llmlb instances (none: each on its own).
    #[serde(default)]
    pub fleet: Option<super::FleetConfig>,
}

impl Config {
    /// Whether a caller may pick its tier by header.
    pub fn trusts_tier_header(&self) -> bool {
        self.gateway
            .trust_tier_header
            .unwrap_or(self.keys.is_empty())
    }

    /// Whether a caller may force a canary version by header.
    pub fn trusts_version_header(&self) -> bool {
        self.gateway
            .trust_version_header
            .unwrap_or(self.keys.is_empty())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BalancerKind {
    RoundRobin,
    LeastConnections,
    LeastTokens,
    Jsq,
    KvAware,
    P2c,
}

impl BalancerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BalancerKind::RoundRobin => "round_robin",
            BalancerKind::LeastConnections => "least_connections",
            BalancerKind::LeastTokens => "least_tokens",
            BalancerKind::Jsq => "jsq",
            BalancerKind::KvAware => "kv_aware",
            BalancerKind::P2c => "p2c",
        }
    }

    /// Whether this balancer reads scraped replica metrics.
    pub fn uses_scraped_load(self, params: &BalancingConfig) -> bool {
        match self {
            BalancerKind::Jsq | BalancerKind::KvAware => true,
            BalancerKind::P2c => matches!(params.p2c_metric, P2cMetric::Jsq | P2cMetric::KvAware),
            _ => false,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    pub name: String,
    /// Request `model` values this pool serves.
    #[serde(default)]
    pub models: Vec<String>,
    /// Also serve (list on `/v1/models` and route) the model names the
    /// replicas report on their own `GET /v1/models`, such as LoRA adapters
    /// loaded at run time; names in `models` keep their pool.
    #[serde(default)]
    pub models_from_replicas: bool,
    /// `prefill`: the pool prefills for the pools that name it in their
    /// `[pools.disaggregation] prefill_pool`, and is not routed to by name.
    #[serde(default)]
    pub role: super::PoolRole,
    /// Prefill some requests on another pool's replicas (see
    /// docs/DISAGGREGATION.md); this pool's replicas decode them.
    #[serde(default)]
    pub disaggregation: Option<super::DisaggregationConfig>,
    #[serde(default = "default_balancer")]
    pub balancer: BalancerKind,
    /// Extra attempts on another replica when the connection to a replica
    /// could not be made (the request was provably not sent).
    #[serde(default = "default_retries")]
    pub retries: u32,
    #[serde(default)]
    pub timeouts: TimeoutConfig,
    #[serde(default)]
    pub outlier: OutlierConfig,
    /// Parameters of the load-aware balancers.
    #[serde(default)]
    pub balancing: BalancingConfig,
    /// Polling each replica's `/metrics`.
    #[serde(default)]
    pub scrape: ScrapeConfig,
    /// Active health checks (`GET /health`).
    #[serde(default)]
    pub health: HealthConfig,
    /// Requests in flight per replica before new ones wait in the pool's
    /// queue; unset means no limit and no queue.
    #[serde(default)]
    pub max_inflight: Option<u32>,
    /// Requests per replica sent but not yet at their first token; further
    /// ones wait in the pool's queue (needs `max_inflight`). Unset: no bound.
    #[serde(default)]
    pub max_prefilling: Option<u32>,
    #[serde(default)]
    pub queue: QueueConfig,
    /// Prefix-affinity routing.
    #[serde(default)]
    pub prefix: PrefixConfig,
    /// When a replica is too busy for affinity.
    #[serde(default)]
    pub saturation: SaturationConfig,
    /// Traffic split between replica versions.
    #[serde(default)]
    pub canary: Option<CanaryConfig>,
    /// Session header and session affinity.
    #[serde(default)]
    pub session: SessionConfig,
    /// LoRA adapters served by the replicas.
    #[serde(default)]
    pub lora: super::routing::LoraConfig,
    /// Circuit breaker: requests of this pool being queued or forwarded at
    /// once; further requests get 503 `pool_overloaded` at once. 0: no limit.
    #[serde(default = "default_max_pending")]
    pub max_pending: u32,
    /// URLs (`["http://a:8000", ...]`) or `[[pools.replicas]]` tables.
    #[serde(default, deserialize_with = "super::replica_list::replicas")]
    pub replicas: Vec<ReplicaConfig>,
    /// Replicas from DNS instead of `replicas`.
    #[serde(default)]
    pub discovery: Option<super::DiscoveryConfig>,
    /// Certificate checks for `https://` replicas.
    #[serde(default)]
    pub tls: super::UpstreamTlsConfig,
    /// The model's own tokenizer and chat template (unset: the stand-in).
    #[serde(default)]
    pub tokenizer: Option<super::TokenizerConfig>,
    /// The replicas' own API key, sent as `Authorization: Bearer KEY` on
    /// every forwarded request (vLLM's `--api-key`). The client's key is
    /// never forwarded when `[gateway] auth = true` or when it is one of
    /// llmlb's keys.
    #[serde(default)]
    pub upstream_api_key: Option<String>,
    /// Ask streaming completions for their token count
    /// (`stream_options.include_usage`) when the client did not, and keep
    /// that usage event from the client. Off for servers that reject
    /// `stream_options`.
    #[serde(default = "default_true")]
    pub stream_usage: bool,
    /// Send each chat and text completion's priority level (its index in
    /// `[[priorities]]`, 0 for the first) as vLLM's `priority` field,
    /// replacing the client's own: replicas started with
    /// `--scheduling-policy priority` then schedule a burst that reaches
    /// them together highest level first. Off by default: under vLLM's
    /// default `fcfs` policy the field does nothing (vLLM 0.32 ignores it;
    /// its API reference says a nonzero value is refused there).
    #[serde(default)]
    pub send_priority: bool,
}

impl PoolConfig {
    /// Whether the scraper runs for this pool: as configured, else when the
    /// balancer or prefix affinity needs scraped load.
    pub fn scrape_enabled(&self) -> bool {
        self.scrape.enabled.unwrap_or_else(|| {
            self.balancer.uses_scraped_load(&self.balancing)
                || self.prefix.mode != super::routing::PrefixMode::Off
        })
    }

    /// `replica`'s concurrency limit: its own `max_inflight`, else the
    /// pool's (`None`: no limit).
    pub fn limit_of(&self, replica: &ReplicaConfig) -> Option<u32> {
        replica.max_inflight.or(self.max_inflight)
    }
}

fn default_balancer() -> BalancerKind {
    BalancerKind::LeastConnections
}

fn default_max_pending() -> u32 {
    4096
}

fn default_retries() -> u32 {
    2
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TimeoutConfig {
    /// TCP connect to a replica.
    #[serde(with = "super::duration")]
    pub connect: Duration,
    /// From sending the request until the replica's response headers arrive.
    #[serde(with = "super::duration")]
    pub first_byte: Duration,
    /// Longest silence between two body chunks of a response (the response
    /// ends within an eighth of it after that).
    #[serde(with = "super::duration")]
    pub idle: Duration,
    /// How long an idle keep-alive connection to a replica is kept for
    /// reuse. Shorter than the replicas' own keep-alive (uvicorn, which
    /// vLLM runs on, closes idle connections after 5 s), so llmlb never
    /// sends a request on a connection the replica is closing.
    #[serde(with = "super::duration")]
    pub upstream_idle: Duration,
}

impl Default for TimeoutConfig {
    fn default() -> Self {
        TimeoutConfig {
            connect: Duration::from_secs(2),
            first_byte: Duration::from_secs(120),
            idle: Duration::from_secs(60),
            upstream_idle: Duration::from_secs(4),
        }
    }
}

/// Which load a `p2c` balancer compares between its two sampled replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum P2cMetric {
    LeastConnections,
    LeastTokens,
    Jsq,
    KvAware,
}

/// Parameters of the load-aware balancers (`[pools.balancing]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BalancingConfig {
    /// Output tokens assumed for a request that sets no `max_tokens`.
    pub default_max_tokens: u32,
    /// `kv_aware`: KV usage (0..1) above which a replica is avoided.
    pub kv_threshold: f64,
    /// `kv_aware`: KV capacity in tokens per replica when the replica does
    /// not report it (`vllm:cache_config_info`).
    pub kv_capacity_tokens: u64,
    /// `p2c`: the load compared between the two sampled replicas.
    pub p2c_metric: P2cMetric,
    /// `p2c`: seed of the sampling generator (fixed for reproducible runs).
    pub seed: u64,
    /// The replicas' context length (vLLM's `--max-model-len`): a request's
    /// output allowance is capped at this minus its prompt for rate-limit
    /// charges and balancing, whatever `max_tokens` the client sent.
    pub max_model_len: u32,
}

impl Default for BalancingConfig {
    fn default() -> Self {
        BalancingConfig {
            default_max_tokens: 256,
            kv_threshold: 0.9,
            kv_capacity_tokens: 65_536,
            p2c_metric: P2cMetric::LeastTokens,
            seed: 0x11_4d_1b,
            max_model_len: 131_072,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaConfig {
    /// `http://host:port` or `https://host:port` of an OpenAI-compatible server.
    pub url: String,
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Label used in metrics and logs; defaults to `host:port`.
    #[serde(default)]
    pub name: Option<String>,
    /// Overrides the pool's `max_inflight` for this replica.
    #[serde(default)]
    pub max_inflight: Option<u32>,
    /// Model version the replica runs, for canary splits.
    #[serde(default)]
    pub version: Option<String>,
    /// `tcp://host:port` where the replica publishes its KV-cache events
    /// (vLLM `--kv-events-config` `endpoint`), for `prefix.mode = "exact"`.
    #[serde(default)]
    pub kv_events: Option<String>,
    /// `tcp://host:port` of its KV-event replay endpoint (`replay_endpoint`).
    #[serde(default)]
    pub kv_events_replay: Option<String>,
}

impl ReplicaConfig {
    /// A replica known by its URL alone, every other key at its default.
    pub fn at(url: &str) -> Self {
        ReplicaConfig {
            url: url.to_string(),
            weight: default_weight(),
            name: None,
            max_inflight: None,
            version: None,
            kv_events: None,
            kv_events_replay: None,
        }
    }
}

fn default_weight() -> u32 {
    1
}

fn default_true() -> bool {
    true
}

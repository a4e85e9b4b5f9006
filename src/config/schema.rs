//! The TOML schema, as typed structs. Parsing is strict (`deny_unknown_fields`);
//! cross-field rules live in `validate.rs`.

use serde::Deserialize;
use std::net::SocketAddr;
use std::time::Duration;

use super::gateway::{
    GatewayConfig, KeyConfig, LimitsConfig, PriorityConfig, QueueConfig, TierConfig,
    default_priorities,
};
use super::routing::{CanaryConfig, PrefixConfig, SaturationConfig, SessionConfig};

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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Client-facing OpenAI-compatible listener.
    #[serde(deserialize_with = "super::duration::listen_addr")]
    pub listen: SocketAddr,
    /// Admin listener: `/metrics`, `/healthz`, `/readyz`.
    #[serde(deserialize_with = "super::duration::listen_addr")]
    pub admin_listen: SocketAddr,
    /// Largest request body accepted; larger bodies get 413.
    pub max_body_bytes: usize,
    /// How long in-flight requests may run after SIGTERM/SIGINT before the process exits.
    #[serde(with = "duration_serde")]
    pub drain_timeout: Duration,
    /// Whether to accept HTTP/2 with prior knowledge (h2c) besides HTTP/1.1.
    pub http2: bool,
    /// Bearer token required by the admin listener's mutating endpoints
    /// (`POST /admin/...`); unset means they are open to whoever reaches the
    /// admin listener (which binds to loopback by default).
    pub admin_token: Option<String>,
    /// Add `x-llmlb-replica: NAME` to every proxied response (handy for load
    /// tests and debugging; off by default so replica names stay internal).
    pub replica_header: bool,
    /// How often `llmlb serve` checks the config file for changes (reload on
    /// change); "0s" turns watching off. SIGHUP and `POST /admin/reload`
    /// always reload.
    #[serde(with = "duration_serde")]
    pub watch_interval: Duration,
    /// After SIGTERM: how long the client listener keeps accepting (while
    /// `/readyz` already answers 503) so load balancers in front can take
    /// llmlb out of rotation before it stops accepting.
    #[serde(with = "duration_serde")]
    pub drain_delay: Duration,
    /// Largest request head (request line and headers) on HTTP/1.1; larger
    /// heads get 431. At least 8192 (hyper's smallest read buffer).
    pub max_header_bytes: usize,
    /// Most header fields in one request; more get 431.
    pub max_headers: usize,
    /// Time a client has to send a complete request head once its first byte
    /// arrived (slowloris); the connection is closed when it runs out.
    #[serde(with = "duration_serde")]
    pub header_read_timeout: Duration,
    /// A client connection with no request in flight and no bytes in either
    /// direction for this long is closed.
    #[serde(with = "duration_serde")]
    pub client_idle_timeout: Duration,
    /// Client connections served at once; further connections wait in the
    /// listen backlog (not accepted) until one closes.
    pub max_connections: usize,
    /// TLS termination on the client listener; unset: plain HTTP.
    pub tls: Option<TlsConfig>,
    /// Cross-origin access for browsers; unset: no CORS headers.
    pub cors: Option<super::CorsConfig>,
    /// Time to receive a request's whole body once its head is in; 408
    /// `body_timeout` after.
    #[serde(with = "duration_serde")]
    pub body_timeout: Duration,
    /// Request body bytes held at once across all connections (being read
    /// or waiting to be forwarded); a request that would go beyond gets 503
    /// `server_busy`.
    pub max_buffered_bytes: usize,
}

/// `[server.tls]`: PEM files of the certificate chain (leaf first) and its
/// private key (PKCS#8, PKCS#1 or SEC1).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:8080".parse().expect("static addr"),
            admin_listen: "127.0.0.1:9090".parse().expect("static addr"),
            max_body_bytes: 32 * 1024 * 1024,
            drain_timeout: Duration::from_secs(30),
            http2: true,
            admin_token: None,
            replica_header: false,
            watch_interval: Duration::from_secs(2),
            drain_delay: Duration::from_secs(5),
            max_header_bytes: 64 * 1024,
            max_headers: 100,
            header_read_timeout: Duration::from_secs(10),
            client_idle_timeout: Duration::from_secs(60),
            max_connections: 10_000,
            tls: None,
            cors: None,
            body_timeout: Duration::from_secs(30),
            max_buffered_bytes: 256 * 1024 * 1024,
        }
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
    /// Circuit breaker: requests of this pool being queued or forwarded at
    /// once; further requests get 503 `pool_overloaded` at once. 0: no limit.
    #[serde(default = "default_max_pending")]
    pub max_pending: u32,
    #[serde(default)]
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
    #[serde(with = "duration_serde")]
    pub connect: Duration,
    /// From sending the request until the replica's response headers arrive.
    #[serde(with = "duration_serde")]
    pub first_byte: Duration,
    /// Longest silence between two body chunks of a response.
    #[serde(with = "duration_serde")]
    pub idle: Duration,
    /// How long an idle keep-alive connection to a replica is kept for
    /// reuse. Shorter than the replicas' own keep-alive (uvicorn, which
    /// vLLM runs on, closes idle connections after 5 s), so llmlb never
    /// sends a request on a connection the replica is closing.
    #[serde(with = "duration_serde")]
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

/// Passive health (outlier ejection): a replica whose requests keep failing
/// (connect errors, timeouts, 5xx other than 503) is ejected for a while.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutlierConfig {
    /// Consecutive failures that eject a replica.
    pub consecutive_failures: u32,
    /// Base ejection time, multiplied by how many times the replica has been
    /// ejected in a row.
    #[serde(with = "duration_serde", alias = "base_ejection_time")]
    pub cooldown: Duration,
    /// Upper bound of one ejection.
    #[serde(with = "duration_serde")]
    pub max_ejection_time: Duration,
    /// Largest share of a pool ejected at once for timeouts and 5xx answers,
    /// in percent (at least one replica may always be ejected). Replicas that
    /// refuse connections are ejected regardless.
    pub max_ejection_percent: u32,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        OutlierConfig {
            consecutive_failures: 3,
            cooldown: Duration::from_secs(10),
            max_ejection_time: Duration::from_secs(300),
            max_ejection_percent: 50,
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

/// Metric-name presets for the scraper.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricsPreset {
    Vllm,
    Sglang,
    Custom,
}

/// Metric names for `preset = "custom"` (`[pools.scrape.metrics]`); each
/// list is tried in order and the first name present wins.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CustomMetricNames {
    pub running: Vec<String>,
    pub waiting: Vec<String>,
    pub kv_usage: Vec<String>,
}

/// Polling replicas' Prometheus `/metrics` (`[pools.scrape]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScrapeConfig {
    /// On or off; when unset, on exactly when the balancer reads scraped load.
    pub enabled: Option<bool>,
    pub path: String,
    #[serde(with = "duration_serde")]
    pub interval: Duration,
    #[serde(with = "duration_serde")]
    pub timeout: Duration,
    /// Snapshots older than this are not used: balancers fall back to the
    /// proxy's own counts for every candidate.
    #[serde(with = "duration_serde")]
    pub staleness: Duration,
    pub preset: MetricsPreset,
    pub metrics: CustomMetricNames,
}

impl Default for ScrapeConfig {
    fn default() -> Self {
        ScrapeConfig {
            enabled: None,
            path: "/metrics".into(),
            interval: Duration::from_millis(500),
            timeout: Duration::from_millis(400),
            staleness: Duration::from_secs(2),
            preset: MetricsPreset::Vllm,
            metrics: CustomMetricNames::default(),
        }
    }
}

/// Active health checks in HAProxy's manner (`[pools.health]`): `fall`
/// failed checks in a row mark a replica down, `rise` good ones bring it back.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    pub enabled: bool,
    pub path: String,
    #[serde(with = "duration_serde")]
    pub interval: Duration,
    #[serde(with = "duration_serde")]
    pub timeout: Duration,
    pub fall: u32,
    pub rise: u32,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            enabled: true,
            path: "/health".into(),
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            fall: 3,
            rise: 2,
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

fn default_weight() -> u32 {
    1
}

mod duration_serde {
    pub use crate::config::duration::deserialize;
}

fn default_true() -> bool {
    true
}

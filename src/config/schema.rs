//! The TOML schema, as typed structs. Parsing is strict (`deny_unknown_fields`);
//! cross-field rules live in `validate.rs`.

use serde::Deserialize;
use std::net::SocketAddr;
use std::time::Duration;

use super::gateway::{
    GatewayConfig, KeyConfig, PriorityConfig, QueueConfig, TierConfig, default_priorities,
};

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
    /// Queue priority levels, highest first.
    #[serde(default = "default_priorities")]
    pub priorities: Vec<PriorityConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Client-facing OpenAI-compatible listener.
    pub listen: SocketAddr,
    /// Admin listener: `/metrics`, `/healthz`, `/readyz`.
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
    /// How often `llmlb serve` checks the config file for changes (reload on
    /// change); "0s" turns watching off. SIGHUP and `POST /admin/reload`
    /// always reload.
    #[serde(with = "duration_serde")]
    pub watch_interval: Duration,
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
            watch_interval: Duration::from_secs(2),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BalancerKind {
    RoundRobin,
    LeastConnections,
}

impl BalancerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BalancerKind::RoundRobin => "round_robin",
            BalancerKind::LeastConnections => "least_connections",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    pub name: String,
    /// Request `model` values this pool serves.
    pub models: Vec<String>,
    #[serde(default = "default_balancer")]
    pub balancer: BalancerKind,
    /// Extra attempts on another replica when a connection fails before any response byte.
    #[serde(default = "default_retries")]
    pub retries: u32,
    #[serde(default)]
    pub timeouts: TimeoutConfig,
    #[serde(default)]
    pub outlier: OutlierConfig,
    /// Requests in flight per replica before new ones wait in the pool's
    /// queue; unset means no limit and no queue.
    #[serde(default)]
    pub max_inflight: Option<u32>,
    #[serde(default)]
    pub queue: QueueConfig,
    #[serde(default)]
    pub replicas: Vec<ReplicaConfig>,
}

fn default_balancer() -> BalancerKind {
    BalancerKind::LeastConnections
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
}

impl Default for TimeoutConfig {
    fn default() -> Self {
        TimeoutConfig {
            connect: Duration::from_secs(2),
            first_byte: Duration::from_secs(120),
            idle: Duration::from_secs(60),
        }
    }
}

/// Passive health: a replica whose connections keep failing is set aside for a while.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutlierConfig {
    /// Consecutive connection failures that mark a replica down.
    pub consecutive_failures: u32,
    /// How long a replica marked down stays out before it is tried again.
    #[serde(with = "duration_serde")]
    pub cooldown: Duration,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        OutlierConfig {
            consecutive_failures: 3,
            cooldown: Duration::from_secs(10),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicaConfig {
    /// `http://host:port` of an OpenAI-compatible server.
    pub url: String,
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Label used in metrics and logs; defaults to `host:port`.
    #[serde(default)]
    pub name: Option<String>,
    /// Overrides the pool's `max_inflight` for this replica.
    #[serde(default)]
    pub max_inflight: Option<u32>,
}

fn default_weight() -> u32 {
    1
}

mod duration_serde {
    pub use crate::config::duration::deserialize;
}

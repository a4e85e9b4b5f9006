//! Config of the gateway (API keys, tiers) and of admission (priority levels,
//! per-pool queues).

use serde::Deserialize;
use std::time::Duration;

use super::duration;

/// `[gateway]`: who may call, and which tier a call belongs to.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GatewayConfig {
    /// Require an API key from `[[keys]]` on every inference request.
    pub auth: bool,
    /// With `auth = false` (sidecar use), the tier may come from this header.
    pub tier_header: Option<String>,
    /// Tier of requests that name none; default: the lowest priority level.
    pub default_tier: Option<String>,
    /// Honour `tier_header` (a caller choosing its own tier and priority).
    /// Default: on when no `[[keys]]` exist, off when they do.
    pub trust_tier_header: Option<bool>,
    /// Honour a canary's version header (a caller forcing a version).
    /// Default: on when no `[[keys]]` exist, off when they do.
    pub trust_version_header: Option<bool>,
    /// For a caller without a known API key: the header naming its tenant
    /// (fair share within a priority level counts service by tenant).
    pub tenant_header: Option<String>,
    /// For a caller without a known key nor a tenant header: the body's
    /// `user` field names its tenant.
    pub tenant_from_user: bool,
}

impl Default for GatewayConfig {
    fn default() -> Self {
        GatewayConfig {
            auth: false,
            tier_header: Some("x-llmlb-tier".to_string()),
            default_tier: None,
            trust_tier_header: None,
            trust_version_header: None,
            tenant_header: Some("x-llmlb-tenant".to_string()),
            tenant_from_user: false,
        }
    }
}

/// `limits = { backend = "redis", url = "redis://..." }`: where per-key rate
/// limit buckets live. `local` (default) keeps them in this process;
/// `redis` shares them between every llmlb instance using the same Redis.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    pub backend: LimitsBackend,
    /// `redis://host:port[/db]`, required with `backend = "redis"`.
    pub url: Option<String>,
    /// Longest wait for Redis on the request path before falling back to
    /// local buckets for that request.
    #[serde(with = "duration_serde")]
    pub timeout: Duration,
    /// Prefix of every Redis key llmlb writes.
    pub key_prefix: String,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            backend: LimitsBackend::Local,
            url: None,
            timeout: Duration::from_millis(50),
            key_prefix: "llmlb:rl:".to_string(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitsBackend {
    Local,
    Redis,
}

/// `[[tiers]]`: a class of callers and the queue priority it gets.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierConfig {
    pub name: String,
    /// Name of a `[[priorities]]` level.
    pub priority: String,
    /// Pool that serves this tier's requests, whatever their model's pool.
    #[serde(default)]
    pub pool: Option<String>,
    /// Names of the replicas (in any pool) reserved for this tier.
    #[serde(default)]
    pub replicas: Vec<String>,
    /// When every replica of this tier is saturated, use the replicas of
    /// lower tiers (or, with `pool`, the model's own pool).
    #[serde(default)]
    pub overflow: bool,
}

/// `[[tenants]]`: a tenant's share of a priority level when several wait.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// The name API keys (`[[keys]] tenant`), the tenant header or `user`
    /// give.
    pub name: String,
    /// Relative share: a tenant of weight 2 is served twice the tokens of
    /// one of weight 1 while both wait.
    #[serde(default = "one")]
    pub weight: f64,
    /// Its waiters per level in each pool queue; default: the pool's
    /// `queue.tenant_max_depth`.
    #[serde(default)]
    pub max_depth: Option<usize>,
}

fn one() -> f64 {
    1.0
}

/// `[pools.queue] fairness`: how a level's waiters are ordered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fairness {
    /// Fair share among tenants by weighted tokens served (VTC).
    Tenants,
    /// Oldest first.
    Fifo,
}

/// `[[keys]]`: one API key, stored only as the SHA-256 of the key (hex).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    pub sha256: String,
    pub tenant: String,
    pub tier: String,
    #[serde(default)]
    pub requests_per_minute: Option<u32>,
    #[serde(default)]
    pub tokens_per_minute: Option<u32>,
}

/// `[[priorities]]`: queue levels, highest first.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriorityConfig {
    pub name: String,
    /// Admission objective for this level; default: the pool's `queue.max_wait`.
    #[serde(default, deserialize_with = "opt_duration")]
    pub max_wait: Option<Duration>,
    /// A request waiting this long at this level moves up one level (no
    /// starvation); default: the pool's `queue.promote_after`.
    #[serde(default, deserialize_with = "opt_duration")]
    pub promote_after: Option<Duration>,
    /// Deadline admission: a request at this level is admitted only when
    /// its predicted time to first token (queue wait plus placement) is
    /// within this; default: none (only `max_wait` applies).
    #[serde(default, deserialize_with = "opt_duration")]
    pub ttft_objective: Option<Duration>,
}

/// The levels used when the config names none.
pub fn default_priorities() -> Vec<PriorityConfig> {
    ["high", "low"]
        .into_iter()
        .map(|name| PriorityConfig {
            name: name.to_string(),
            max_wait: None,
            promote_after: None,
            ttft_objective: None,
        })
        .collect()
}

/// `[pools.queue] anticipate` when the config leaves it out.
pub const DEFAULT_ANTICIPATE: Duration = Duration::from_millis(10);

/// `[pools.queue]`: the pool's central queue, active when `max_inflight` is set.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueConfig {
    /// Waiting requests per priority level; one more gets 429.
    pub max_depth: usize,
    /// Admission objective: a request whose estimated wait exceeds it gets 429 at once.
    #[serde(with = "duration_serde")]
    pub max_wait: Duration,
    /// A request still waiting after this long gets 503.
    #[serde(with = "duration_serde")]
    pub timeout: Duration,
    /// Aging: time at one level after which a waiting request moves up a level.
    #[serde(with = "duration_serde")]
    pub promote_after: Duration,
    /// Within a level: fair share among tenants (`tenants`) or oldest first.
    pub fairness: Fairness,
    /// What a prompt token counts against an output token in a tenant's
    /// service.
    pub prompt_weight: f64,
    /// Waiters per tenant and level (a `[[tenants]] max_depth` overrides
    /// it); default: `max_depth`.
    pub tenant_max_depth: Option<usize>,
    /// Under fair share: how long a slot freed by a tenant that would go
    /// first, with nothing waiting, is held for its next request while
    /// other tenants wait ("0s": never).
    #[serde(with = "duration_serde")]
    pub anticipate: Duration,
    /// With a prefix mode (`cache`, `exact`): how long the waiter that
    /// goes next may be passed, when a slot frees, for a younger one whose
    /// prompt a replica with a free slot caches ("0s": never).
    #[serde(with = "duration_serde")]
    pub prefix_handoff: Duration,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            max_depth: 256,
            max_wait: Duration::from_secs(2),
            timeout: Duration::from_secs(30),
            promote_after: Duration::from_secs(5),
            fairness: Fairness::Tenants,
            prompt_weight: 0.5,
            tenant_max_depth: None,
            anticipate: DEFAULT_ANTICIPATE,
            prefix_handoff: Duration::ZERO,
        }
    }
}

fn opt_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration::deserialize(d).map(Some)
}

mod duration_serde {
    pub use crate::config::duration::deserialize;
}

/// `url` with the password of its user-info part replaced by `***`
/// (`redis://user:***@host:6379/0`), for logs and error messages.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_string();
    };
    match rest[..at].split_once(':') {
        Some((user, _password)) => format!("{scheme}://{user}:***{}", &rest[at..]),
        None => url.to_string(),
    }
}

//! Gateway: who is calling (API key → tenant and tier), at which priority, and
//! whether their rate limits allow another request.
//!
//! Keys never appear in logs or metric labels; tenant names do.

mod charge;
pub mod keys;
pub mod rate_limit;
pub mod shared_limits;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderMap;
use http::header::HeaderValue;

use crate::config::Config;
use crate::server::ApiError;
use rate_limit::{BucketStatus, TokenBucket};
use shared_limits::{SharedCharge, SharedLimitMetrics, SharedLimits};

pub use charge::Charge;
pub use shared_limits::redact_url;

/// Tokens assumed for the output of a request that sets no `max_tokens`.
pub const DEFAULT_OUTPUT_TOKENS: u32 = 256;

/// One configured key with its live buckets.
#[derive(Debug)]
pub struct KeyState {
    pub tenant: Arc<str>,
    pub tier: Arc<str>,
    pub level: usize,
    pub requests: Option<TokenBucket>,
    pub tokens: Option<TokenBucket>,
    /// Short digest prefix naming the key's shared buckets (never the key).
    pub id: String,
    pub requests_per_minute: Option<u32>,
    pub tokens_per_minute: Option<u32>,
}

/// Who a request is from, after authentication.
#[derive(Debug, Clone)]
pub struct Caller {
    pub tenant: Option<Arc<str>>,
    pub tier: Option<Arc<str>>,
    /// Priority level index (0 = highest).
    pub level: usize,
    pub key: Option<Arc<KeyState>>,
    /// Shared buckets (Redis), when configured.
    pub shared: Option<Arc<SharedLimits>>,
}

#[derive(Debug)]
pub struct Gateway {
    shared: Option<Arc<SharedLimits>>,
    auth: bool,
    tier_header: Option<String>,
    tiers: HashMap<String, usize>,
    default_level: usize,
    digests: Vec<[u8; 32]>,
    keys: Vec<Arc<KeyState>>,
    /// Names of the priority levels, highest first.
    pub levels: Vec<String>,
}

/// The `x-ratelimit-*` headers for one request.
#[derive(Debug, Clone, Default)]
pub struct RateHeaders {
    pub requests: Option<BucketStatus>,
    pub tokens: Option<BucketStatus>,
}

impl RateHeaders {
    pub fn apply(&self, headers: &mut HeaderMap) {
        for (kind, status) in [("requests", self.requests), ("tokens", self.tokens)] {
            if let Some(s) = status {
                let pairs = [
                    (format!("x-ratelimit-limit-{kind}"), s.limit.to_string()),
                    (
                        format!("x-ratelimit-remaining-{kind}"),
                        s.remaining.to_string(),
                    ),
                    (format!("x-ratelimit-reset-{kind}"), format_reset(s.reset)),
                ];
                for (name, value) in pairs {
                    if let (Ok(n), Ok(v)) = (
                        http::header::HeaderName::from_bytes(name.as_bytes()),
                        HeaderValue::from_str(&value),
                    ) {
                        headers.insert(n, v);
                    }
                }
            }
        }
    }
}

/// OpenAI's reset format: `1s`, `6m0s`, `250ms`.
pub fn format_reset(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs_f64().ceil() as u64;
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

impl Gateway {
    /// Builds the gateway for a validated config. Buckets of keys present in
    /// `previous` (same digest) are carried over.
    pub fn build(
        config: &Config,
        previous: Option<&Gateway>,
        now: Instant,
        shared_metrics: &SharedLimitMetrics,
    ) -> Gateway {
        let shared = match config.limits.backend {
            crate::config::LimitsBackend::Local => None,
            crate::config::LimitsBackend::Redis => previous
                .and_then(|g| g.shared.clone())
                .filter(|s| s.same_settings(&config.limits))
                .or_else(|| SharedLimits::new(&config.limits, shared_metrics)),
        };
        let levels: Vec<String> = config.priorities.iter().map(|p| p.name.clone()).collect();
        let level_of = |name: &str| {
            levels
                .iter()
                .position(|l| l == name)
                .unwrap_or(levels.len() - 1)
        };
        let tiers: HashMap<String, usize> = config
            .tiers
            .iter()
            .map(|t| (t.name.clone(), level_of(&t.priority)))
            .collect();
        let default_level = config
            .gateway
            .default_tier
            .as_ref()
            .and_then(|t| tiers.get(t).copied())
            .unwrap_or(levels.len().saturating_sub(1));
        let mut digests = Vec::new();
        let mut keys = Vec::new();
        for k in &config.keys {
            let digest = keys::parse_digest(&k.sha256.to_ascii_lowercase())
                .expect("key digests checked by config validation");
            let kept = previous.and_then(|g| {
                g.digests
                    .iter()
                    .position(|d| *d == digest)
                    .map(|i| Arc::clone(&g.keys[i]))
            });
            let same_limits = kept.as_ref().is_some_and(|s| {
                s.tier.as_ref() == k.tier
                    && s.requests.as_ref().map(|b| b.peek(now).limit)
                        == k.requests_per_minute.map(u64::from)
                    && s.tokens.as_ref().map(|b| b.peek(now).limit)
                        == k.tokens_per_minute.map(u64::from)
            });
            let state = match kept {
                Some(s) if same_limits && *s.tenant == *k.tenant => s,
                _ => Arc::new(KeyState {
                    tenant: Arc::from(k.tenant.as_str()),
                    tier: Arc::from(k.tier.as_str()),
                    level: tiers.get(&k.tier).copied().unwrap_or(default_level),
                    requests: k
                        .requests_per_minute
                        .map(|l| TokenBucket::per_minute(l, now)),
                    tokens: k.tokens_per_minute.map(|l| TokenBucket::per_minute(l, now)),
                    id: k.sha256.to_ascii_lowercase()[..16].to_string(),
                    requests_per_minute: k.requests_per_minute,
                    tokens_per_minute: k.tokens_per_minute,
                }),
            };
            digests.push(digest);
            keys.push(state);
        }
        Gateway {
            shared,
            auth: config.gateway.auth,
            tier_header: config
                .gateway
                .tier_header
                .clone()
                .filter(|_| config.trusts_tier_header()),
            tiers,
            default_level,
            digests,
            keys,
            levels,
        }
    }

    /// Identifies the caller. With auth on, a missing or unknown key is 401.
    /// With auth off, a known key still names its tenant and tier, and
    /// otherwise the tier header (when configured) picks the tier.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        let presented = keys::presented_key(headers);
        let key = presented
            .and_then(|k| keys::find(&self.digests, k))
            .map(|i| Arc::clone(&self.keys[i]));
        if let Some(key) = key {
            return Ok(Caller {
                tenant: Some(Arc::clone(&key.tenant)),
                tier: Some(Arc::clone(&key.tier)),
                level: key.level,
                key: Some(key),
                shared: self.shared.clone(),
            });
        }
        if self.auth {
            return Err(ApiError::Unauthorized(if presented.is_some() {
                "invalid API key"
            } else {
                "missing API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`"
            }));
        }
        let tier = self
            .tier_header
            .as_ref()
            .and_then(|h| headers.get(h.as_str()))
            .and_then(|v| v.to_str().ok())
            .and_then(|t| self.tiers.get_key_value(t));
        Ok(match tier {
            Some((name, &level)) => Caller {
                tenant: None,
                tier: Some(Arc::from(name.as_str())),
                level,
                key: None,
                shared: None,
            },
            None => Caller {
                tenant: None,
                tier: None,
                level: self.default_level,
                key: None,
                shared: None,
            },
        })
    }
}

impl Caller {
    /// Charges one request and `tokens` estimated tokens against the key's
    /// limits: the shared buckets when configured (falling back to local ones
    /// when the backend fails), else the local ones.
    pub async fn charge(
        &self,
        tokens: u64,
        now: Instant,
    ) -> Result<RateHeaders, (ApiError, RateHeaders)> {
        let (Some(key), Some(shared)) = (&self.key, &self.shared) else {
            return self.charge_local(tokens, now);
        };
        if key.requests_per_minute.is_none() && key.tokens_per_minute.is_none() {
            return Ok(RateHeaders::default());
        }
        match shared
            .charge(
                &key.id,
                key.requests_per_minute,
                key.tokens_per_minute,
                tokens,
            )
            .await
        {
            Ok(SharedCharge::Admitted { requests, tokens }) => Ok(RateHeaders { requests, tokens }),
            Ok(SharedCharge::Denied {
                kind,
                wait,
                requests,
                tokens,
            }) => Err((
                ApiError::RateLimited {
                    kind,
                    retry_after: wait,
                },
                RateHeaders { requests, tokens },
            )),
            Err(_) => self.charge_local(tokens, now),
        }
    }

    /// Charges the local buckets. Nothing is charged when either refuses.
    pub fn charge_local(
        &self,
        tokens: u64,
        now: Instant,
    ) -> Result<RateHeaders, (ApiError, RateHeaders)> {
        let Some(key) = &self.key else {
            return Ok(RateHeaders::default());
        };
        let mut headers = RateHeaders::default();
        if let Some(b) = &key.requests {
            match b.try_take(1, now) {
                Ok(s) => headers.requests = Some(s),
                Err((s, wait)) => {
                    headers.requests = Some(s);
                    headers.tokens = key.tokens.as_ref().map(|t| t.peek(now));
                    return Err((
                        ApiError::RateLimited {
                            kind: "requests",
                            retry_after: wait,
                        },
                        headers,
                    ));
                }
            }
        }
        if let Some(b) = &key.tokens {
            match b.try_take(tokens, now) {
                Ok(s) => headers.tokens = Some(s),
                Err((s, wait)) => {
                    if let Some(r) = &key.requests {
                        r.adjust(1, now);
                        headers.requests = Some(r.peek(now));
                    }
                    headers.tokens = Some(s);
                    return Err((
                        ApiError::RateLimited {
                            kind: "tokens",
                            retry_after: wait,
                        },
                        headers,
                    ));
                }
            }
        }
        Ok(headers)
    }

    /// Runs a shared-bucket adjustment in the background.
    fn adjust_shared(&self, token_delta: i64, refund_request: bool) -> bool {
        let (Some(key), Some(shared)) = (&self.key, &self.shared) else {
            return false;
        };
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let (key, shared) = (Arc::clone(key), Arc::clone(shared));
            rt.spawn(async move {
                shared
                    .adjust(
                        &key.id,
                        key.requests_per_minute,
                        key.tokens_per_minute,
                        token_delta,
                        refund_request,
                    )
                    .await;
            });
        }
        true
    }

    /// Gives back a whole charge (the request was not served).
    pub fn refund(&self, tokens: u64, now: Instant) {
        if self.adjust_shared(tokens as i64, true) {
            return;
        }
        if let Some(key) = &self.key {
            if let Some(b) = &key.requests {
                b.adjust(1, now);
            }
            if let Some(b) = &key.tokens {
                b.adjust(tokens as i64, now);
            }
        }
    }

    /// Settles an estimated token charge with what the response reported.
    pub fn settle(&self, estimated: u64, actual: u64, now: Instant) {
        if self.adjust_shared(estimated as i64 - actual as i64, false) {
            return;
        }
        if let Some(b) = self.key.as_ref().and_then(|k| k.tokens.as_ref()) {
            b.adjust(estimated as i64 - actual as i64, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gateway(auth: bool) -> Gateway {
        gateway_with(&format!("auth = {auth}"))
    }

    fn gateway_with(settings: &str) -> Gateway {
        let text = format!(
            "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n[[pools.replicas]]\nurl = \"http://127.0.0.1:1\"\n\
             [gateway]\n{settings}\n\
             [[tiers]]\nname = \"paid\"\npriority = \"high\"\n[[tiers]]\nname = \"free\"\npriority = \"low\"\n\
             [[keys]]\nsha256 = \"{}\"\ntenant = \"acme\"\ntier = \"paid\"\nrequests_per_minute = 2\ntokens_per_minute = 100\n",
            keys::hash_key("sk-acme")
        );
        Gateway::build(
            &crate::config::parse(&text).unwrap(),
            None,
            Instant::now(),
            &SharedLimitMetrics::new(&prometheus::Registry::new()),
        )
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn key_maps_to_tenant_tier_and_priority() {
        let g = gateway(true);
        let c = g
            .authenticate(&headers(&[("authorization", "Bearer sk-acme")]))
            .unwrap();
        assert_eq!(c.tenant.as_deref(), Some("acme"));
        assert_eq!(c.tier.as_deref(), Some("paid"));
        assert_eq!(c.level, 0);
    }

    #[test]
    fn auth_on_rejects_missing_and_unknown_keys() {
        let g = gateway(true);
        assert!(matches!(
            g.authenticate(&HeaderMap::new()),
            Err(ApiError::Unauthorized(_))
        ));
        assert!(matches!(
            g.authenticate(&headers(&[("x-api-key", "sk-guess")])),
            Err(ApiError::Unauthorized(_))
        ));
    }

    #[test]
    fn auth_off_uses_tier_header_then_lowest_level() {
        // With keys configured the header is ignored unless trusted.
        let c = gateway(false)
            .authenticate(&headers(&[("x-llmlb-tier", "paid")]))
            .unwrap();
        assert_eq!((c.tier.as_deref(), c.level), (None, 1));
        let g = gateway_with("auth = false\ntrust_tier_header = true");
        let c = g
            .authenticate(&headers(&[("x-llmlb-tier", "paid")]))
            .unwrap();
        assert_eq!((c.tier.as_deref(), c.level), (Some("paid"), 0));
        let c = g.authenticate(&HeaderMap::new()).unwrap();
        assert_eq!((c.tier.as_deref(), c.level), (None, 1));
        let c = g
            .authenticate(&headers(&[("x-llmlb-tier", "platinum")]))
            .unwrap();
        assert_eq!(c.level, 1);
    }

    #[test]
    fn request_and_token_limits() {
        let g = gateway(true);
        let c = g
            .authenticate(&headers(&[("authorization", "Bearer sk-acme")]))
            .unwrap();
        let now = Instant::now();
        let h = c.charge_local(40, now).unwrap();
        assert_eq!(h.requests.unwrap().remaining, 1);
        assert_eq!(h.tokens.unwrap().remaining, 60);
        // Tokens refuse: the request charge is given back.
        let (err, h) = c.charge_local(80, now).unwrap_err();
        assert!(matches!(err, ApiError::RateLimited { kind: "tokens", .. }));
        assert_eq!(h.requests.unwrap().remaining, 1);
        c.charge_local(10, now).unwrap();
        let (err, _) = c.charge_local(1, now).unwrap_err();
        assert!(matches!(
            err,
            ApiError::RateLimited {
                kind: "requests",
                ..
            }
        ));
    }

    #[test]
    fn reset_format() {
        assert_eq!(format_reset(Duration::from_millis(250)), "250ms");
        assert_eq!(format_reset(Duration::from_secs(1)), "1s");
        assert_eq!(format_reset(Duration::from_secs(360)), "6m0s");
        assert_eq!(format_reset(Duration::from_secs(3725)), "1h2m5s");
    }
}

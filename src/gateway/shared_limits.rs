//! Per-key rate limits shared by every llmlb instance through Redis.
//!
//! Each key has two buckets in Redis (requests, tokens), each a hash of
//! `level` and `ts`. One Lua script refills and charges both atomically, with
//! Redis's own clock (`TIME`), so instances never disagree about time: a
//! request is admitted by all the buckets or charged to none. Buckets expire
//! after two idle minutes (a full bucket needs no storage).
//!
//! Redis is never allowed to fail a request: on any error or after
//! `limits.timeout`, the caller falls back to its local buckets for that
//! request, the fallback is counted (`llmlb_rate_limit_fallbacks_total`) and
//! logged, and the connection is re-established at most once a second.
//!
//! Refunds and settlements run in the background on the runtime that took
//! the charge (remembered at the first charge), so a charge dropped outside
//! a runtime is still settled; with no runtime at all the adjustment is
//! lost, and that is logged and counted (`llmlb_rate_limit_adjustments_lost_total`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use prometheus::{IntCounter, IntGaugeVec, Registry};

use super::LimitKind;
use super::lua::{ADJUST, TAKE};
use super::rate_limit::BucketStatus;
use crate::config::LimitsConfig;
pub use crate::config::redact_url;
use crate::fleet::{StoreClient, StoreConn};
use crate::telemetry::clock::now_millis;

/// Shared limiter metrics, registered once per process.
#[derive(Debug, Clone)]
pub struct SharedLimitMetrics {
    /// Requests whose limits were checked locally because Redis failed.
    pub fallbacks: IntCounter,
    /// Refunds and settlements that found no runtime to run on.
    pub lost_adjustments: IntCounter,
    /// 1 while the last Redis call succeeded; labelled `backend="redis"`
    /// and exported only once a shared backend is configured (no series at
    /// all without one, rather than a 0 that reads as "down").
    pub up: IntGaugeVec,
}

impl SharedLimitMetrics {
    pub fn new(registry: &Registry) -> SharedLimitMetrics {
        let family = crate::telemetry::Family::new(registry);
        let fallbacks = family.counter_one(
            "llmlb_rate_limit_fallbacks_total",
            "Rate-limit checks done with local buckets because the shared backend failed.",
        );
        let lost_adjustments = family.counter_one(
            "llmlb_rate_limit_adjustments_lost_total",
            "Shared rate-limit refunds and settlements dropped because no runtime could run them.",
        );
        let up = family.gauge(
            "llmlb_rate_limit_backend_up",
            "1 while the shared rate-limit backend answers (only when one is configured).",
            &["backend"],
        );
        SharedLimitMetrics {
            fallbacks,
            lost_adjustments,
            up,
        }
    }
}

/// The outcome of a shared charge.
#[derive(Debug, Clone, PartialEq)]
pub enum SharedCharge {
    Admitted {
        requests: Option<BucketStatus>,
        tokens: Option<BucketStatus>,
    },
    Denied {
        kind: LimitKind,
        wait: Duration,
        requests: Option<BucketStatus>,
        tokens: Option<BucketStatus>,
    },
}

pub struct SharedLimits {
    url: String,
    /// `url` with its password replaced, for logs.
    shown: String,
    client: StoreClient,
    conn: ArcSwapOption<StoreConn>,
    last_connect_ms: AtomicU64,
    timeout: Duration,
    prefix: String,
    take: redis::Script,
    adjust: redis::Script,
    metrics: SharedLimitMetrics,
    /// The runtime charges run on, for adjustments made outside one.
    runtime: OnceLock<tokio::runtime::Handle>,
}

impl std::fmt::Debug for SharedLimits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedLimits")
            .field("url", &self.shown)
            .finish()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SharedError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis did not answer within {0:?}")]
    Timeout(Duration),
    #[error("not connected to redis (next attempt within a second)")]
    NotConnected,
}

impl SharedLimits {
    /// Builds the limiter; connects lazily on first use.
    pub fn new(config: &LimitsConfig, metrics: &SharedLimitMetrics) -> Option<Arc<SharedLimits>> {
        let url = config.url.clone()?;
        let client = StoreClient::open(&url).ok()?;
        Some(Arc::new(SharedLimits {
            shown: redact_url(&url),
            url,
            client,
            conn: ArcSwapOption::empty(),
            last_connect_ms: AtomicU64::new(0),
            timeout: config.timeout,
            prefix: config.key_prefix.clone(),
            take: redis::Script::new(TAKE),
            adjust: redis::Script::new(ADJUST),
            metrics: metrics.clone(),
            runtime: OnceLock::new(),
        }))
    }

    /// Whether a reload can keep this limiter (same backend settings).
    pub fn same_settings(&self, config: &LimitsConfig) -> bool {
        config.url.as_deref() == Some(self.url.as_str())
            && config.timeout == self.timeout
            && config.key_prefix == self.prefix
    }

    async fn connection(&self) -> Result<StoreConn, SharedError> {
        if let Some(c) = self.conn.load_full() {
            return Ok((*c).clone());
        }
        let now = now_millis();
        let last = self.last_connect_ms.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < 1000 {
            return Err(SharedError::NotConnected);
        }
        self.last_connect_ms.store(now, Ordering::Relaxed);
        let conn = tokio::time::timeout(self.timeout * 4, self.client.connect())
            .await
            .map_err(|_| SharedError::Timeout(self.timeout * 4))??;
        self.conn.store(Some(Arc::new(conn.clone())));
        tracing::info!(url = %self.shown, "connected to the shared rate-limit backend");
        Ok(conn)
    }

    fn failed(&self, err: &SharedError) {
        if !matches!(err, SharedError::NotConnected) {
            tracing::warn!(url = %self.shown, error = %err, "shared rate limits unavailable; using local buckets");
        }
        self.conn.store(None);
        self.metrics.up.with_label_values(&["redis"]).set(0);
        self.metrics.fallbacks.inc();
    }

    /// The key's request and token buckets; on a cluster under one hash tag
    /// (the script that charges both needs them in one slot).
    fn keys(&self, key_id: &str) -> (String, String) {
        let p = &self.prefix;
        if self.client.is_cluster() {
            (
                format!("{{{p}{key_id}}}:req"),
                format!("{{{p}{key_id}}}:tok"),
            )
        } else {
            (format!("{p}{key_id}:req"), format!("{p}{key_id}:tok"))
        }
    }

    /// Charges one request and `tokens` against the key's shared buckets.
    /// `Err` means Redis could not be used; the caller falls back to local.
    pub async fn charge(
        &self,
        key_id: &str,
        requests_per_minute: Option<u32>,
        tokens_per_minute: Option<u32>,
        tokens: u64,
    ) -> Result<SharedCharge, SharedError> {
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            self.runtime.get_or_init(|| handle);
        }
        let result = self
            .try_charge(key_id, requests_per_minute, tokens_per_minute, tokens)
            .await;
        match &result {
            Ok(_) => self.metrics.up.with_label_values(&["redis"]).set(1),
            Err(e) => self.failed(e),
        }
        result
    }

    async fn try_charge(
        &self,
        key_id: &str,
        rpm: Option<u32>,
        tpm: Option<u32>,
        tokens: u64,
    ) -> Result<SharedCharge, SharedError> {
        let mut conn = self.connection().await?;
        let (rk, tk) = self.keys(key_id);
        let mut invocation = self.take.key(rk);
        invocation
            .key(tk)
            .arg(rpm.unwrap_or(0))
            .arg(tpm.unwrap_or(0))
            .arg(tokens);
        let (denied, rl, tl, wait): (u8, String, String, String) =
            tokio::time::timeout(self.timeout, invocation.invoke_async(&mut conn))
                .await
                .map_err(|_| SharedError::Timeout(self.timeout))??;
        let status = |cap: Option<u32>, level: &str| {
            let cap = cap?;
            let level: f64 = level.parse().unwrap_or(0.0);
            let per_second = f64::from(cap) / 60.0;
            Some(BucketStatus {
                limit: u64::from(cap),
                remaining: level.max(0.0).floor() as u64,
                reset: Duration::from_secs_f64((f64::from(cap) - level).max(0.0) / per_second),
            })
        };
        let requests = status(rpm, &rl);
        let tokens = status(tpm, &tl);
        Ok(match denied {
            0 => SharedCharge::Admitted { requests, tokens },
            kind => SharedCharge::Denied {
                kind: if kind == 1 {
                    LimitKind::Requests
                } else {
                    LimitKind::Tokens
                },
                wait: Duration::from_secs_f64(wait.parse::<f64>().unwrap_or(1.0).max(0.0)),
                requests,
                tokens,
            },
        })
    }

    /// Runs [`SharedLimits::adjust`] in the background: on the current
    /// runtime, else on the one charges ran on. Without either the
    /// adjustment is lost, logged and counted.
    pub fn adjust_later(
        self: &Arc<Self>,
        key_id: &str,
        requests_per_minute: Option<u32>,
        tokens_per_minute: Option<u32>,
        token_delta: i64,
        refund_request: bool,
    ) {
        let handle = tokio::runtime::Handle::try_current()
            .ok()
            .or_else(|| self.runtime.get().cloned());
        let Some(handle) = handle else {
            self.metrics.lost_adjustments.inc();
            tracing::warn!(url = %self.shown, "no runtime to settle a shared rate-limit charge; the adjustment is lost");
            return;
        };
        let (me, key_id) = (Arc::clone(self), key_id.to_string());
        handle.spawn(async move {
            me.adjust(
                &key_id,
                requests_per_minute,
                tokens_per_minute,
                token_delta,
                refund_request,
            )
            .await;
        });
    }

    /// Gives back (`delta > 0`) or charges more tokens after the fact; also
    /// gives back the request when `refund_request` (the request was not served).
    pub async fn adjust(
        &self,
        key_id: &str,
        requests_per_minute: Option<u32>,
        tokens_per_minute: Option<u32>,
        token_delta: i64,
        refund_request: bool,
    ) {
        let result: Result<(), SharedError> = async {
            let mut conn = self.connection().await?;
            let (rk, tk) = self.keys(key_id);
            if let (Some(cap), true) = (tokens_per_minute, token_delta != 0) {
                let mut inv = self.adjust.key(tk);
                inv.arg(cap).arg(token_delta);
                tokio::time::timeout(self.timeout, inv.invoke_async::<String>(&mut conn))
                    .await
                    .map_err(|_| SharedError::Timeout(self.timeout))??;
            }
            if let (Some(cap), true) = (requests_per_minute, refund_request) {
                let mut inv = self.adjust.key(rk);
                inv.arg(cap).arg(1);
                tokio::time::timeout(self.timeout, inv.invoke_async::<String>(&mut conn))
                    .await
                    .map_err(|_| SharedError::Timeout(self.timeout))??;
            }
            Ok(())
        }
        .await;
        if let Err(e) = result {
            tracing::debug!(error = %e, "shared rate-limit settlement skipped");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limiter(metrics: &SharedLimitMetrics) -> Arc<SharedLimits> {
        // Port 9 on loopback: nothing listens, so every Redis call fails fast.
        let config: LimitsConfig =
            toml::from_str("backend = \"redis\"\nurl = \"redis://127.0.0.1:9/0\"").unwrap();
        SharedLimits::new(&config, metrics).unwrap()
    }

    #[test]
    fn an_adjustment_outside_a_runtime_uses_the_charging_one_or_is_counted_lost() {
        let metrics = SharedLimitMetrics::new(&Registry::new());
        let never_charged = limiter(&metrics);
        never_charged.adjust_later("k", Some(10), Some(100), 5, true);
        assert_eq!(metrics.lost_adjustments.get(), 1);
        let charged = limiter(&metrics);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let result = rt.block_on(charged.charge("k", Some(10), Some(100), 5));
        assert!(result.is_err(), "nothing listens on port 9");
        assert_eq!(metrics.fallbacks.get(), 1);
        // Dropped outside the runtime, the refund still goes to it.
        charged.adjust_later("k", Some(10), Some(100), 5, true);
        assert_eq!(metrics.lost_adjustments.get(), 1);
        rt.block_on(tokio::task::yield_now());
    }

    #[test]
    fn redacts_the_password_only() {
        assert_eq!(
            redact_url("redis://user:secret@host:6379/0"),
            "redis://user:***@host:6379/0"
        );
        assert_eq!(redact_url("redis://host:6379"), "redis://host:6379");
    }
}

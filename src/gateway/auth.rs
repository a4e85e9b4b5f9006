//! Who is calling: the API key (Bearer or `x-api-key`) names a tenant, a
//! tier and a priority level; without auth, a trusted tier header or the
//! default tier does.
//!
//! The [`Gateway`] is built once per config: key digests, each key's live
//! state ([`super::key_state`]), the tiers' priority levels, and the shared
//! (Redis) limiter when `[limits] backend = "redis"`. A key is looked up by
//! hashing it once and comparing every digest in constant time
//! ([`super::keys`]). Cost per request: one SHA-256 and one comparison per
//! configured key.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use http::HeaderMap;

use super::AuthError;
use super::key_state::KeyState;
use super::keys;
use super::shared_limits::{SharedLimitMetrics, SharedLimits};
use crate::config::{Config, LimitsBackend};

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
    /// Where this request's charge was taken, once it was: its refund and
    /// settlement go to the same buckets.
    pub(super) ledger: OnceLock<Ledger>,
}

/// The buckets a charge was taken from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ledger {
    Local,
    Shared,
}

#[derive(Debug)]
pub struct Gateway {
    shared: Option<Arc<SharedLimits>>,
    auth: bool,
    tier_header: Option<http::HeaderName>,
    tiers: HashMap<String, usize>,
    default_level: usize,
    digests: Vec<[u8; 32]>,
    keys: Vec<Arc<KeyState>>,
    /// Names of the priority levels, highest first.
    pub levels: Vec<String>,
    /// The header naming a keyless caller's tenant.
    tenant_header: Option<http::HeaderName>,
    /// A keyless caller without the header: the body's `user` names it.
    tenant_from_user: bool,
    /// The tenant of a request no one names, shared (no allocation each).
    no_tenant: Arc<str>,
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
            LimitsBackend::Local => None,
            LimitsBackend::Redis => previous
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
            digests.push(digest);
            keys.push(KeyState::build(k, kept, &tiers, default_level, now));
        }
        Gateway {
            shared,
            auth: config.gateway.auth,
            // Without tiers no header can name one: it is not read.
            tier_header: (config.gateway.tier_header.as_ref())
                .filter(|_| config.trusts_tier_header() && !config.tiers.is_empty())
                .and_then(|h| http::HeaderName::from_bytes(h.as_bytes()).ok()),
            tiers,
            default_level,
            digests,
            keys,
            levels,
            tenant_header: (config.gateway.tenant_header.as_ref())
                .and_then(|h| http::HeaderName::from_bytes(h.as_bytes()).ok()),
            tenant_from_user: config.gateway.tenant_from_user,
            no_tenant: Arc::from(""),
        }
    }

    /// The tenant fair share counts a request to: its API key's tenant,
    /// else the tenant header's value, else (with `tenant_from_user`) the
    /// body's `user`; empty when none names one.
    pub fn tenant_of(&self, caller: &Caller, headers: &HeaderMap, user: Option<&str>) -> Arc<str> {
        if let Some(t) = &caller.tenant {
            return Arc::clone(t);
        }
        let header = (self.tenant_header.as_ref())
            .and_then(|h| headers.get(h))
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty());
        let user = user.filter(|u| self.tenant_from_user && !u.is_empty());
        match header.or(user) {
            Some(name) => Arc::from(name),
            None => Arc::clone(&self.no_tenant),
        }
    }

    /// The tenant of a request no one names.
    pub fn no_tenant(&self) -> Arc<str> {
        Arc::clone(&self.no_tenant)
    }

    /// [`Self::tenant_of`] once the body's `user` is known, for a request
    /// whose headers name no tenant (`tenant_of` gave the empty one): the
    /// same answer without searching the headers again.
    pub fn tenant_of_user(&self, caller: &Caller, user: Option<&str>) -> Arc<str> {
        if let Some(t) = &caller.tenant {
            return Arc::clone(t);
        }
        match user.filter(|u| self.tenant_from_user && !u.is_empty()) {
            Some(name) => Arc::from(name),
            None => Arc::clone(&self.no_tenant),
        }
    }

    /// Identifies the caller. With auth on, a missing or unknown key is
    /// refused. With auth off, a known key still names its tenant and tier,
    /// and otherwise the tier header (when configured) picks the tier.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Caller, AuthError> {
        // Without keys and without auth no presented key matters: the
        // headers are not searched for one.
        let presented = (self.auth || !self.digests.is_empty())
            .then(|| keys::presented_key(headers))
            .flatten();
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
                ledger: OnceLock::new(),
            });
        }
        if self.auth {
            return Err(if presented.is_some() {
                AuthError::InvalidKey
            } else {
                AuthError::MissingKey
            });
        }
        let tier = self
            .tier_header
            .as_ref()
            .and_then(|h| headers.get(h))
            .and_then(|v| v.to_str().ok())
            .and_then(|t| self.tiers.get_key_value(t));
        let (tier, level) = match tier {
            Some((name, &level)) => (Some(Arc::from(name.as_str())), level),
            None => (None, self.default_level),
        };
        Ok(Caller {
            tenant: None,
            tier,
            level,
            key: None,
            shared: None,
            ledger: OnceLock::new(),
        })
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub fn gateway(auth: bool) -> Gateway {
        gateway_with(&format!("auth = {auth}"))
    }

    pub fn gateway_with(settings: &str) -> Gateway {
        gateway_from("", settings)
    }

    /// The test gateway with `top` as top-level keys (`limits = ...`) and
    /// `settings` in `[gateway]`.
    pub fn gateway_from(top: &str, settings: &str) -> Gateway {
        let text = format!(
            "{top}\n[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n[[pools.replicas]]\nurl = \"http://127.0.0.1:1\"\n\
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

    /// The configured key's caller, authenticated by a Bearer header.
    pub fn acme(g: &Gateway) -> Caller {
        g.authenticate(&headers(&[("authorization", "Bearer sk-acme")]))
            .unwrap()
    }

    pub fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn the_tenant_comes_from_the_key_else_the_header_else_user_when_asked() {
        let g = gateway(false);
        let by_key = acme(&g);
        let named = headers(&[("x-llmlb-tenant", "batch")]);
        assert_eq!(&*g.tenant_of(&by_key, &named, Some("u")), "acme");
        let anon = g.authenticate(&HeaderMap::new()).unwrap();
        assert_eq!(&*g.tenant_of(&anon, &named, Some("u")), "batch");
        assert_eq!(&*g.tenant_of(&anon, &HeaderMap::new(), Some("u")), "");
        let by_user = gateway_with("auth = false\ntenant_from_user = true");
        assert_eq!(
            &*by_user.tenant_of(&anon, &HeaderMap::new(), Some("u")),
            "u"
        );
    }

    /// Once the body is read, a caller the headers named no tenant for is
    /// given the tenant `tenant_of` would give it with the body's `user`.
    #[test]
    fn the_tenant_from_the_user_alone_is_tenant_of_without_a_header() {
        let anonymous = HeaderMap::new();
        let empty = headers(&[("x-llmlb-tenant", "")]);
        for g in [
            gateway(false),
            gateway_with("auth = false\ntenant_from_user = true"),
        ] {
            let anon = g.authenticate(&anonymous).unwrap();
            for user in [None, Some(""), Some("u")] {
                for h in [&anonymous, &empty] {
                    assert_eq!(&*g.tenant_of(&anon, h, None), "");
                    let alone = g.tenant_of_user(&anon, user);
                    assert_eq!(alone, g.tenant_of(&anon, h, user));
                }
                let by_key = acme(&g);
                assert_eq!(&*g.tenant_of_user(&by_key, user), "acme");
            }
        }
    }

    /// Without keys and without auth a presented key names no one: the
    /// caller is the keyless one, as with no key at all.
    #[test]
    fn without_keys_a_presented_key_changes_nothing() {
        let text = "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n[[pools.replicas]]\nurl = \"http://127.0.0.1:1\"\n";
        let g = Gateway::build(
            &crate::config::parse(text).unwrap(),
            None,
            Instant::now(),
            &SharedLimitMetrics::new(&prometheus::Registry::new()),
        );
        for presented in [
            headers(&[("authorization", "Bearer sk-acme")]),
            headers(&[("x-api-key", "sk-acme")]),
            HeaderMap::new(),
        ] {
            let c = g.authenticate(&presented).unwrap();
            assert!(c.key.is_none() && c.tenant.is_none() && c.tier.is_none());
            assert_eq!(c.level, g.default_level);
        }
    }

    #[test]
    fn key_maps_to_tenant_tier_and_priority() {
        let c = acme(&gateway(true));
        assert_eq!(c.tenant.as_deref(), Some("acme"));
        assert_eq!(c.tier.as_deref(), Some("paid"));
        assert_eq!(c.level, 0);
    }

    #[test]
    fn auth_on_rejects_missing_and_unknown_keys() {
        let g = gateway(true);
        assert_eq!(
            g.authenticate(&HeaderMap::new()).unwrap_err(),
            AuthError::MissingKey
        );
        assert_eq!(
            g.authenticate(&headers(&[("x-api-key", "sk-guess")]))
                .unwrap_err(),
            AuthError::InvalidKey
        );
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
}

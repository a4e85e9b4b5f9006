//! One configured API key with its live rate-limit buckets, and how the
//! buckets survive a reload.
//!
//! A reload keeps a key's state (and so what its buckets hold) when the
//! same digest comes back with the same tenant, tier and limits; any change
//! starts full buckets. Keys are known only by digest; the state's `id` (a
//! digest prefix) names the key's shared buckets, never the key itself.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use super::rate_limit::TokenBucket;
use crate::config::KeyConfig;

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

impl KeyState {
    /// The state of `k`: `kept` (the previous config's state of the same
    /// digest) when nothing about the key changed, else fresh buckets.
    pub fn build(
        k: &KeyConfig,
        kept: Option<Arc<KeyState>>,
        tiers: &HashMap<String, usize>,
        default_level: usize,
        now: Instant,
    ) -> Arc<KeyState> {
        match kept {
            Some(s) if s.same_as(k, now) => s,
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
        }
    }

    /// Whether `k` configures this state unchanged (tenant, tier, limits).
    fn same_as(&self, k: &KeyConfig, now: Instant) -> bool {
        *self.tenant == *k.tenant
            && self.tier.as_ref() == k.tier
            && self.requests.as_ref().map(|b| b.peek(now).limit)
                == k.requests_per_minute.map(u64::from)
            && self.tokens.as_ref().map(|b| b.peek(now).limit) == k.tokens_per_minute.map(u64::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tokens_per_minute: u32) -> KeyConfig {
        toml::from_str(&format!(
            "sha256 = \"{}\"\ntenant = \"acme\"\ntier = \"paid\"\nrequests_per_minute = 2\ntokens_per_minute = {tokens_per_minute}",
            "a".repeat(64)
        ))
        .unwrap()
    }

    #[test]
    fn an_unchanged_key_keeps_its_buckets_a_changed_one_starts_full() {
        let now = Instant::now();
        let tiers = HashMap::from([("paid".to_string(), 0)]);
        let first = KeyState::build(&key(100), None, &tiers, 1, now);
        first.tokens.as_ref().unwrap().try_take(60, now).unwrap();
        let kept = KeyState::build(&key(100), Some(Arc::clone(&first)), &tiers, 1, now);
        assert!(Arc::ptr_eq(&first, &kept));
        let changed = KeyState::build(&key(200), Some(first), &tiers, 1, now);
        assert_eq!(changed.tokens.as_ref().unwrap().peek(now).remaining, 200);
        assert_eq!((changed.level, changed.id.len()), (0, 16));
    }
}

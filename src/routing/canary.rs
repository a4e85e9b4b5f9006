//! Canary version splits: a pool's replicas carry a `version`, the pool
//! weighs the versions (`{ v1 = 95, v2 = 5 }`), and each request gets one.
//!
//! The choice is sticky: the first sticky key present (the body's `user`,
//! the session header, or the API key, in the configured order) is hashed
//! with SHA-256 and the hash, salted by the pool's name, falls into one
//! version's share of the total weight. The same user therefore stays on the
//! same version for as long as the weights stay, and keeps its prefix cache.
//! Shares are laid out in version-name order over the total weight, so
//! shifting weight between versions while keeping the sum (95/5 → 80/20)
//! moves only the users between the old and the new boundary. Requests with no sticky key are split at
//! random by weight. The version header forces a version (unknown: 400).
//!
//! Cost: one SHA-256 of the key per request. API keys are hashed, never kept.

use std::sync::Arc;

use http::HeaderName;

use super::prefix::rendezvous::{hash64, mix};
use crate::config::{CanaryConfig, StickySource};

#[derive(Debug)]
pub struct Canary {
    /// Versions in name order with their weights.
    versions: Vec<(Arc<str>, u32)>,
    total: u64,
    sticky: Vec<StickySource>,
    pub header: HeaderName,
    /// Whether `header` is honoured (`[gateway] trust_version_header`).
    pub trusted: bool,
    salt: u64,
}

/// The request's candidate sticky keys.
#[derive(Debug, Clone, Copy, Default)]
pub struct StickyKeys<'a> {
    pub user: Option<&'a str>,
    pub session: Option<&'a str>,
    pub api_key: Option<&'a str>,
}

/// How the version was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    Forced(Arc<str>),
    Sticky(Arc<str>, StickySource),
    Random(Arc<str>),
}

impl Choice {
    pub fn version(&self) -> &Arc<str> {
        match self {
            Choice::Forced(v) | Choice::Sticky(v, _) | Choice::Random(v) => v,
        }
    }
}

impl Canary {
    pub fn new(config: &CanaryConfig, pool: &str) -> Canary {
        let versions: Vec<(Arc<str>, u32)> = config
            .weights
            .iter()
            .map(|(v, w)| (Arc::from(v.as_str()), *w))
            .collect();
        Canary {
            total: versions.iter().map(|(_, w)| u64::from(*w)).sum(),
            versions,
            sticky: config.sticky.clone(),
            header: HeaderName::from_bytes(config.header.as_bytes())
                .expect("header name checked by config validation"),
            trusted: true,
            salt: hash64(pool.as_bytes()),
        }
    }

    /// The version for a request. `random` is used only when no sticky key
    /// is present. Err names a forced version that does not exist.
    pub fn choose(
        &self,
        forced: Option<&str>,
        keys: &StickyKeys<'_>,
        random: u64,
    ) -> Result<Choice, String> {
        if let Some(f) = forced {
            return self
                .versions
                .iter()
                .find(|(v, _)| &**v == f)
                .map(|(v, _)| Choice::Forced(Arc::clone(v)))
                .ok_or_else(|| {
                    let known: Vec<&str> = self.versions.iter().map(|(v, _)| &**v).collect();
                    format!("unknown version {f:?}; this pool runs {}", known.join(", "))
                });
        }
        for source in &self.sticky {
            let key = match source {
                StickySource::User => keys.user,
                StickySource::Session => keys.session,
                StickySource::ApiKey => keys.api_key,
            };
            if let Some(k) = key.filter(|k| !k.is_empty()) {
                let v = self.by_point(mix(hash64(k.as_bytes()) ^ self.salt));
                return Ok(Choice::Sticky(v, *source));
            }
        }
        Ok(Choice::Random(self.by_point(random)))
    }

    /// The version whose share of the weight `point` falls in.
    fn by_point(&self, point: u64) -> Arc<str> {
        let mut p = point % self.total.max(1);
        for (v, w) in &self.versions {
            let w = u64::from(*w);
            if p < w {
                return Arc::clone(v);
            }
            p -= w;
        }
        Arc::clone(&self.versions.last().expect("validated: versions").0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canary(v1: u32, v2: u32) -> Canary {
        let config: CanaryConfig =
            toml::from_str(&format!("weights = {{ v1 = {v1}, v2 = {v2} }}")).unwrap();
        Canary::new(&config, "llama")
    }

    fn user(u: &str) -> StickyKeys<'_> {
        StickyKeys {
            user: Some(u),
            ..StickyKeys::default()
        }
    }

    /// 10,000 users at 95/5: the canary's count is Binomial(10,000, 0.05),
    /// mean 500, standard deviation 21.8; accept ±4 standard deviations.
    #[test]
    fn split_within_tolerance_over_users() {
        let c = canary(95, 5);
        let n = 10_000;
        let canaries = (0..n)
            .filter(|i| {
                let u = format!("user-{i}");
                &**c.choose(None, &user(&u), 0).unwrap().version() == "v2"
            })
            .count();
        assert!((413..=587).contains(&canaries), "{canaries}");
    }

    #[test]
    fn sticky_per_user_and_source_order() {
        let c = canary(50, 50);
        for i in 0..200 {
            let u = format!("u{i}");
            let first = c.choose(None, &user(&u), 1).unwrap();
            for r in 0..20 {
                assert_eq!(c.choose(None, &user(&u), r).unwrap(), first);
            }
        }
        // The body's user wins over the session and the key by default.
        let keys = StickyKeys {
            user: Some("alice"),
            session: Some("s-1"),
            api_key: Some("sk-1"),
        };
        assert!(matches!(
            c.choose(None, &keys, 0).unwrap(),
            Choice::Sticky(_, StickySource::User)
        ));
        let keys = StickyKeys { user: None, ..keys };
        assert!(matches!(
            c.choose(None, &keys, 0).unwrap(),
            Choice::Sticky(_, StickySource::Session)
        ));
    }

    #[test]
    fn header_forces_and_unknown_is_refused() {
        let c = canary(100, 0);
        assert_eq!(
            c.choose(Some("v2"), &user("anyone"), 0).unwrap(),
            Choice::Forced(Arc::from("v2"))
        );
        assert!(
            c.choose(Some("v9"), &user("x"), 0)
                .unwrap_err()
                .contains("v9")
        );
        // Weight 0: never chosen unless forced.
        for i in 0..500 {
            assert_eq!(
                &**c.choose(None, &user(&i.to_string()), i).unwrap().version(),
                "v1"
            );
        }
    }

    #[test]
    fn raising_the_canary_weight_only_moves_users_into_it() {
        let (before, after) = (canary(95, 5), canary(80, 20));
        for i in 0..2_000 {
            let u = format!("user-{i}");
            let b = before.choose(None, &user(&u), 0).unwrap();
            let a = after.choose(None, &user(&u), 0).unwrap();
            if &**b.version() == "v2" {
                assert_eq!(&**a.version(), "v2", "{u} left the canary");
            }
        }
    }
}

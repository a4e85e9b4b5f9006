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
//! As a routing step ([`PoolCanary::narrow`]), the chosen version's
//! replicas become a hard limit of the [`Decision`]: retries stay on that
//! version. When none of them is eligible the request falls back to any
//! replica (branch `canary_fallback`), unless the version was forced.
//!
//! Cost: one SHA-256 of the key per request, plus O(replicas) to keep the
//! version's replicas. API keys are hashed, never kept.

use std::collections::HashMap;
use std::sync::Arc;

use http::HeaderName;

use super::decision::{Decision, contains};
use super::prefix::rendezvous::{hash64, mix};
use super::{RouteBranch, RouteError};
use crate::config::{CanaryConfig, Config, PoolConfig, StickySource};
use crate::replica::{Replica, ReplicaId};

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
    ) -> Result<Choice, RouteError> {
        if let Some(f) = forced {
            return self
                .versions
                .iter()
                .find(|(v, _)| &**v == f)
                .map(|(v, _)| Choice::Forced(Arc::clone(v)))
                .ok_or_else(|| RouteError::UnknownVersion {
                    version: f.to_string(),
                    known: self.versions.iter().map(|(v, _)| v.to_string()).collect(),
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

/// A pool's canary split, with the version each replica runs.
#[derive(Debug)]
pub struct PoolCanary {
    pub canary: Canary,
    versions: HashMap<ReplicaId, Arc<str>>,
}

impl PoolCanary {
    /// The pool's split, when it has `[pools.canary]`.
    pub fn build(
        config: &Config,
        pc: &PoolConfig,
        replicas: &[Arc<Replica>],
    ) -> Option<PoolCanary> {
        let c = pc.canary.as_ref()?;
        let mut canary = Canary::new(c, &pc.name);
        canary.trusted = config.trusts_version_header();
        let versions = replicas
            .iter()
            .zip(&pc.replicas)
            .filter_map(|(r, rc)| rc.version.as_deref().map(|v| (r.id, Arc::from(v))))
            .collect();
        Some(PoolCanary { canary, versions })
    }

    /// Step 1 of routing: chooses the request's version and keeps only its
    /// replicas in `cands` and in the decision's allowed set. `header` is
    /// the version header's value, if sent. Err: a forced version that does
    /// not exist.
    pub fn narrow(
        &self,
        header: Option<&str>,
        keys: &StickyKeys<'_>,
        random: u64,
        replicas: &[Arc<Replica>],
        cands: &mut Vec<Arc<Replica>>,
        d: &mut Decision,
    ) -> Result<(), RouteError> {
        let forced = header.filter(|v| !v.is_empty() && self.canary.trusted);
        let choice = self.canary.choose(forced, keys, random)?;
        let version = Arc::clone(choice.version());
        let mut ids: Vec<ReplicaId> = replicas
            .iter()
            .filter(|r| self.versions.get(&r.id) == Some(&version))
            .map(|r| r.id)
            .collect();
        ids.sort_unstable();
        let forced = matches!(choice, Choice::Forced(_));
        if forced || cands.iter().any(|r| contains(&ids, r.id)) {
            cands.retain(|r| contains(&ids, r.id));
            d.allow_only(ids);
            d.version = Some(version);
            d.branches.push(match choice {
                Choice::Forced(_) => RouteBranch::VersionForced,
                Choice::Sticky(..) => RouteBranch::Canary,
                Choice::Random(_) => RouteBranch::CanaryRandom,
            });
        } else {
            d.branches.push(RouteBranch::CanaryFallback);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::test_fleet::{input, replicas, route, topology};
    use crate::routing::Prompt;
    use http::HeaderMap;

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
        assert_eq!(
            c.choose(Some("v9"), &user("x"), 0).unwrap_err().to_string(),
            "unknown version \"v9\"; this pool runs v1, v2"
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

    #[test]
    fn canary_falls_back_when_the_version_is_down_but_forced_does_not() {
        let text = format!(
            "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n[pools.canary]\nweights = {{ v1 = 0, v2 = 100 }}\n{}",
            replicas(2, |i| format!("version = \"v{}\"", i + 1))
        );
        let t = topology(&text);
        let pool = &t.pools()[0];
        let headers = HeaderMap::new();
        let plain = input(&headers, Some("u"), Prompt::Text("x"));
        let d = route(pool, &plain);
        assert_eq!(d.branches, vec![RouteBranch::Canary]);
        assert_eq!(d.allowed, Some(vec![pool.replicas[1].id]));
        for _ in 0..3 {
            pool.replicas[1].health.record(false, 3, 2);
        }
        let d = route(pool, &plain);
        assert_eq!(d.branches, vec![RouteBranch::CanaryFallback]);
        assert_eq!(d.allowed, None);
        let mut forced = HeaderMap::new();
        forced.insert("x-llmlb-version", "v2".parse().unwrap());
        let d = route(pool, &input(&forced, Some("u"), Prompt::Text("x")));
        assert_eq!(d.branches, vec![RouteBranch::VersionForced]);
        assert!(d.narrow(pool.eligible()).is_empty());
    }
}

//! Priority routing: a tier (from the API key, or the tier header) maps to a
//! pool or to a subset of replicas.
//!
//! - `pool = "..."`: the tier's requests go to that pool. With `overflow`,
//!   when every eligible replica there is saturated (or none is eligible),
//!   they go to the model's own pool instead (branch `tier_overflow`).
//! - `replicas = [...]`: in each pool, the tier's requests go only to the
//!   replicas it reserved there. With `overflow`, when all of those are
//!   saturated (or down), the replicas of *lower* tiers (by priority level)
//!   and unreserved ones join, the unsaturated among them preferred. A
//!   higher tier's replicas never take a lower tier's overflow.
//!
//! A request whose tier reserved nothing in the pool (or that has no tier)
//! goes to the pool's unreserved replicas, or to all of them when every
//! replica is reserved.
//!
//! Cost: O(replicas) per request; the maps are built once per config.

use std::collections::HashMap;
use std::sync::Arc;

use super::RouteBranch;
use super::decision::{Decision, contains};
use crate::config::Config;
use crate::replica::{Replica, ReplicaId};

/// One tier's reservation in a pool.
#[derive(Debug)]
struct Reservation {
    tier: Arc<str>,
    level: usize,
    overflow: bool,
    replicas: Vec<ReplicaId>,
}

/// The tiers' reservations within one pool.
#[derive(Debug, Default)]
pub struct PoolTiers {
    reservations: Vec<Reservation>,
    /// Reserved replica → priority level of the tier that reserved it.
    claimed: HashMap<ReplicaId, usize>,
    all: Vec<ReplicaId>,
}

/// Priority level index of each tier (0 = highest).
pub fn tier_levels(config: &Config) -> HashMap<&str, usize> {
    config
        .tiers
        .iter()
        .map(|t| {
            let level = config
                .priorities
                .iter()
                .position(|p| p.name == t.priority)
                .unwrap_or(usize::MAX);
            (t.name.as_str(), level)
        })
        .collect()
}

impl PoolTiers {
    pub fn build(config: &Config, replicas: &[Arc<Replica>]) -> PoolTiers {
        let levels = tier_levels(config);
        let mut out = PoolTiers {
            all: replicas.iter().map(|r| r.id).collect(),
            ..PoolTiers::default()
        };
        for t in &config.tiers {
            let ids: Vec<ReplicaId> = replicas
                .iter()
                .filter(|r| t.replicas.contains(&r.name))
                .map(|r| r.id)
                .collect();
            if ids.is_empty() {
                continue;
            }
            let level = levels[t.name.as_str()];
            for id in &ids {
                out.claimed.insert(*id, level);
            }
            out.reservations.push(Reservation {
                tier: Arc::from(t.name.as_str()),
                level,
                overflow: t.overflow,
                replicas: ids,
            });
        }
        out
    }

    /// Whether no tier reserves a replica of this pool: then no request is
    /// narrowed.
    pub fn is_empty(&self) -> bool {
        self.reservations.is_empty()
    }

    /// The replicas a request of `tier` may use, given the eligible
    /// `candidates` and a saturation test. `None`: no restriction.
    pub fn select(
        &self,
        tier: Option<&str>,
        candidates: &[Arc<Replica>],
        saturated: impl Fn(&Replica) -> bool,
    ) -> (Option<Vec<ReplicaId>>, Option<RouteBranch>) {
        if self.reservations.is_empty() {
            return (None, None);
        }
        let Some(own) = tier.and_then(|t| self.reservations.iter().find(|r| &*r.tier == t)) else {
            let unreserved: Vec<ReplicaId> = self
                .all
                .iter()
                .filter(|id| !self.claimed.contains_key(id))
                .copied()
                .collect();
            return if unreserved.is_empty() {
                (None, None)
            } else {
                (Some(unreserved), None)
            };
        };
        let own_ok = candidates
            .iter()
            .any(|r| own.replicas.contains(&r.id) && !saturated(r));
        if own_ok || !own.overflow {
            return (Some(own.replicas.clone()), Some(RouteBranch::Tier));
        }
        let lower: Vec<&Arc<Replica>> = candidates
            .iter()
            .filter(|r| {
                own.replicas.contains(&r.id)
                    || self.claimed.get(&r.id).is_none_or(|l| *l > own.level)
            })
            .collect();
        let free: Vec<ReplicaId> = lower
            .iter()
            .filter(|r| !saturated(r))
            .map(|r| r.id)
            .collect();
        let set = if free.is_empty() {
            lower.iter().map(|r| r.id).collect()
        } else {
            free
        };
        (Some(set), Some(RouteBranch::TierOverflow))
    }

    /// Step 2 of routing: keeps only the replicas the request's tier may
    /// use in `cands` and in the decision's allowed set.
    pub fn narrow(
        &self,
        tier: Option<&str>,
        cands: &mut Vec<Arc<Replica>>,
        saturated: impl Fn(&Replica) -> bool,
        d: &mut Decision,
    ) {
        let (ids, branch) = self.select(tier, cands, saturated);
        if let Some(mut ids) = ids {
            ids.sort_unstable();
            cands.retain(|r| contains(&ids, r.id));
            d.allow_only(ids);
        }
        d.branches.extend(branch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::test_fleet::{replicas, topology};

    fn setup(overflow: bool) -> (PoolTiers, Vec<Arc<Replica>>) {
        let text = format!(
            "[[tiers]]\nname = \"paid\"\npriority = \"high\"\nreplicas = [\"a\", \"b\"]\noverflow = {overflow}\n\
             [[tiers]]\nname = \"free\"\npriority = \"low\"\nreplicas = [\"c\"]\n\
             [[pools]]\nname = \"p\"\nmodels = [\"m\"]\n\
             [[pools.replicas]]\nurl = \"http://127.0.0.1:1\"\nname = \"a\"\n\
             [[pools.replicas]]\nurl = \"http://127.0.0.1:2\"\nname = \"b\"\n\
             [[pools.replicas]]\nurl = \"http://127.0.0.1:3\"\nname = \"c\"\n\
             [[pools.replicas]]\nurl = \"http://127.0.0.1:4\"\nname = \"d\"\n"
        );
        let config = crate::config::parse(&text).unwrap();
        let replicas: Vec<Arc<Replica>> = ["a", "b", "c", "d"]
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let g = prometheus::IntGauge::new("g", "g").unwrap();
                Arc::new(Replica::new(
                    n.to_string(),
                    format!("127.0.0.1:{}", i + 1).parse().unwrap(),
                    1,
                    g,
                ))
            })
            .collect();
        (PoolTiers::build(&config, &replicas), replicas)
    }

    fn names(ids: &[ReplicaId], replicas: &[Arc<Replica>]) -> Vec<String> {
        replicas
            .iter()
            .filter(|r| ids.contains(&r.id))
            .map(|r| r.name.clone())
            .collect()
    }

    #[test]
    fn tiers_land_on_their_replicas() {
        let (t, rs) = setup(true);
        let (paid, b) = t.select(Some("paid"), &rs, |_| false);
        assert_eq!(names(&paid.unwrap(), &rs), ["a", "b"]);
        assert_eq!(b, Some(RouteBranch::Tier));
        let (free, _) = t.select(Some("free"), &rs, |_| false);
        assert_eq!(names(&free.unwrap(), &rs), ["c"]);
        let (none, b) = t.select(None, &rs, |_| false);
        assert_eq!(names(&none.unwrap(), &rs), ["d"]);
        assert_eq!(b, None);
    }

    #[test]
    fn overflow_only_when_configured_and_saturated() {
        let (t, rs) = setup(true);
        // One own replica still has room: no overflow.
        let (s, b) = t.select(Some("paid"), &rs, |r| r.name == "a");
        assert_eq!(
            (names(&s.unwrap(), &rs), b),
            (vec!["a".into(), "b".into()], Some(RouteBranch::Tier))
        );
        // Both saturated: lower tiers' and unreserved replicas join, free ones preferred.
        let (s, b) = t.select(Some("paid"), &rs, |r| r.name == "a" || r.name == "b");
        assert_eq!(names(&s.unwrap(), &rs), ["c", "d"]);
        assert_eq!(b, Some(RouteBranch::TierOverflow));
        // Everything saturated: own and lower together.
        let (s, _) = t.select(Some("paid"), &rs, |_| true);
        assert_eq!(names(&s.unwrap(), &rs), ["a", "b", "c", "d"]);
        // A lower tier never overflows upwards.
        let (s, b) = t.select(Some("free"), &rs, |_| true);
        assert_eq!(
            (names(&s.unwrap(), &rs), b),
            (vec!["c".into()], Some(RouteBranch::Tier))
        );
        // Without overflow configured, saturation keeps paid on its own.
        let (t, rs) = setup(false);
        let (s, b) = t.select(Some("paid"), &rs, |_| true);
        assert_eq!(
            (names(&s.unwrap(), &rs), b),
            (vec!["a".into(), "b".into()], Some(RouteBranch::Tier))
        );
    }

    #[test]
    fn tier_pool_overflows_to_the_model_pool_only_when_saturated() {
        let text = format!(
            "[[tiers]]\nname = \"paid\"\npriority = \"high\"\npool = \"reserved\"\noverflow = true\n\
             [[tiers]]\nname = \"free\"\npriority = \"low\"\n\
             [[pools]]\nname = \"shared\"\nmodels = [\"m\"]\n{}\
             [[pools]]\nname = \"reserved\"\nmodels = [\"m-reserved\"]\n[pools.saturation]\nmax_in_flight = 1\n\
             [[pools.replicas]]\nurl = \"http://127.0.0.1:9\"\nname = \"gold\"\n",
            replicas(1, |_| String::new())
        );
        let t = topology(&text);
        let r = t.resolve("m", Some("paid")).unwrap();
        assert_eq!(
            (r.pool.name.as_str(), r.branches.clone()),
            ("reserved", vec![RouteBranch::Tier])
        );
        assert_eq!(t.resolve("m", Some("free")).unwrap().pool.name, "shared");
        assert!(t.resolve("unknown", Some("paid")).is_none());
        let _busy = t.pools()[1].replicas[0].acquire();
        let r = t.resolve("m", Some("paid")).unwrap();
        assert_eq!(
            (r.pool.name.as_str(), r.branches),
            ("shared", vec![RouteBranch::TierOverflow])
        );
    }
}

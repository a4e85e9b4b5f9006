//! Affinity by rendezvous order: a key (the session header's value, or
//! `hash` mode's prompt key from [`super::hash_key`]) names a preferred
//! replica, the first unsaturated one in the key's rendezvous order
//! ([`super::prefix::rendezvous`]).
//!
//! In `hash` mode with `[pools.prefix] homes`, the key's home (chosen by
//! rendezvous order within a bound on each replica's share of the demand)
//! goes first, and the rendezvous order follows it.
//!
//! A key whose first choice is saturated moves on to the next one in its
//! order (branch `session_overflow` or `prefix_overflow`); when every
//! candidate is saturated nothing is preferred (branch `saturated`) and the
//! balancer picks among all. The preference is soft: retries fall back to
//! the decision's allowed set.
//!
//! Cost: one 64-bit mix per candidate, no allocation beyond the candidates'
//! nodes. The nodes (name hash and weight) are built once per config.

use std::collections::HashMap;
use std::sync::Arc;

use super::RouteBranch;
use super::decision::Decision;
use super::prefix::rendezvous::{self, Node, hash64};
use crate::replica::{Replica, ReplicaId};

/// What the key stands for, which names the branch taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// The session header (`[pools.session] affinity`).
    Session,
    /// The prompt's `hash`-mode key.
    Prefix,
}

/// Each replica of a pool as rendezvous hashing sees it.
#[derive(Debug, Default)]
pub struct Affinity {
    nodes: HashMap<ReplicaId, Node>,
}

impl Affinity {
    pub fn build(replicas: &[Arc<Replica>]) -> Affinity {
        let nodes = replicas
            .iter()
            .map(|r| {
                let node = Node {
                    name_hash: hash64(r.name.as_bytes()),
                    weight: r.weight,
                };
                (r.id, node)
            })
            .collect();
        Affinity { nodes }
    }

    /// The rendezvous nodes of `cands`, in their order.
    pub fn nodes(&self, cands: &[Arc<Replica>]) -> Vec<Node> {
        cands.iter().map(|r| self.nodes[&r.id]).collect()
    }

    /// Prefers the key's first unsaturated candidate in rendezvous order.
    pub fn prefer(
        &self,
        d: &mut Decision,
        cands: &[Arc<Replica>],
        key: u64,
        saturated: &dyn Fn(&Replica) -> bool,
        kind: Key,
    ) {
        self.prefer_home(d, cands, key, None, saturated, kind);
    }

    /// As [`Self::prefer`], with `home` (an index into `cands`: the key's
    /// home, [`super::prefix::home`]) in front of the rendezvous order.
    pub fn prefer_home(
        &self,
        d: &mut Decision,
        cands: &[Arc<Replica>],
        key: u64,
        home: Option<usize>,
        saturated: &dyn Fn(&Replica) -> bool,
        kind: Key,
    ) {
        if let Some(h) = home.filter(|&h| !saturated(&cands[h])) {
            d.preferred = Some(vec![cands[h].id]);
            d.branches.push(match kind {
                Key::Session => RouteBranch::Session,
                Key::Prefix => RouteBranch::PrefixHit,
            });
            return;
        }
        let nodes = self.nodes(cands);
        match rendezvous::first_acceptable(key, &nodes, |i| !saturated(&cands[i])) {
            Some((i, rank)) => {
                // Past a saturated home, nothing is a first choice.
                let rank = rank + usize::from(home.is_some());
                d.preferred = Some(vec![cands[i].id]);
                d.branches.push(match (kind, rank) {
                    (Key::Session, 0) => RouteBranch::Session,
                    (Key::Session, _) => RouteBranch::SessionOverflow,
                    (Key::Prefix, 0) => RouteBranch::PrefixHit,
                    (Key::Prefix, _) => RouteBranch::PrefixOverflow,
                });
            }
            None => d.branches.push(RouteBranch::Saturated),
        }
    }
}

/// The session key of a session header value (`None` when empty).
pub fn session_key(value: Option<&str>) -> Option<u64> {
    value
        .filter(|s| !s.is_empty())
        .map(|s| hash64(s.as_bytes()))
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;

    use crate::pool::test_fleet::{input, pool_of, route};
    use crate::routing::{Prompt, RouteBranch};

    #[test]
    fn session_sticks_and_overflows_when_its_replica_is_saturated() {
        let t = pool_of(
            "[pools.session]\naffinity = true\n\
             [pools.saturation]\nmax_in_flight = 1\n[pools.prefix]\nmode = \"hash\"",
            4,
        );
        let pool = &t.pools()[0];
        let mut headers = HeaderMap::new();
        headers.insert("x-session-id", "conversation-9".parse().unwrap());
        let session = input(&headers, None, Prompt::Text("hi"));
        let d = route(pool, &session);
        assert_eq!(d.branches, vec![RouteBranch::Session]);
        let home = d.preferred.clone().unwrap()[0];
        assert_eq!(route(pool, &session).preferred, Some(vec![home]));
        let busy = pool
            .replicas
            .iter()
            .find(|r| r.id == home)
            .unwrap()
            .acquire();
        let d = route(pool, &session);
        assert_eq!(d.branches, vec![RouteBranch::SessionOverflow]);
        assert_ne!(d.preferred, Some(vec![home]));
        drop(busy);
        // No session header: prefix affinity (hash of the first tokens) applies.
        let plain = HeaderMap::new();
        let d = route(pool, &input(&plain, None, Prompt::Text("hi")));
        assert_eq!(d.branches, vec![RouteBranch::PrefixHit]);
    }
}

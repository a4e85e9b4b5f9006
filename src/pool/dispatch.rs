//! The last step of a routing decision, shared by `serve`'s forwarder and
//! `llmlb fleet-sim`: among the pool's replicas eligible at `now_ms` and not
//! yet tried, keep what the routing [`Decision`] allows (and prefers), offer
//! the balancer only those with a free slot under their `max_inflight`, and
//! let it pick from views of their load read at one instant.
//!
//! `max_inflight` is a hard limit: when every replica the request may use
//! is full, the answer is [`Choice::Wait`] with those replicas, never one of
//! them overfilled. The forwarder waits for a slot to free; `llmlb fleet-sim`
//! parks the request until one does, on its virtual clock.
//!
//! Pure apart from the balancer's own state (round-robin cursors, p2c RNG);
//! no I/O. Cost: O(replicas) to filter and build views, plus the balancer's
//! pick. The caller takes the slot (`Replica::try_acquire_tokens`) and picks
//! again when it lost the race.

use std::sync::Arc;

use super::Pool;
use crate::balancing::{self, Branch, Pick, RequestInfo};
use crate::replica::{Replica, ReplicaId, ReplicaView};
use crate::routing::Decision;

/// What the next attempt of a request does.
#[derive(Debug)]
pub enum Choice {
    /// Send it to this replica.
    Pick(Arc<Replica>, Pick),
    /// Every replica the request may use is at its concurrency limit: wait
    /// until one of these ends a request.
    Wait(Vec<Arc<Replica>>),
    /// No replica is left; the balancer's branch says why.
    NoReplica(Branch),
}

/// Chooses the replica for the next attempt of a request.
pub fn choose(
    pool: &Pool,
    route: &Decision,
    tried: &[ReplicaId],
    info: &RequestInfo<'_>,
    now_ms: u64,
) -> Choice {
    // The eligible replicas not tried yet, by whether they have a free
    // slot, in the pool's order: one pass, no list of the eligible first.
    let mut free = Vec::with_capacity(pool.replicas.len());
    let mut full = Vec::new();
    let untried = pool
        .replicas
        .iter()
        .filter(|r| r.is_eligible_at(now_ms) && !tried.contains(&r.id));
    for r in untried {
        match r.has_free_slot() {
            true => free.push(Arc::clone(r)),
            false => full.push(Arc::clone(r)),
        }
    }
    let candidates = route.narrow(free);
    if candidates.is_empty() {
        let allowed = route.narrow(full);
        if !allowed.is_empty() {
            return Choice::Wait(allowed);
        }
    }
    match pick_from(pool, info, &candidates, now_ms) {
        Ok((replica, pick)) => Choice::Pick(replica, pick),
        Err(branch) => Choice::NoReplica(branch),
    }
}

/// The pool's balancer's pick among `candidates`, their load read at
/// `now_ms` (only when there are two or more to weigh).
fn pick_from(
    pool: &Pool,
    info: &RequestInfo<'_>,
    candidates: &[Arc<Replica>],
    now_ms: u64,
) -> Result<(Arc<Replica>, Pick), Branch> {
    let views = || -> Vec<ReplicaView> {
        candidates
            .iter()
            .map(|r| ReplicaView::at(r, now_ms))
            .collect()
    };
    let pick = balancing::pick_among(pool.balancer.as_ref(), info, candidates.len(), views)?;
    Ok((Arc::clone(&candidates[pick.index]), pick))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::test_fleet::pool_of;

    fn names(replicas: &[Arc<Replica>]) -> Vec<&str> {
        replicas.iter().map(|r| r.name.as_str()).collect()
    }

    /// The balancer sees the eligible replicas not tried yet that have a
    /// free slot; when none has one, the request waits for those that are
    /// full, in the pool's order.
    #[test]
    fn picks_among_untried_free_replicas_else_waits_for_the_full_ones() {
        let t = pool_of("max_inflight = 1", 5);
        let pool = &t.pools()[0];
        let r = &pool.replicas;
        r[1].set_draining(true);
        let _busy = [r[2].acquire(), r[4].acquire()];
        let route = Decision::default();
        let info = RequestInfo {
            model: "m",
            prompt_tokens: 1,
            max_tokens: None,
            user: None,
        };
        match choose(pool, &route, &[r[0].id], &info, 1) {
            Choice::Pick(picked, _) => assert_eq!(picked.name, "r3"),
            other => panic!("{other:?}"),
        }
        match choose(pool, &route, &[r[0].id, r[3].id], &info, 1) {
            Choice::Wait(full) => assert_eq!(names(&full), ["r2", "r4"]),
            other => panic!("{other:?}"),
        }
        let all: Vec<ReplicaId> = r.iter().map(|r| r.id).collect();
        assert!(matches!(
            choose(pool, &route, &all, &info, 1),
            Choice::NoReplica(_)
        ));
    }

    /// Views are made only for a balancer that weighs two or more.
    #[test]
    fn a_lone_candidate_is_picked_without_its_view() {
        let t = pool_of("", 2);
        let pool = &t.pools()[0];
        let info = RequestInfo {
            model: "m",
            prompt_tokens: 1,
            max_tokens: None,
            user: None,
        };
        let b = pool.balancer.as_ref();
        let none = balancing::pick_among(b, &info, 0, || unreachable!("no view"));
        assert_eq!(none.unwrap_err(), Branch::NoHealthy);
        let one = balancing::pick_among(b, &info, 1, || unreachable!("no view")).unwrap();
        assert_eq!((one.index, one.branch), (0, Branch::Single));
        let views: Vec<ReplicaView> = pool
            .replicas
            .iter()
            .map(|r| ReplicaView::at(r, 1))
            .collect();
        let two = balancing::pick_among(b, &info, 2, || views.clone()).unwrap();
        let same = balancing::pick(b, &info, &views).unwrap();
        assert!(two.index < 2);
        assert_eq!(two.branch, same.branch);
    }
}

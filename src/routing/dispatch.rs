//! The last step of a routing decision as `llmlb simulate` takes it: among the pool's replicas eligible at `now_ms` and not
//! yet tried, keep what the routing [`Decision`] allows (and prefers), prefer
//! those with a free slot under a concurrency limit, and let the pool's
//! balancer pick from views of their load.
//!
//! `serve`'s forwarder (`forwarding/forward.rs`) makes the same choice
//! inline, with one difference this function does not model yet: there
//! `max_inflight` is a hard limit (only replicas with a free slot are
//! offered, and a request waits for a slot rather than overfilling one).
//!
//! Pure apart from the balancer's own state (round-robin cursors, p2c RNG);
//! no I/O. Cost: O(replicas) to filter and build views, plus the balancer's
//! pick. With no candidate left it returns the balancer's `NoHealthy` branch.

use std::sync::Arc;

use super::{Decision, Pool};
use crate::balancing::{self, Branch, Pick, Replica, ReplicaId, ReplicaView, RequestInfo};

/// Picks the replica for the next attempt of a request.
pub fn choose(
    pool: &Pool,
    route: &Decision,
    tried: &[ReplicaId],
    info: &RequestInfo<'_>,
    now_ms: u64,
) -> Result<(Arc<Replica>, Pick), Branch> {
    let untried: Vec<Arc<Replica>> = pool
        .eligible_at(now_ms)
        .into_iter()
        .filter(|r| !tried.contains(&r.id))
        .collect();
    let candidates = route.narrow(untried);
    // Under a concurrency limit, prefer replicas with a free slot.
    let free: Vec<Arc<Replica>> = candidates
        .iter()
        .filter(|r| r.has_free_slot())
        .cloned()
        .collect();
    let candidates = if free.is_empty() { candidates } else { free };
    let views: Vec<ReplicaView> = candidates
        .iter()
        .map(|r| ReplicaView::at(r, now_ms))
        .collect();
    let pick = balancing::pick(pool.balancer.as_ref(), info, &views)?;
    Ok((Arc::clone(&candidates[pick.index]), pick))
}

//! The daemon's side of the fleet store (`[fleet]`): what each limited
//! replica's demand is on this instance, where the caps the store grants go
//! (each replica's own atomic, read by the request path), and the other
//! instances' dispatch records folded into the pools' prefix index.

use std::sync::Arc;

use crate::fleet::{Demand, Fleet, PrefixRecord};
use crate::pool::Topology;

/// One [`Demand`] per replica with a `max_inflight`: its requests running
/// here, plus the ones waiting for it (in the forwarder) and an even part
/// of the pool queue's waiters (over the pool's eligible limited replicas).
pub fn demands(topology: &Topology) -> Vec<Demand> {
    let now = crate::telemetry::clock::now_millis();
    let mut out = Vec::new();
    for pool in &topology.pools {
        let queued: usize = pool
            .admission
            .as_ref()
            .map_or(0, |a| a.queue.depths().iter().sum());
        let eligible = pool
            .replicas
            .iter()
            .filter(|r| r.max_inflight.is_some() && r.is_eligible_at(now))
            .count();
        let spread = queued.div_ceil(eligible.max(1)) as u32;
        for r in &pool.replicas {
            let Some(limit) = r.max_inflight else {
                continue;
            };
            let in_flight = r.in_flight().min(u64::from(u32::MAX)) as u32;
            let queue_part = if r.is_eligible_at(now) { spread } else { 0 };
            out.push(Demand {
                pool: pool.name.clone(),
                replica: r.name.clone(),
                limit,
                in_flight,
                want: in_flight + r.waiting() + queue_part,
            });
        }
    }
    out
}

/// Gives each replica in `demands` its cap, and wakes the pool queues whose
/// capacity grew.
pub fn apply(topology: &Topology, fleet: &Fleet, demands: &[Demand], caps: &[u32]) {
    for pool in &topology.pools {
        let mut grew = false;
        for (d, cap) in demands
            .iter()
            .zip(caps)
            .filter(|(d, _)| d.pool == pool.name)
        {
            let Some(r) = pool.replicas.iter().find(|r| r.name == d.replica) else {
                continue;
            };
            let before = r.limit();
            r.set_fleet_cap(*cap);
            grew |= r.limit() > before;
            fleet
                .metrics()
                .slots
                .with_label_values(&[&pool.name, &r.name])
                .set(i64::from(*cap));
        }
        if grew && let Some(a) = &pool.admission {
            a.queue.poke();
        }
    }
}

/// The refresh loop for `fleet`, over the topology in force at each tick.
pub async fn run(
    fleet: Arc<Fleet>,
    topology: impl Fn() -> Arc<Topology>,
    shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let f = Arc::clone(&fleet);
    let now = std::sync::Mutex::new(None::<Arc<Topology>>);
    fleet
        .run(
            || {
                let t = topology();
                let d = demands(&t);
                *now.lock().expect("poisoned") = Some(t);
                d
            },
            |d, caps| {
                if let Some(t) = now.lock().expect("poisoned").as_ref() {
                    apply(t, &f, d, caps);
                }
            },
            shutdown,
        )
        .await;
}

/// Folds another instance's dispatch record into the pool it names.
pub fn fold(topology: &Topology, record: &PrefixRecord) {
    if let Some(pool) = topology.pools.iter().find(|p| *p.name == *record.pool) {
        pool.router.fold_remote(
            &pool.replicas,
            &record.replica,
            record.key,
            &record.blocks,
            crate::telemetry::clock::now_millis(),
        );
    }
}

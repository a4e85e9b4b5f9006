//! The daemon's side of the fleet store (`[fleet]`): what each limited
//! replica's demand is on this instance, where the caps the store grants go
//! (each replica's own atomic, read by the request path), and the other
//! instances' dispatch records folded into the pools' prefix index.

use std::sync::Arc;

use crate::admission::estimate::Arrivals;
use crate::admission::{Others, QueueState};
use crate::config::FleetConfig;
use crate::fleet::{Demand, Exchange, Fleet, PrefixRecord, QueueReport};
use crate::pool::{Pool, Topology};

/// One [`Demand`] per replica with a `max_inflight`: its requests running
/// here, plus the ones waiting for it (in the forwarder) and an even part
/// of the pool queue's waiters that no other instance's waiter goes before
/// (over the pool's eligible limited replicas); and each queued pool's
/// report for the other instances.
pub fn demands(topology: &Topology) -> (Vec<Demand>, Vec<QueueReport>) {
    let now = crate::telemetry::clock::now_millis();
    let at = std::time::Instant::now();
    let mut out = Vec::new();
    let mut queues = Vec::new();
    for pool in topology.pools() {
        let (queued, held_back) = match &pool.admission {
            Some(a) => {
                let state = a.queue.state(at);
                let unheld = a.queue.unheld_waiting(at);
                let all: usize = state.depths.iter().sum();
                queues.push(report(&pool.name, state));
                (unheld, unheld < all)
            }
            None => (0, false),
        };
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
                held_back,
            });
        }
    }
    (out, queues)
}

fn report(pool: &str, state: QueueState) -> QueueReport {
    let count = |n: usize| n.min(u32::MAX as usize) as u32;
    QueueReport {
        pool: pool.to_string(),
        active: count(state.active),
        depths: state.depths.into_iter().map(count).collect(),
        fronts: state.fronts,
        arrivals: Some(state.arrivals.rates),
    }
}

/// The other instances' reports of `pool`, summed for its queue: waiters
/// per level, each level's oldest, what they run, their admitted arrivals
/// per second; and the pool's slots for the whole fleet.
fn others(pool: &Pool, reports: &[QueueReport], config: &FleetConfig) -> Others {
    let at = std::time::Instant::now();
    let now = crate::telemetry::clock::now_millis();
    let levels = pool
        .admission
        .as_ref()
        .map_or(0, |a| a.queue.levels().len());
    let mut o = Others {
        depths: vec![0; levels],
        fronts: vec![None; levels],
        active: 0,
        capacity: crate::pool::queue_capacity_of_fleet(&pool.replicas, now),
        grace: config.refresh * 2,
        until: at + config.instance_ttl,
        arrivals: Arrivals::default(),
    };
    for r in reports.iter().filter(|r| *r.pool == *pool.name) {
        o.active += r.active as usize;
        if let Some(rates) = &r.arrivals {
            o.arrivals.add(&Arrivals {
                rates: rates.clone(),
            });
        }
        for (d, n) in o.depths.iter_mut().zip(&r.depths) {
            *d += *n as usize;
        }
        for (f, waited) in o.fronts.iter_mut().zip(&r.fronts) {
            let since = waited.and_then(|w| at.checked_sub(w));
            *f = match (*f, since) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
    }
    o
}

/// Gives each replica in `demands` its cap, hands each pool queue the
/// other instances' side of it, and wakes the pool queues whose capacity
/// grew.
pub fn apply(topology: &Topology, fleet: &Fleet, demands: &[Demand], answer: &Exchange) {
    for pool in topology.pools() {
        if let Some(a) = &pool.admission {
            let view = (answer.queues.as_deref()).map(|r| others(pool, r, fleet.config()));
            a.queue.set_others(view);
        }
    }
    set_caps(topology, fleet, demands, &answer.caps);
}

/// Gives each replica in `demands` its cap and wakes the pool queues whose
/// capacity grew.
pub fn set_caps(topology: &Topology, fleet: &Fleet, demands: &[Demand], caps: &[u32]) {
    for pool in topology.pools() {
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
                    set_caps(t, &f, d, caps);
                }
            },
            |d, answer| {
                if let Some(t) = now.lock().expect("poisoned").as_ref() {
                    apply(t, &f, d, answer);
                }
            },
            shutdown,
        )
        .await;
}

/// Folds another instance's dispatch record into the pool it names.
pub fn fold(topology: &Topology, record: &PrefixRecord) {
    if let Some(pool) = topology.pools().iter().find(|p| *p.name == *record.pool) {
        pool.router.fold_remote(
            &pool.replicas,
            &record.replica,
            record.key,
            &record.blocks,
            crate::telemetry::clock::now_millis(),
        );
    }
}

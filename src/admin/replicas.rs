//! `GET /admin/replicas`: every replica's weight, load (local and scraped),
//! prefix-cache hit rate and health, as JSON, for operators and tests.

use serde_json::{Value, json};

use crate::pool::{Pool, Topology};
use crate::replica::Replica;
use crate::telemetry::clock::now_millis;

pub fn render(topology: &Topology) -> Value {
    let now = now_millis();
    let pools: Vec<Value> = topology.pools().iter().map(|p| pool(p, now)).collect();
    json!({ "pools": pools })
}

/// `POST /admin/replicas/{name}/drain` and `/undrain`: sets every replica
/// whose name (or `host:port`) is `name`; the JSON answer lists them, or
/// `None` when no replica matched.
pub fn set_draining(topology: &Topology, name: &str, on: bool) -> Option<Value> {
    let mut matched = Vec::new();
    for p in topology.pools() {
        for r in &p.replicas {
            if r.name == name || r.authority.as_str() == name {
                r.set_draining(on);
                matched.push(json!({
                    "pool": p.name,
                    "name": r.name,
                    "draining": on,
                    "in_flight": r.in_flight(),
                }));
            }
        }
    }
    (!matched.is_empty()).then(|| json!({ "replicas": matched }))
}

fn pool(p: &Pool, now: u64) -> Value {
    let staleness = p.scrape.as_ref().map(|s| s.staleness.as_millis() as u64);
    json!({
        "name": p.name,
        "balancer": p.balancer.name(),
        "replicas": p.replicas.iter().map(|r| replica(r, now, staleness)).collect::<Vec<_>>(),
    })
}

fn replica(r: &Replica, now: u64, staleness_ms: Option<u64>) -> Value {
    let load = r.scraped_load(now).map(|l| {
        json!({
            "running": l.running,
            "waiting": l.waiting,
            "kv_usage": l.kv_usage,
            "kv_capacity_tokens": l.kv_capacity_tokens,
            "age_ms": l.age_ms,
            "stale": staleness_ms.is_some_and(|s| l.age_ms > s),
            "dispatched_since_scrape": l.dispatched_since,
            "completed_since_scrape": l.completed_since,
            "first_bytes_since_scrape": l.first_bytes_since,
            "prefilling_at_scrape": l.prefilling_at_scrape,
        })
    });
    let ejected = r.outlier.is_ejected_at(now);
    let snapshot = r.load_snapshot();
    let cache = snapshot.as_deref();
    json!({
        "name": r.name,
        "address": r.authority.to_string(),
        "weight": r.weight,
        "eligible": r.is_eligible_at(now),
        "draining": r.is_draining(),
        "in_flight": r.in_flight(),
        // `max_inflight`, and this instance's share of it under a fleet store.
        "max_inflight": r.max_inflight,
        "limit": r.limit(),
        // Requests sent here not yet at their first byte, and the bound on
        // them (`max_prefilling`, this instance's part under a fleet store).
        "prefilling": r.prefilling(),
        "prefill_limit": r.prefill_limit(),
        "outstanding_tokens": r.outstanding_tokens(),
        "health": {
            "active": if r.health.checks() == 0 { "unchecked" } else if r.health.is_up() { "up" } else { "down" },
            "ejected": ejected,
            "ejection_remaining_ms": r.outlier.remaining_ms(now),
            "ejections": r.outlier.ejection_count(),
            "consecutive_failures": r.outlier.consecutive_failures(),
        },
        "load": load,
        // Prompt tokens since the replica started, from its own counters
        // (null when it does not export them).
        "prefix_cache": {
            "hits": cache.and_then(|c| c.prefix_cache_hits),
            "queries": cache.and_then(|c| c.prefix_cache_queries),
            "hit_rate": cache.and_then(|c| c.prefix_cache_hit_rate()),
        },
    })
}

//! The status page: `GET /` on the admin listener serves one self-contained
//! HTML page (no external assets, no build step) that polls
//! `GET /admin/status` every second and draws each pool, its replicas
//! (health, ejections, in flight, the load they report, KV usage, prefix-cache
//! hit rate), its queue depth per priority level and each level's tenants
//! (waiting, running, weight, weighted tokens served), and a table of the
//! last dispatches.
//!
//! `/admin/status` is `/admin/replicas` plus what a person watching the
//! fleet also wants: readiness, draining, each pool's queue, and the last
//! dispatch decisions (newest first; names and labels only, never keys or
//! prompt text).

use serde_json::{Value, json};

use crate::forwarding::{Dispatch, RecentDispatches};
use crate::pool::{Pool, Topology};
use crate::server::AppState;

/// The page, embedded at build time.
pub const PAGE: &str = include_str!("status.html");

/// The JSON behind the page.
pub fn render(state: &AppState) -> Value {
    let topology = state.topology();
    let mut doc = super::replicas::render(&topology);
    attach_queues(&mut doc, &topology);
    doc["ready"] = json!(state.is_ready());
    doc["draining"] = json!(state.draining.load(std::sync::atomic::Ordering::Relaxed));
    doc["version"] = json!(env!("CARGO_PKG_VERSION"));
    doc["recent_dispatches"] = recent(&state.recent_dispatches);
    doc["fleet"] = state
        .fleet
        .as_ref()
        .map_or(Value::Null, |f| json!(f.status()));
    doc
}

/// Adds the instances the fleet store lists to `doc["fleet"]` (or the
/// reason they could not be listed).
pub async fn attach_instances(state: &AppState, doc: &mut Value) {
    let Some(fleet) = &state.fleet else {
        return;
    };
    match fleet.instances().await {
        Ok(list) => doc["fleet"]["instances"] = json!(list),
        Err(e) => doc["fleet"]["instances_error"] = json!(e.to_string()),
    }
}

/// The ring of recent dispatches, newest first.
fn recent(ring: &RecentDispatches) -> Value {
    let rows: Vec<Value> = ring.newest_first().iter().map(dispatch).collect();
    Value::Array(rows)
}

fn dispatch(d: &Dispatch) -> Value {
    json!({
        "seq": d.seq,
        "at_unix_ms": d.at_unix_ms,
        "pool": &*d.pool,
        "replica": &*d.replica,
        "balancer_branch": d.balancer_branch,
        "route": d.route,
        "attempt": d.attempt,
        "outcome": d.outcome,
    })
}

/// Adds `queue` (null for pools without `max_inflight`) to each pool object
/// of `/admin/replicas`' document; pools appear there in topology order.
fn attach_queues(doc: &mut Value, topology: &Topology) {
    let Some(pools) = doc["pools"].as_array_mut() else {
        return;
    };
    for (value, pool) in pools.iter_mut().zip(topology.pools()) {
        value["models"] = json!(pool.models);
        value["queue"] = queue(pool);
    }
}

fn queue(pool: &Pool) -> Value {
    let Some(admission) = &pool.admission else {
        return Value::Null;
    };
    let q = &admission.queue;
    let levels: Vec<Value> = (q.levels().iter().zip(q.depths()).zip(q.tenants()))
        .map(|((level, depth), tenants)| {
            let tenants: Vec<Value> = (tenants.iter())
                .filter(|t| t.waiting > 0 || t.in_service > 0)
                .map(|t| {
                    json!({
                        "name": &*t.name,
                        "weight": t.weight,
                        "waiting": t.waiting,
                        "running": t.in_service,
                        "service": t.service.round(),
                    })
                })
                .collect();
            json!({"name": level.name, "depth": depth, "tenants": tenants})
        })
        .collect();
    let fairness = if q.fairness().enabled {
        "tenants"
    } else {
        "fifo"
    };
    json!({ "active": q.active(), "fairness": fairness, "levels": levels })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(toml: &str) -> std::sync::Arc<AppState> {
        AppState::new(crate::config::parse(toml).unwrap())
    }

    const TWO_POOLS: &str = r#"
[[priorities]]
name = "high"
[[priorities]]
name = "low"

[[pools]]
name = "queued"
models = ["m1"]
max_inflight = 4
[[pools.replicas]]
url = "http://127.0.0.1:1"
name = "a"
[[pools.replicas]]
url = "http://127.0.0.1:2"
name = "b"

[[pools]]
name = "open"
models = ["m2", "m3"]
[[pools.replicas]]
url = "http://127.0.0.1:3"
"#;

    #[test]
    fn status_has_replicas_queues_and_readiness() {
        let s = state(TWO_POOLS);
        let doc = render(&s);
        assert_eq!(doc["ready"], json!(true));
        assert_eq!(doc["draining"], json!(false));
        let pools = doc["pools"].as_array().unwrap();
        assert_eq!(pools.len(), 2);
        assert_eq!(pools[0]["name"], "queued");
        let names: Vec<&str> = pools[0]["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["a", "b"]);
        assert_eq!(
            pools[0]["queue"],
            json!({"active": 0, "fairness": "tenants", "levels": [
                {"name": "high", "depth": 0, "tenants": []},
                {"name": "low", "depth": 0, "tenants": []}
            ]})
        );
        assert_eq!(pools[1]["queue"], Value::Null);
        assert_eq!(pools[1]["models"], json!(["m2", "m3"]));
        assert_eq!(pools[1]["replicas"][0]["name"], "127.0.0.1:3");
        assert_eq!(doc["recent_dispatches"], json!([]));
        assert_eq!(
            pools[0]["replicas"][0]["prefix_cache"],
            json!({"hits": null, "queries": null, "hit_rate": null})
        );
    }

    #[test]
    fn recent_dispatches_newest_first_and_hit_rate() {
        let s = state(TWO_POOLS);
        let a = s.recent_dispatches.record(
            std::sync::Arc::from("queued"),
            std::sync::Arc::from("a"),
            "round_robin",
            String::new(),
            1,
        );
        s.recent_dispatches.settle(a, "200".into());
        s.recent_dispatches.record(
            std::sync::Arc::from("queued"),
            std::sync::Arc::from("b"),
            "round_robin",
            "tier".into(),
            1,
        );
        let topology = s.topology();
        let names = crate::signals::MetricNames::vllm();
        topology.pools()[0].replicas[0].store_load(crate::replica::LoadSnapshot::from_text(
            "vllm:prefix_cache_hits_total 25\nvllm:prefix_cache_queries_total 100\n",
            &names,
            crate::telemetry::clock::now_millis(),
        ));
        let doc = render(&s);
        let recent = doc["recent_dispatches"].as_array().unwrap();
        assert_eq!(recent.len(), 2);
        assert_eq!(recent[0]["replica"], "b");
        assert_eq!(recent[0]["route"], "tier");
        assert_eq!(recent[0]["outcome"], Value::Null);
        assert_eq!(recent[1]["replica"], "a");
        assert_eq!(recent[1]["outcome"], "200");
        assert_eq!(recent[1]["balancer_branch"], "round_robin");
        let cache = &doc["pools"][0]["replicas"][0]["prefix_cache"];
        assert_eq!(cache["hit_rate"], json!(0.25));
        assert_eq!(cache["queries"], json!(100.0));
    }

    #[test]
    fn draining_shows_as_not_ready() {
        let s = state(TWO_POOLS);
        s.draining.store(true, std::sync::atomic::Ordering::Relaxed);
        let doc = render(&s);
        assert_eq!(doc["ready"], json!(false));
        assert_eq!(doc["draining"], json!(true));
    }

    #[test]
    fn page_is_self_contained() {
        // No external scripts, styles, fonts or images: the page must work
        // on an admin port with no route to the internet.
        for needle in ["src=", "href=", "@import", "url(", "http://", "https://"] {
            assert!(!PAGE.contains(needle), "status page references {needle}");
        }
        assert!(PAGE.contains("/admin/status"));
    }
}

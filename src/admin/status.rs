//! The status page: `GET /` on the admin listener serves one self-contained
//! HTML page (no external assets, no build step) that polls
//! `GET /admin/status` every second and draws each pool, its replicas
//! (health, ejections, in flight, the load they report, KV usage) and its
//! queue depth per priority level.
//!
//! `/admin/status` is `/admin/replicas` plus what a person watching the
//! fleet also wants: readiness, draining, and each pool's queue.

use serde_json::{Value, json};

use crate::routing::{Pool, Topology};
use crate::server::AppState;

/// The page, embedded at build time.
pub const PAGE: &str = include_str!("status.html");

/// The JSON behind the page.
pub fn render(state: &AppState) -> Value {
    let topology = state.topology.load();
    let mut doc = super::replicas::render(&topology);
    attach_queues(&mut doc, &topology);
    doc["ready"] = json!(state.is_ready());
    doc["draining"] = json!(state.draining.load(std::sync::atomic::Ordering::Relaxed));
    doc["version"] = json!(env!("CARGO_PKG_VERSION"));
    doc
}

/// Adds `queue` (null for pools without `max_inflight`) to each pool object
/// of `/admin/replicas`' document; pools appear there in topology order.
fn attach_queues(doc: &mut Value, topology: &Topology) {
    let Some(pools) = doc["pools"].as_array_mut() else {
        return;
    };
    for (value, pool) in pools.iter_mut().zip(&topology.pools) {
        value["models"] = json!(pool.models);
        value["queue"] = queue(pool);
    }
}

fn queue(pool: &Pool) -> Value {
    let Some(admission) = &pool.admission else {
        return Value::Null;
    };
    let q = &admission.queue;
    let levels: Vec<Value> = q
        .levels()
        .iter()
        .zip(q.depths())
        .map(|(level, depth)| json!({"name": level.name, "depth": depth}))
        .collect();
    json!({ "active": q.active(), "levels": levels })
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
            json!({"active": 0, "levels": [{"name": "high", "depth": 0}, {"name": "low", "depth": 0}]})
        );
        assert_eq!(pools[1]["queue"], Value::Null);
        assert_eq!(pools[1]["models"], json!(["m2", "m3"]));
        assert_eq!(pools[1]["replicas"][0]["name"], "127.0.0.1:3");
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

//! Prefix and session affinity through a real llmlb on loopback: `hash` and
//! `cache` modes keep a prefix on one replica, independent instances agree,
//! removing a replica moves only its prefixes, a saturated replica hands its
//! prefix to the next in order, and session headers stick.

use crate::common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use common::{
    Conn, Mode, Upstream, call, chat_request, metric_value, metrics_text, sample, start_llmlb,
    support_chat,
};
use http_body_util::BodyExt;

async fn upstreams(n: usize) -> Vec<Upstream> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(Upstream::start(&format!("r{i}"), Mode::Json).await);
    }
    out
}

fn config(ups: &[Upstream], prefix: &str) -> String {
    let mut s = format!(
        "[[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\nbalancer = \"round_robin\"\n{prefix}\n"
    );
    for u in ups {
        s.push_str(&format!("[[pools.replicas]]\nurl = \"{}\"\n", u.url()));
    }
    s
}

/// Two llmlb instances with the same config in front of `ups`.
async fn instances(ups: &[Upstream], prefix: &str) -> [llmlb::daemon::Running; 2] {
    let text = config(ups, prefix);
    [start_llmlb(&text).await, start_llmlb(&text).await]
}

async fn replica_for(addr: SocketAddr, body: &str, headers: &[(&'static str, &str)]) -> String {
    let mut req = chat_request("/v1/chat/completions", body);
    for (k, v) in headers {
        req.headers_mut().insert(*k, v.parse().unwrap());
    }
    let (status, _, bytes) = call(addr, req).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&bytes));
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    v["replica"].as_str().unwrap().to_string()
}

const HASH: &str = "[pools.prefix]\nmode = \"hash\"";
const CACHE: &str = "[pools.prefix]\nmode = \"cache\"";

#[tokio::test]
async fn hash_mode_keeps_each_system_prompt_on_one_replica_and_instances_agree() {
    let ups = upstreams(4).await;
    let [one, two] = instances(&ups, HASH).await;
    let mut used = std::collections::HashSet::new();
    for p in 0..24 {
        let first = replica_for(one.addr, &support_chat(p, "Where is my parcel?"), &[]).await;
        assert_eq!(
            replica_for(one.addr, &support_chat(p, "Cancel it."), &[]).await,
            first
        );
        assert_eq!(
            replica_for(two.addr, &support_chat(p, "Refund me."), &[]).await,
            first
        );
        used.insert(first);
    }
    assert!(used.len() >= 3, "24 prompts used only {used:?}");
    let m = metrics_text(one.admin_addr).await;
    assert_eq!(
        sample(&m, r#"llmlb_routing_decisions_total{branch="prefix_hit"}"#),
        48.0
    );
    one.shutdown().await;
    two.shutdown().await;
}

#[tokio::test]
async fn cache_mode_instances_agree_when_load_is_even() {
    let ups = upstreams(4).await;
    let [one, two] = instances(&ups, CACHE).await;
    let mut used = std::collections::HashSet::new();
    for p in 0..16 {
        let a = replica_for(one.addr, &support_chat(p, "Where is my parcel?"), &[]).await;
        let b = replica_for(two.addr, &support_chat(p, "Where is my parcel?"), &[]).await;
        assert_eq!(a, b, "instances disagree on prompt {p}");
        // A follow-up sharing the system prompt finds it cached there.
        assert_eq!(
            replica_for(one.addr, &support_chat(p, "And the invoice?"), &[]).await,
            a
        );
        used.insert(a);
    }
    assert!(used.len() >= 3, "16 prompts used only {used:?}");
    let m = metrics_text(one.admin_addr).await;
    let hit = metric_value(
        &m,
        "llmlb_routing_decisions_total",
        &[("branch", "prefix_hit")],
    );
    let miss = metric_value(
        &m,
        "llmlb_routing_decisions_total",
        &[("branch", "prefix_miss")],
    );
    assert_eq!((hit, miss), (16.0, 16.0));
    one.shutdown().await;
    two.shutdown().await;
}

#[tokio::test]
async fn removing_a_replica_moves_only_its_prefixes() {
    let ups = upstreams(4).await;
    let lb = start_llmlb(&config(&ups, HASH)).await;
    let mut before = Vec::new();
    for p in 0..40 {
        before.push(replica_for(lb.addr, &support_chat(p, "q"), &[]).await);
    }
    let new = llmlb::config::parse(&config(&ups[..3], HASH)).unwrap();
    llmlb::server::reload::apply(&lb.state, new);
    let mut moved = 0;
    for (p, old) in before.iter().enumerate() {
        let now = replica_for(lb.addr, &support_chat(p, "q"), &[]).await;
        if old == "r3" {
            assert_ne!(now, "r3");
            moved += 1;
        } else {
            assert_eq!(&now, old, "prompt {p} moved though its replica stayed");
        }
    }
    assert!(moved > 0, "no prompt lived on the removed replica");
    lb.shutdown().await;
}

#[tokio::test]
async fn cache_index_survives_reload_for_replicas_that_stay() {
    let ups = upstreams(3).await;
    let lb = start_llmlb(&config(&ups, CACHE)).await;
    // Where each prompt went depends on the replicas' ports (rendezvous
    // order), so the test counts the prompts that live on the replicas the
    // reload keeps (12 prompts: all on the third one is a 1-in-500,000 draw).
    let mut homes = Vec::new();
    for p in 0..12 {
        homes.push(replica_for(lb.addr, &support_chat(p, "q"), &[]).await);
    }
    let on_kept = homes
        .iter()
        .filter(|h| ups[..2].iter().any(|u| &u.name == *h))
        .count();
    assert!(on_kept > 0, "{homes:?}");
    let old = lb.state.topology();
    let ids: Vec<u64> = old.pools()[0].replicas.iter().map(|r| r.id).collect();
    let blocks: usize = ids
        .iter()
        .map(|id| old.pools()[0].router.index(*id).unwrap().len())
        .sum();
    assert!(blocks > 0);
    llmlb::server::reload::apply(
        &lb.state,
        llmlb::config::parse(&config(&ups[..2], CACHE)).unwrap(),
    );
    let new = lb.state.topology();
    for id in &ids[..2] {
        let (a, b) = (
            old.pools()[0].router.index(*id).unwrap(),
            new.pools()[0].router.index(*id).unwrap(),
        );
        assert!(Arc::ptr_eq(a, b), "kept replica lost its index");
    }
    assert!(new.pools()[0].router.index(ids[2]).is_none());
    // Prompts that lived on the kept replicas are still hits, and go back there.
    let hits = async || {
        metric_value(
            &metrics_text(lb.admin_addr).await,
            "llmlb_routing_decisions_total",
            &[("branch", "prefix_hit")],
        )
    };
    let before = hits().await;
    for (p, home) in homes.iter().enumerate() {
        let again = replica_for(lb.addr, &support_chat(p, "again"), &[]).await;
        if ups[..2].iter().any(|u| &u.name == home) {
            assert_eq!(&again, home, "prompt {p} left its kept replica");
        }
    }
    assert!(hits().await - before >= on_kept as f64);
    lb.shutdown().await;
}

#[tokio::test]
async fn saturated_replica_hands_its_prefix_to_the_next_in_order() {
    let ups = upstreams(3).await;
    let prefix = format!("{HASH}\n[pools.saturation]\nmax_in_flight = 1");
    let lb = start_llmlb(&config(&ups, &prefix)).await;
    let body = support_chat(7, "q");
    let home = replica_for(lb.addr, &body, &[]).await;
    let up = ups.iter().find(|u| u.name == home).unwrap();
    up.set_mode(Mode::StreamHeld);
    let stream_body = body.replace("\"max_tokens\":8", "\"max_tokens\":8,\"stream\":true");
    let mut conn = Conn::open(lb.addr).await;
    let resp = conn
        .send(chat_request("/v1/chat/completions", &stream_body))
        .await;
    let mut held = resp.into_body();
    tokio::time::timeout(Duration::from_secs(5), held.frame())
        .await
        .expect("first chunk")
        .unwrap()
        .unwrap();
    // Home is busy: the prefix goes to its second choice, always the same one.
    let next = replica_for(lb.addr, &body, &[]).await;
    assert_ne!(next, home);
    assert_eq!(replica_for(lb.addr, &body, &[]).await, next);
    let m = metrics_text(lb.admin_addr).await;
    assert_eq!(
        sample(
            &m,
            r#"llmlb_routing_decisions_total{branch="prefix_overflow"}"#
        ),
        2.0
    );
    up.release_one();
    drop(held);
    conn.close();
    lb.shutdown().await;
}

#[tokio::test]
async fn session_header_sticks_to_one_replica() {
    let ups = upstreams(4).await;
    let lb = start_llmlb(&config(&ups, "[pools.session]\naffinity = true")).await;
    let mut used = std::collections::HashSet::new();
    for s in 0..20 {
        let session = format!("chat-{s}");
        let first = replica_for(lb.addr, common::CHAT, &[("x-session-id", &session)]).await;
        for _ in 0..3 {
            let r = replica_for(lb.addr, common::CHAT, &[("x-session-id", &session)]).await;
            assert_eq!(r, first);
        }
        used.insert(first);
    }
    assert!(used.len() >= 3, "{used:?}");
    // Without the header, the balancer (round robin) spreads.
    let mut rr = std::collections::HashSet::new();
    for _ in 0..4 {
        rr.insert(replica_for(lb.addr, common::CHAT, &[]).await);
    }
    assert_eq!(rr.len(), 4);
    lb.shutdown().await;
}

//! `exact` prefix mode through a real llmlb in front of simulated replicas
//! that publish their KV-cache events on loopback: llmlb routes a prompt to
//! the replica that really holds its prefix even when llmlb never sent it
//! there, and two llmlb instances subscribed to the same replicas (one
//! started late, catching up through replay) hold the same view and make
//! the same choice; replicas whose events never arrive fall back to the
//! estimate.

use crate::common;
use crate::kv_support;

use std::net::SocketAddr;

use llmlb::daemon::Running;
use llmlb::replica_sim::SimHandle;

use common::{metric_value, metrics_text, start_llmlb, until};
use kv_support::{chat, prompt_hashes, sim_with_events, system};

async fn fleet(n: usize) -> Vec<SimHandle> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(sim_with_events(true, 400, None).await);
    }
    out
}

/// `n` replicas each holding one system prompt (`r{k}` holds `system(k)`),
/// and llmlb in front once it has seen their cache events.
async fn warmed_fleet(n: usize) -> (Vec<SimHandle>, llmlb::daemon::Running) {
    let sims = fleet(n).await;
    let lb = start_llmlb(&config(&sims)).await;
    warm_directly(&sims).await;
    wait_warm(&lb, &sims).await;
    (sims, lb)
}

async fn stop(sims: Vec<SimHandle>) {
    for s in sims {
        s.shutdown().await;
    }
}

fn config(sims: &[SimHandle]) -> String {
    let mut s = format!(
        "[server]\nreplica_header = true\n\
         [[pools]]\nname = \"sim\"\nmodels = [{:?}]\n\
         [pools.prefix]\nmode = \"exact\"\n\
         [pools.scrape]\ninterval = \"50ms\"\ntimeout = \"50ms\"\nstaleness = \"1s\"\n",
        sims[0].config().model
    );
    for (i, r) in sims.iter().enumerate() {
        s.push_str(&format!(
            "[[pools.replicas]]\nurl = \"http://{}\"\nname = \"r{i}\"\nkv_events = \"tcp://{}\"\nkv_events_replay = \"tcp://{}\"\n",
            r.addr,
            r.kv_events.unwrap(),
            r.kv_replay.unwrap()
        ));
    }
    s
}

/// Replica `i`'s record in `lb`: (known, matched blocks of `hashes`, snapshot).
fn view(lb: &Running, i: usize, hashes: &[u64]) -> (bool, usize, Vec<u64>) {
    let topo = lb.state.topology();
    let pool = &topo.pools()[0];
    let held = pool.router.held(pool.replicas[i].id).unwrap();
    (held.known(), held.matched(hashes), held.snapshot())
}

fn model(sims: &[SimHandle]) -> String {
    sims[0].config().model.clone()
}

async fn warm_directly(sims: &[SimHandle]) {
    // Each replica gets its own system prompt, sent to it directly: llmlb
    // never sees these requests.
    for (k, sim) in sims.iter().enumerate() {
        chat(sim.addr, &model(sims), &system(k), "warm-up question").await;
    }
}

async fn wait_warm(lb: &Running, sims: &[SimHandle]) {
    let bs = sims[0].config().engine.block_size;
    for k in 0..sims.len() {
        let hashes = prompt_hashes(&system(k), "next question", bs);
        until("llmlb learned what the replica holds", || {
            let (known, matched, _) = view(lb, k, &hashes);
            known && matched >= 8
        })
        .await;
    }
}

async fn route(addr: SocketAddr, sims: &[SimHandle], system: &str, user: &str) -> String {
    chat(addr, &model(sims), system, user).await.unwrap()
}

#[tokio::test]
async fn routes_to_the_replica_that_really_holds_the_prefix() {
    let (sims, lb) = warmed_fleet(3).await;
    for k in [2, 0, 1] {
        assert_eq!(
            route(lb.addr, &sims, &system(k), "next question").await,
            format!("r{k}")
        );
    }
    // A prompt nobody holds: a miss, then it sticks where it went.
    let cold = route(lb.addr, &sims, &system(9), "first").await;
    let bs = sims[0].config().engine.block_size;
    let i: usize = cold[1..].parse().unwrap();
    let hashes = prompt_hashes(&system(9), "again", bs);
    until("the cold prompt's blocks are reported", || {
        view(&lb, i, &hashes).1 >= 8
    })
    .await;
    assert_eq!(route(lb.addr, &sims, &system(9), "again").await, cold);
    let m = metrics_text(lb.admin_addr).await;
    let branch = |b| metric_value(&m, "llmlb_routing_decisions_total", &[("branch", b)]);
    assert_eq!(branch("prefix_hit"), 4.0);
    assert_eq!(branch("prefix_miss"), 1.0);
    assert_eq!(branch("prefix_estimated"), 0.0);
    lb.shutdown().await;
    stop(sims).await;
}

#[tokio::test]
async fn two_instances_hold_the_same_view_and_choose_alike() {
    let (sims, one) = warmed_fleet(3).await;
    // The second instance starts after the events were published: it
    // catches up through the replicas' replay endpoints.
    let two = start_llmlb(&config(&sims)).await;
    wait_warm(&two, &sims).await;
    let same_view = || {
        (0..sims.len()).all(|i| {
            let (k1, _, s1) = view(&one, i, &[]);
            let (k2, _, s2) = view(&two, i, &[]);
            k1 && k2 && s1 == s2
        })
    };
    until("both instances hold the same view", same_view).await;
    let requests = [(0, "a"), (1, "b"), (2, "c"), (7, "d"), (1, "e"), (8, "f")];
    for (k, user) in requests {
        let first = route(one.addr, &sims, &system(k), user).await;
        // The request changed what the replica holds: wait until both
        // instances saw it, then ask the other one the same thing.
        let bs = sims[0].config().engine.block_size;
        let i: usize = first[1..].parse().unwrap();
        let hashes = prompt_hashes(&system(k), user, bs);
        until("the new blocks are reported", || {
            view(&one, i, &hashes).1 >= 8
        })
        .await;
        until("both instances hold the same view", same_view).await;
        let second = route(two.addr, &sims, &system(k), user).await;
        assert_eq!(first, second, "system {k}");
        if k < 3 {
            assert_eq!(first, format!("r{k}"));
        }
    }
    one.shutdown().await;
    two.shutdown().await;
    stop(sims).await;
}

/// Replicas whose events never arrive (nothing listens on their event
/// port) stay unknown: `exact` mode scores them from what llmlb sent, as
/// `cache` mode does, and says so in the branch.
#[tokio::test]
async fn unknown_events_fall_back_to_the_estimate() {
    let sims = fleet(2).await;
    let nowhere = common::refused_addr().await;
    let mut text = config(&sims);
    for r in &sims {
        text = text.replace(
            &format!("tcp://{}\"", r.kv_events.unwrap()),
            &format!("tcp://{nowhere}\""),
        );
    }
    let lb = start_llmlb(&text).await;
    let first = route(lb.addr, &sims, &system(3), "one").await;
    for user in ["two", "three"] {
        assert_eq!(route(lb.addr, &sims, &system(3), user).await, first);
    }
    assert!(!view(&lb, 0, &[]).0 && !view(&lb, 1, &[]).0);
    let m = metrics_text(lb.admin_addr).await;
    let branch = |b| metric_value(&m, "llmlb_routing_decisions_total", &[("branch", b)]);
    assert_eq!(branch("prefix_estimated"), 3.0);
    assert_eq!(branch("prefix_hit"), 2.0);
    lb.shutdown().await;
    stop(sims).await;
}

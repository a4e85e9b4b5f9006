//! A pool with `max_inflight = 2` flooded through retries (a replica that
//! refuses connections and gets ejected) and a reload (new weight, new
//! queue shape): each simulated replica's own `vllm:num_requests_running +
//! vllm:num_requests_waiting`, sampled from its `/metrics` through the
//! whole run, never goes above 2.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::common::*;
use crate::sim_support;

const LIMIT: f64 = 2.0;
const REQUESTS: usize = 90;

fn config(
    sims: &[std::net::SocketAddr],
    dead: std::net::SocketAddr,
    weight: u32,
    depth: u32,
) -> String {
    let mut s = format!(
        "[[pools]]\nname = \"llama\"\nmodels = [\"llmlb-sim\"]\nbalancer = \"round_robin\"\n\
         max_inflight = 2\nretries = 2\n\
         [pools.queue]\nmax_depth = {depth}\ntimeout = \"60s\"\nmax_wait = \"60s\"\n\
         [[pools.replicas]]\nurl = \"http://{dead}\"\nname = \"dead\"\n"
    );
    for (i, addr) in sims.iter().enumerate() {
        let w = if i == 0 { weight } else { 1 };
        s.push_str(&format!(
            "[[pools.replicas]]\nurl = \"http://{addr}\"\nname = \"sim-{i}\"\nweight = {w}\n"
        ));
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_never_hold_more_than_max_inflight_under_retries_ejection_and_reload() {
    let mut sims = Vec::new();
    for _ in 0..3 {
        sims.push(sim_support::start(sim_support::fast()).await);
    }
    let addrs: Vec<_> = sims.iter().map(|s| s.addr).collect();
    let dead = refused_addr().await;
    let lb = start_llmlb(&config(&addrs, dead, 1, 200)).await;

    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        let addrs = addrs.clone();
        tokio::spawn(async move {
            let mut peak: HashMap<std::net::SocketAddr, f64> = HashMap::new();
            let mut samples = 0usize;
            while !done.load(Ordering::SeqCst) {
                for &addr in &addrs {
                    let m = sim_support::scrape(addr).await;
                    let held = sim_support::metric(&m, "vllm:num_requests_running", &[])
                        + sim_support::metric(&m, "vllm:num_requests_waiting", &[]);
                    let p = peak.entry(addr).or_default();
                    *p = p.max(held);
                }
                samples += 1;
            }
            (peak, samples)
        })
    };

    let body = r#"{"model":"llmlb-sim","messages":[{"role":"user","content":"count to forty"}],"max_tokens":40}"#;
    let calls: Vec<_> = (0..REQUESTS)
        .map(|_| tokio::spawn(call(lb.addr, chat_request("/v1/chat/completions", body))))
        .collect();
    // Reload while the flood is running: sim-0 gets a new weight (a rebuilt
    // replica that must keep its count) and the queue a new shape.
    until("some requests served", || {
        lb.state.topology().pools()[0].replicas[1].in_flight() > 0
    })
    .await;
    let reloaded = llmlb::config::parse(&config(&addrs, dead, 3, 300)).unwrap();
    llmlb::server::reload::apply(&lb.state, reloaded);

    let mut ok = 0;
    for c in calls {
        let (status, _, body) = c.await.unwrap();
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
        ok += 1;
    }
    done.store(true, Ordering::SeqCst);
    let (peak, samples) = sampler.await.unwrap();
    assert_eq!(ok, REQUESTS);
    assert!(
        samples >= 3,
        "sampled the replicas through the run ({samples})"
    );
    for addr in &addrs {
        let p = peak[addr];
        assert!(
            p <= LIMIT,
            "replica {addr} held {p} requests, limit {LIMIT}"
        );
    }
    let text = metrics_text(lb.admin_addr).await;
    assert!(
        metric_value(&text, "llmlb_retries_total", &[]) >= 1.0,
        "retries happened"
    );
    assert!(
        metric_value(
            &text,
            "llmlb_outlier_ejections_total",
            &[("replica", "dead")]
        ) >= 1.0,
        "the refusing replica was ejected:\n{text}"
    );
}

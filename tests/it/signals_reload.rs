//! The background loops follow the live topology: a replica added by a
//! topology swap (what a config reload does) starts being scraped, and one
//! removed stops being scraped.

use crate::signals_fake;

use std::sync::atomic::Ordering;
use std::time::Duration;

use signals_fake::{Fake, Proxy};

fn config(urls: &[String]) -> llmlb::config::Config {
    let mut toml = String::from(
        "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\nbalancer = \"jsq\"\n\
         [pools.scrape]\ninterval = \"50ms\"\ntimeout = \"40ms\"\n",
    );
    for u in urls {
        toml.push_str(&format!("[[pools.replicas]]\nurl = \"{u}\"\n"));
    }
    llmlb::config::parse(&toml).unwrap()
}

async fn wait_scrapes(fake: &Fake, at_least: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while fake.scrapes.load(Ordering::SeqCst) < at_least {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no scrape of {}",
            fake.addr
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrape_loops_follow_topology_swaps() {
    let a = Fake::start().await;
    let b = Fake::start().await;
    let proxy = Proxy::start(
        &[&a],
        "balancer = \"jsq\"",
        "[pools.scrape]\ninterval = \"50ms\"\ntimeout = \"40ms\"",
    )
    .await;
    wait_scrapes(&a, 2).await;
    assert_eq!(b.scrapes.load(Ordering::SeqCst), 0);

    let state = &proxy.running.state;
    let swap = |urls: &[String]| {
        llmlb::server::reload::apply(state, config(urls));
    };

    // Add b: it is scraped within a supervisor tick; a keeps its snapshot.
    swap(&[a.url(), b.url()]);
    wait_scrapes(&b, 2).await;
    assert!(!proxy.replica(&a).await["load"].is_null());

    // Remove a: its loop stops.
    swap(&[b.url()]);
    tokio::time::sleep(Duration::from_millis(700)).await; // > one supervisor tick
    let settled = a.scrapes.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(a.scrapes.load(Ordering::SeqCst), settled);
    let before_b = b.scrapes.load(Ordering::SeqCst);
    wait_scrapes(&b, before_b + 2).await;
    proxy.stop().await;
}

/// The gauge lines of `metrics` that name `replica`.
fn gauges_of(metrics: &str, replica: &str) -> Vec<String> {
    let label = format!("replica=\"{replica}\"");
    metrics
        .lines()
        .filter(|l| {
            (l.starts_with("llmlb_replica_down")
                || l.starts_with("llmlb_replica_scraped_")
                || l.starts_with("llmlb_replica_health_up"))
                && l.contains(&label)
        })
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_replica_stops_reporting_gauges() {
    let a = Fake::start().await;
    let b = Fake::start().await;
    let proxy = Proxy::start(
        &[&a, &b],
        "balancer = \"jsq\"",
        "[pools.scrape]\ninterval = \"50ms\"\ntimeout = \"40ms\"",
    )
    .await;
    wait_scrapes(&a, 2).await;
    let name = proxy.replica(&a).await["name"]
        .as_str()
        .expect("replica name")
        .to_owned();
    // Scraped and eligibility gauges exist for a while it is in the pool.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    while gauges_of(&proxy.metrics().await, &name).len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no gauges for {name}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    llmlb::server::reload::apply(&proxy.running.state, config(&[b.url()]));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let left = gauges_of(&proxy.metrics().await, &name);
        if left.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "gauges of the removed replica remain: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The replica still in the pool keeps its gauges.
    let b_name = proxy.replica(&b).await["name"].as_str().unwrap().to_owned();
    assert!(!gauges_of(&proxy.metrics().await, &b_name).is_empty());
    proxy.stop().await;
}

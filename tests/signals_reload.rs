//! The background loops follow the live topology: a replica added by a
//! topology swap (what a config reload does) starts being scraped, and one
//! removed stops being scraped.

mod signals_fake;

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

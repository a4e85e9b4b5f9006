//! Load-aware balancing through a real llmlb and real scrapes: a slowed
//! replica reporting a long queue gets clearly less new work under `jsq` and
//! `least_tokens` than under round-robin; stale scrapes make every candidate
//! fall back to local counts; `kv_aware` steers away from a full cache, and
//! so does `hash` affinity with `[pools.saturation] max_kv_usage`.

use crate::signals_fake;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use signals_fake::{Fake, Proxy, metric_value, vllm_metrics};

const REQUESTS: usize = 48;
const CONCURRENCY: usize = 8;

/// A slow replica (20 requests queued, so about 200 ms before its first
/// token, then 5 ms per token) and a fast idle one.
async fn fleet() -> (Arc<Fake>, Arc<Fake>) {
    let slow = Fake::start().await;
    slow.first_token_delay_ms.store(200, Ordering::SeqCst);
    slow.token_delay_ms.store(5, Ordering::SeqCst);
    slow.tokens.store(8, Ordering::SeqCst);
    slow.set_metrics(vllm_metrics(8, 20, 0.7));
    let fast = Fake::start().await;
    fast.token_delay_ms.store(1, Ordering::SeqCst);
    fast.tokens.store(8, Ordering::SeqCst);
    fast.set_metrics(vllm_metrics(1, 0, 0.1));
    (slow, fast)
}

/// `REQUESTS` streamed chats from `CONCURRENCY` clients; the share the slow
/// replica received.
async fn share_of_slow(proxy: &Arc<Proxy>, slow: &Fake) -> f64 {
    let before = slow.chats();
    let mut clients = tokio::task::JoinSet::new();
    for _ in 0..CONCURRENCY {
        let p = Arc::clone(proxy);
        clients.spawn(async move {
            for _ in 0..REQUESTS / CONCURRENCY {
                let (status, body) = p.chat(true, 8).await;
                assert_eq!(status, 200);
                assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
            }
        });
    }
    while let Some(r) = clients.join_next().await {
        r.unwrap();
    }
    (slow.chats() - before) as f64 / REQUESTS as f64
}

async fn scraped(proxy: &Proxy, fakes: &[&Fake]) {
    for f in fakes {
        proxy
            .wait_for(f, Duration::from_secs(3), "first scrape", |r| {
                !r["load"].is_null()
            })
            .await;
    }
}

/// Two replicas reporting `metrics` behind `balancer`, both scraped once.
async fn scraped_pair(
    metrics: [String; 2],
    balancer: &str,
    tables: &str,
) -> (Arc<Fake>, Arc<Fake>, Proxy) {
    let [a_metrics, b_metrics] = metrics;
    let a = Fake::start().await;
    a.set_metrics(a_metrics);
    let b = Fake::start().await;
    b.set_metrics(b_metrics);
    let proxy = Proxy::start(&[&a, &b], &format!("balancer = \"{balancer}\""), tables).await;
    scraped(&proxy, &[&a, &b]).await;
    (a, b, proxy)
}

/// `n` chats, one after another, each answered 200.
async fn chats_ok(proxy: &Proxy, n: usize) {
    for i in 0..n {
        assert_eq!(proxy.chat(false, 8).await.0, 200, "chat {i} of {n}");
    }
}

async fn assert_released(proxy: &Proxy, fakes: &[&Fake]) {
    for f in fakes {
        let r = proxy.replica(f).await;
        assert_eq!(r["in_flight"], 0, "{r}");
        assert_eq!(r["outstanding_tokens"], 0, "{r}");
    }
}

async fn run(balancer: &str) -> (f64, String) {
    let (slow, fast) = fleet().await;
    let proxy = Arc::new(
        Proxy::start(
            &[&slow, &fast],
            &format!("balancer = \"{balancer}\""),
            "[pools.scrape]\nenabled = true\ninterval = \"100ms\"\ntimeout = \"80ms\"\nstaleness = \"2s\"",
        )
        .await,
    );
    scraped(&proxy, &[&slow, &fast]).await;
    let share = share_of_slow(&proxy, &slow).await;
    assert_released(&proxy, &[&slow, &fast]).await;
    let metrics = proxy.metrics().await;
    Arc::into_inner(proxy).unwrap().stop().await;
    (share, metrics)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_gives_the_slow_replica_half() {
    let (share, _) = run("round_robin").await;
    assert_eq!(share, 0.5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jsq_keeps_new_work_off_the_long_queue() {
    let (share, metrics) = run("jsq").await;
    eprintln!("jsq share {share:.3}");
    assert!(share < 0.2, "slow replica got {share:.2} under jsq");
    assert!(
        metric_value(&metrics, "llmlb_balancer_decisions_total{branch=\"jsq\"") >= 40.0,
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_tokens_keeps_new_work_off_the_slow_replica() {
    let (share, metrics) = run("least_tokens").await;
    eprintln!("least_tokens share {share:.3}");
    assert!(
        share < 0.3,
        "slow replica got {share:.2} under least_tokens"
    );
    assert!(
        metric_value(
            &metrics,
            "llmlb_balancer_decisions_total{branch=\"least_tokens\""
        ) >= 40.0,
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p2c_over_two_replicas_behaves_like_its_metric() {
    let (share, _) = run("p2c").await; // default metric: least_tokens
    eprintln!("p2c share {share:.3}");
    assert!(share < 0.3, "slow replica got {share:.2} under p2c");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_scrapes_fall_back_to_local_counts_for_all() {
    let (idle_looking, busy, proxy) = scraped_pair(
        [vllm_metrics(0, 0, 0.1), vllm_metrics(8, 50, 0.9)],
        "jsq",
        // Staleness well above the interval: a busy host delays a scrape
        // without making it stale.
        "[pools.scrape]\ninterval = \"100ms\"\ntimeout = \"100ms\"\nstaleness = \"1500ms\"",
    )
    .await;

    // Fresh: the short queue takes everything.
    chats_ok(&proxy, 6).await;
    assert_eq!(idle_looking.chats(), 6);
    assert_eq!(busy.chats(), 0);

    // Its metrics endpoint breaks: the last "idle" snapshot must not keep
    // attracting work once stale. Local counts decide for both replicas.
    idle_looking.set_metrics_fail(true);
    proxy
        .wait_for(&idle_looking, Duration::from_secs(10), "staleness", |r| {
            r["load"]["stale"] == true
        })
        .await;
    chats_ok(&proxy, 10).await;
    assert_eq!(busy.chats(), 5, "local counts tie, so picks rotate");
    let m = proxy.metrics().await;
    assert_eq!(
        metric_value(&m, "llmlb_stale_metrics_fallbacks_total{pool=\"p\"}"),
        10.0,
        "{m}"
    );
    assert_eq!(
        metric_value(
            &m,
            "llmlb_balancer_decisions_total{branch=\"fallback_stale_metrics\""
        ),
        10.0
    );
    assert!(
        metric_value(&m, "llmlb_scrape_errors_total{kind=\"status\"") >= 1.0,
        "{m}"
    );

    // Scrapes recover: back to the scraped queue.
    idle_looking.set_metrics_fail(false);
    proxy
        .wait_for(
            &idle_looking,
            Duration::from_secs(10),
            "fresh scrape",
            |r| r["load"]["stale"] == false,
        )
        .await;
    let before = busy.chats();
    for _ in 0..4 {
        proxy.chat(false, 8).await;
    }
    assert_eq!(busy.chats(), before);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_aware_avoids_the_full_cache() {
    let (full, roomy, proxy) = scraped_pair(
        [vllm_metrics(4, 0, 0.95), vllm_metrics(4, 0, 0.30)],
        "kv_aware",
        "[pools.balancing]\nkv_threshold = 0.9\n[pools.scrape]\ninterval = \"100ms\"\ntimeout = \"80ms\"",
    )
    .await;
    chats_ok(&proxy, 8).await;
    assert_eq!(full.chats(), 0);
    assert_eq!(roomy.chats(), 8);
    let m = proxy.metrics().await;
    assert_eq!(
        metric_value(&m, "llmlb_balancer_decisions_total{branch=\"kv_aware\""),
        8.0,
        "{m}"
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outstanding_tokens_shrink_as_the_stream_flows_and_free_on_disconnect() {
    use http_body_util::BodyExt;

    let a = Fake::start().await;
    a.token_delay_ms.store(30, Ordering::SeqCst);
    a.tokens.store(40, Ordering::SeqCst);
    let proxy = Proxy::start(&[&a], "balancer = \"least_tokens\"", "").await;
    let mut resp = proxy.open_stream(100).await;
    assert_eq!(resp.status(), 200);
    let body = resp.body_mut();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.data_ref().unwrap().starts_with(b"data:"));
    // Prompt done, one event out: at most 99 of the 100 output tokens remain.
    let at_first = proxy.replica(&a).await["outstanding_tokens"]
        .as_u64()
        .unwrap();
    assert!((1..=99).contains(&at_first), "{at_first}");
    for _ in 0..5 {
        body.frame().await.unwrap().unwrap();
    }
    let later = proxy.replica(&a).await["outstanding_tokens"]
        .as_u64()
        .unwrap();
    assert!(later <= at_first - 5, "{at_first} -> {later}");
    assert_eq!(proxy.replica(&a).await["in_flight"], 1);

    // The client goes away mid-stream: the whole remaining estimate is released.
    drop(resp);
    proxy
        .wait_for(&a, Duration::from_secs(3), "release on disconnect", |r| {
            r["in_flight"] == 0 && r["outstanding_tokens"] == 0
        })
        .await;
    proxy.stop().await;
}

/// `fake` reports `usage` of its KV cache from now on; returns once the
/// proxy has scraped it.
async fn report_kv_usage(proxy: &Proxy, fake: &Fake, usage: f64) {
    fake.set_metrics(vllm_metrics(4, 0, usage));
    proxy
        .wait_for(fake, Duration::from_secs(3), "the new scrape", |r| {
            r["load"]["kv_usage"] == usage
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_affinity_leaves_a_full_cache_only_with_max_kv_usage() {
    const TABLES: &str = "[pools.prefix]\nmode = \"hash\"\n[pools.saturation]\nmax_kv_usage = 0.9\n\
                          [pools.scrape]\ninterval = \"50ms\"\ntimeout = \"40ms\"";
    let (a, b, proxy) = scraped_pair(
        [vllm_metrics(4, 0, 0.30), vllm_metrics(4, 0, 0.30)],
        "round_robin",
        TABLES,
    )
    .await;
    // The same prompt every time: one key, one home.
    chats_ok(&proxy, 4).await;
    let (home, other) = if a.chats() == 4 { (&a, &b) } else { (&b, &a) };
    assert_eq!((home.chats(), other.chats()), (4, 0));
    // The home's cache fills (no request waits there): the key moves on.
    report_kv_usage(&proxy, home, 0.95).await;
    chats_ok(&proxy, 4).await;
    assert_eq!((home.chats(), other.chats()), (4, 4));
    let m = proxy.metrics().await;
    assert_eq!(
        metric_value(
            &m,
            "llmlb_routing_decisions_total{branch=\"prefix_overflow\""
        ),
        4.0,
        "{m}"
    );
    // Room again: back home.
    report_kv_usage(&proxy, home, 0.5).await;
    chats_ok(&proxy, 2).await;
    assert_eq!((home.chats(), other.chats()), (6, 4));
    proxy.stop().await;

    // Without the bound, a full cache with an empty queue keeps its prefix.
    let (full, roomy, proxy) = scraped_pair(
        [vllm_metrics(4, 0, 0.95), vllm_metrics(4, 0, 0.95)],
        "round_robin",
        "[pools.prefix]\nmode = \"hash\"\n[pools.scrape]\ninterval = \"50ms\"\ntimeout = \"40ms\"",
    )
    .await;
    chats_ok(&proxy, 4).await;
    let counts = [full.chats(), roomy.chats()];
    assert!(counts == [4, 0] || counts == [0, 4], "{counts:?}");
    proxy.stop().await;
}

//! `cache` mode forgets what a replica held once the replica restarts: its
//! cumulative `vllm:prefix_cache_queries_total` going down in a scrape clears
//! its prefix index.

use crate::common;
use crate::signals_fake;

use common::{call, chat_request, metric_value, metrics_text, start_llmlb, until};
use signals_fake::{Fake, vllm_metrics};

fn page(queries: u64) -> String {
    format!(
        "{}# TYPE vllm:prefix_cache_queries counter\nvllm:prefix_cache_queries_total{{engine=\"0\",model_name=\"tiny\"}} {queries}.0\n",
        vllm_metrics(0, 0, 0.1)
    )
}

async fn scrapes_pass(fake: &Fake, n: u64) {
    let start = fake.scrapes.load(std::sync::atomic::Ordering::SeqCst);
    until("scrapes happen", || {
        fake.scrapes.load(std::sync::atomic::Ordering::SeqCst) >= start + n
    })
    .await;
}

#[tokio::test]
async fn counter_reset_clears_the_prefix_index() {
    let fake = Fake::start().await;
    fake.set_metrics(page(1_000));
    let config = format!(
        "[[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\n\
         [pools.prefix]\nmode = \"cache\"\n\
         [pools.scrape]\ninterval = \"20ms\"\ntimeout = \"15ms\"\nstaleness = \"1s\"\n\
         [[pools.replicas]]\nurl = \"{}\"\n",
        fake.url()
    );
    let lb = start_llmlb(&config).await;
    scrapes_pass(&fake, 2).await;
    let body = serde_json::json!({
        "model": "llama-3-8b",
        "messages": [
            {"role": "system", "content": "You answer questions about the warehouse stock levels. ".repeat(8)},
            {"role": "user", "content": "How many pallets?"}
        ]
    })
    .to_string();
    let send = || async {
        let (status, _, _) = call(lb.addr, chat_request("/v1/chat/completions", &body)).await;
        assert_eq!(status, 200);
    };
    send().await; // miss: nothing known yet
    send().await; // hit
    fake.set_metrics(page(12)); // the replica restarted
    scrapes_pass(&fake, 2).await;
    send().await; // the index was cleared: miss again
    send().await; // and it learns again: hit
    let m = metrics_text(lb.admin_addr).await;
    let branch = |b| metric_value(&m, "llmlb_routing_decisions_total", &[("branch", b)]);
    assert_eq!((branch("prefix_miss"), branch("prefix_hit")), (2.0, 2.0));
    assert_eq!(metric_value(&m, "llmlb_replica_restarts_total", &[]), 1.0);
    lb.shutdown().await;
}

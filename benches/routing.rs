//! Cost of the routing stage for one request at 8, 64 and 512 replicas:
//! `hash` and `cache` prefix modes on a chat prompt with a ~2,000-token system
//! prompt, and a canary split; plus cutting that prompt into block hashes.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use http::HeaderMap;
use llmlb::admission::AdmissionMetrics;
use llmlb::pool::Topology;
use llmlb::routing::prefix::blocks::{block_hashes, prompt_token_ids};
use llmlb::routing::{Prompt, RouteInput};
use llmlb::telemetry::Metrics;
use llmlb::tokenize::{ChatMessage, PromptTokenizer};

fn topology(n: usize, pool_extra: &str, replica_extra: impl Fn(usize) -> String) -> Topology {
    let mut text = format!("[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n{pool_extra}\n");
    for i in 0..n {
        text.push_str(&format!(
            "[[pools.replicas]]\nurl = \"http://10.0.{}.{}:8000\"\n{}\n",
            i / 250,
            i % 250 + 1,
            replica_extra(i)
        ));
    }
    let config = llmlb::config::parse(&text).unwrap();
    let metrics = Metrics::new();
    let admission = AdmissionMetrics::new(metrics.registry());
    Topology::build(&config, &metrics, &admission, None)
}

fn routing(c: &mut Criterion) {
    let system =
        "You are a support assistant for a parcel company. Be precise and brief. ".repeat(140);
    let chat = vec![
        ChatMessage::new("system", system),
        ChatMessage::new("user", "Where is parcel 1234?"),
    ];
    let headers = HeaderMap::new();
    let input = RouteInput {
        model: "m",
        user: Some("user-42"),
        api_key: None,
        headers: &headers,
        tier: None,
        prompt: Prompt::Chat(&chat),
        tokens: None,
        salt: None,
        unpredictable: None,
        kind: "plain",
        max_tokens: Some(256),
    };
    let mut group = c.benchmark_group("route");
    let cases: [(&str, &str); 3] = [
        ("hash", "[pools.prefix]\nmode = \"hash\""),
        ("cache", "[pools.prefix]\nmode = \"cache\""),
        ("canary", "[pools.canary]\nweights = { v1 = 95, v2 = 5 }"),
    ];
    for n in [8usize, 64, 512] {
        for (name, extra) in cases {
            let t = topology(n, extra, |i| format!("version = \"v{}\"", 1 + i % 2));
            let pool = &t.pools()[0];
            // Warm the cache index: the prompt was sent to one replica.
            let warm = pool.router.route(&pool.replicas, &input, 7, 1).unwrap();
            // (`exact` mode would count it while the handle lives: none here.)
            let _sent = warm.dispatched(&pool.replicas[n / 2]);
            group.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
                b.iter(|| {
                    black_box(
                        pool.router
                            .route(&pool.replicas, black_box(&input), 7, 1)
                            .unwrap(),
                    )
                })
            });
        }
    }
    group.finish();
    c.bench_function("prompt_blocks/2k_tokens", |b| {
        b.iter(|| {
            let tokens =
                prompt_token_ids(&PromptTokenizer::StandIn, Prompt::Chat(black_box(&chat)));
            black_box(block_hashes("m", &tokens, 16))
        })
    });
}

criterion_group!(benches, routing);
criterion_main!(benches);

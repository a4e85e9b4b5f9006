//! Cost of one `pick` for every balancer at 8, 64 and 512 replicas, and of
//! reading one vLLM `/metrics` page into a load snapshot.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use llmlb::balancing::{BalancerParams, RequestInfo, build};
use llmlb::config::{BalancerKind, P2cMetric};
use llmlb::replica::LoadSnapshot;
use llmlb::replica::{ReplicaView, ScrapedLoad};
use llmlb::signals::MetricNames;

const VLLM: &str = include_str!("../tests/fixtures/vllm_metrics.txt");
const VLLM_REAL: &str = include_str!("../tests/fixtures/vllm_cpu_real_metrics.txt");

/// Varied, fresh load so no balancer takes a shortcut.
fn views(n: usize) -> Vec<ReplicaView> {
    (0..n)
        .map(|i| {
            let x = (i as u64).wrapping_mul(2_654_435_761) % 97;
            ReplicaView {
                id: i as u64 + 1,
                weight: 1 + (x % 3) as u32,
                in_flight: x % 17,
                outstanding_tokens: x * 131,
                prefilling: 0,
                uncached_prefill: 0,
                decoding_output: 0,
                load: Some(ScrapedLoad {
                    running: Some(x % 32),
                    waiting: Some(x % 11),
                    kv_usage: Some((x as f64) / 100.0),
                    kv_capacity_tokens: Some(65_536),
                    age_ms: 100,
                    dispatched_since: x % 5,
                    completed_since: x % 3,
                    first_bytes_since: x % 4,
                    prefilling_at_scrape: x % 6,
                    tokens_since: x * 7,
                }),
                rates: Default::default(),
            }
        })
        .collect()
}

fn picks(c: &mut Criterion) {
    let req = RequestInfo {
        model: "m",
        prompt_tokens: 812,
        max_tokens: Some(256),
        user: None,
    };
    let kinds = [
        (BalancerKind::RoundRobin, None),
        (BalancerKind::LeastConnections, None),
        (BalancerKind::LeastTokens, None),
        (BalancerKind::Jsq, None),
        (BalancerKind::KvAware, None),
        (BalancerKind::P2c, Some(P2cMetric::LeastTokens)),
        (BalancerKind::P2c, Some(P2cMetric::KvAware)),
    ];
    let mut group = c.benchmark_group("pick");
    for n in [8usize, 64, 512] {
        let v = views(n);
        for (kind, metric) in kinds {
            let mut params = BalancerParams::default();
            if let Some(m) = metric {
                params.p2c_metric = m;
            }
            let balancer = build(kind, params);
            let label = match metric {
                Some(m) => format!("{}_{m:?}", kind.as_str()).to_lowercase(),
                None => kind.as_str().to_string(),
            };
            group.bench_with_input(BenchmarkId::new(label, n), &v, |b, v| {
                b.iter(|| balancer.pick(black_box(&req), black_box(v)))
            });
        }
    }
    group.finish();
}

fn parse(c: &mut Criterion) {
    let names = MetricNames::vllm();
    c.bench_function("parse_vllm_scrape", |b| {
        b.iter(|| LoadSnapshot::from_text(black_box(VLLM_REAL), &names, 1))
    });
    c.bench_function("parse_vllm_two_engine_fixture", |b| {
        b.iter(|| LoadSnapshot::from_text(black_box(VLLM), &names, 1))
    });
}

criterion_group!(benches, picks, parse);
criterion_main!(benches);

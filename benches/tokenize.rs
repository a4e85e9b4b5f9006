//! Render + tokenize cost of chat prompts with a model's own tokenizer
//! (`../shared/tokenizers/tiny-llama`, a byte-level BPE) at about 1k, 8k
//! and 32k prompt tokens, beside the stand-in tokenizer; then p50/p99 of
//! single calls, printed after criterion's report.
//!
//! Run: `cargo bench --bench tokenize`.

use std::hint::black_box;
use std::path::Path;
use std::time::Instant;

use criterion::{BenchmarkId, Criterion, criterion_group};
use llmlb::tokenize::{ChatMessage, PromptTokenizer};

const SIZES: [usize; 3] = [1_000, 8_000, 32_000];

fn model() -> PromptTokenizer {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/tokenizers/tiny-llama");
    PromptTokenizer::load(&dir).expect("the tiny-llama tokenizer fixture")
}

/// A system prompt of varied prose and a question, about `tokens` long.
fn chat(t: &PromptTokenizer, tokens: usize) -> Vec<ChatMessage> {
    const WORDS: &[&str] = &[
        "parcel",
        "delivery",
        "customer",
        "refund",
        "policy",
        "warehouse",
        "invoice",
        "route",
        "driver",
        "schedule",
        "address",
        "signature",
        "damaged",
        "express",
        "tracking",
        "weekend",
        "holiday",
        "insurance",
        "Zürich",
        "naïve",
        "2024-03-01",
        "#4711",
        "(see §3)",
    ];
    let mut system = String::new();
    let mut i = 0usize;
    loop {
        for _ in 0..200 {
            system.push_str(WORDS[(i * 7 + i / 3) % WORDS.len()]);
            system.push(if i % 17 == 16 { '\n' } else { ' ' });
            i += 1;
        }
        let msgs = vec![
            ChatMessage::new("system", system.clone()),
            ChatMessage::new("user", "Where is parcel 1234 and when will it arrive?"),
        ];
        if t.encode_chat(&msgs).unwrap().len() >= tokens {
            return msgs;
        }
    }
}

fn bench(c: &mut Criterion) {
    let model = model();
    let mut group = c.benchmark_group("tokenize");
    group.sample_size(20);
    for &n in &SIZES {
        let msgs = chat(&model, n);
        group.bench_with_input(BenchmarkId::new("model_render", n), &msgs, |b, m| {
            b.iter(|| black_box(model.render_chat(black_box(m)).unwrap()))
        });
        group.bench_with_input(BenchmarkId::new("model_render_encode", n), &msgs, |b, m| {
            b.iter(|| black_box(model.encode_chat(black_box(m)).unwrap()))
        });
        group.bench_with_input(
            BenchmarkId::new("stand_in_render_encode", n),
            &msgs,
            |b, m| {
                b.iter(|| black_box(PromptTokenizer::StandIn.encode_chat(black_box(m)).unwrap()))
            },
        );
    }
    group.finish();
}

/// p50 and p99 of 200 single render+encode calls per size.
fn percentiles() {
    let model = model();
    println!("\nrender+encode, 200 calls each (model tokenizer):");
    for &n in &SIZES {
        let msgs = chat(&model, n);
        let tokens = model.encode_chat(&msgs).unwrap().len();
        let mut us: Vec<f64> = (0..200)
            .map(|_| {
                let t = Instant::now();
                black_box(model.encode_chat(black_box(&msgs)).unwrap());
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        us.sort_by(f64::total_cmp);
        println!(
            "  {tokens:>6} tokens ({} bytes): p50 {:.0} µs, p99 {:.0} µs",
            msgs[0].joined("").len(),
            us[us.len() / 2],
            us[us.len() * 99 / 100]
        );
    }
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    percentiles();
}

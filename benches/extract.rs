//! Reading the few fields llmlb needs from a chat request body (model,
//! stream, max tokens, user, the messages and their size), for bodies of
//! about 1k and 32k prompt tokens; with a counting global allocator, the
//! allocations and bytes allocated per extraction are printed after
//! criterion's report (they do not depend on the machine's load).
//!
//! Run: `cargo bench --bench extract`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};

use criterion::{BenchmarkId, Criterion, criterion_group};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

// SAFETY: defers to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        BYTES.fetch_add(new_size as u64, Ordering::Relaxed);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A chat request of about `tokens` prompt tokens (4 bytes of text per
/// token): a long system prompt, a few turns, content parts in one of
/// them, and the usual sampling fields.
fn body(tokens: usize) -> Vec<u8> {
    let words = [
        "parcel ",
        "delivery ",
        "refund ",
        "policy ",
        "invoice ",
        "driver ",
        "tracking ",
        "weekend ",
    ];
    let mut system = String::new();
    let mut i = 0;
    while system.len() < tokens * 4 {
        system.push_str(words[i % words.len()]);
        i += 1;
    }
    serde_json::to_vec(&serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "stream": true,
        "max_tokens": 256,
        "temperature": 0.7,
        "user": "tenant-42",
        "stream_options": {"include_usage": true},
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Where is my parcel?"},
            {"role": "assistant", "content": "It left the warehouse this morning."},
            {"role": "user", "content": [
                {"type": "text", "text": "And the refund for the damaged one?"},
                {"type": "image_url", "image_url": {"url": "https://example.invalid/a.png"}}
            ]}
        ]
    }))
    .unwrap()
}

const SIZES: [usize; 2] = [1_000, 32_000];

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("extract");
    for tokens in SIZES {
        let body = body(tokens);
        group.bench_with_input(BenchmarkId::from_parameter(tokens), &body, |b, body| {
            b.iter(|| llmlb::server::request::extract(black_box(body)).unwrap())
        });
    }
    group.finish();
}

/// Allocations and bytes allocated by one extraction, per body size.
fn allocations() {
    println!("\nallocations per extraction (counting allocator):");
    println!(
        "{:>8}  {:>10}  {:>8}  {:>12}",
        "tokens", "body bytes", "allocs", "bytes alloc"
    );
    for tokens in SIZES {
        let body = body(tokens);
        let meta = llmlb::server::request::extract(&body).unwrap();
        drop(meta);
        let (a0, b0) = (
            ALLOCS.load(Ordering::Relaxed),
            BYTES.load(Ordering::Relaxed),
        );
        let meta = llmlb::server::request::extract(&body).unwrap();
        let (a1, b1) = (
            ALLOCS.load(Ordering::Relaxed),
            BYTES.load(Ordering::Relaxed),
        );
        drop(black_box(meta));
        println!(
            "{tokens:>8}  {:>10}  {:>8}  {:>12}",
            body.len(),
            a1 - a0,
            b1 - b0
        );
    }
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    allocations();
}

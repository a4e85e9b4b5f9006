//! The simulator's prefix cache stores and evicts the same blocks, in the
//! same order, as a real vLLM replica given the same requests.
//!
//! `tests/fixtures/kv_events/vllm_eviction.hex` holds the KV-cache events a
//! real vLLM CPU replica (0.32.0, 32 blocks of 128 tokens) published for the
//! request sequence in `vllm_eviction_requests.json`, sent one at a time
//! (`scripts/capture-kv-events.py --eviction`). The same prompts go through
//! `llmlb replica-sim`'s engine with the replica's cache shape, one at a time,
//! and both event streams are compared store by store and eviction by
//! eviction. Block hashes differ (vLLM hashes with SHA-256 from a random seed,
//! the simulator with FNV-1a), so each block is named by the tokens of its
//! whole prefix, which both streams carry (the stored tokens and the parent
//! chain).

use std::collections::HashMap;

use llmlb::kv_events::{BlockKey, KvEvent, wire};
use llmlb::replica_sim::engine::{CostModel, Engine, EngineParams, NewRequest};
use serde::Deserialize;

#[derive(Deserialize)]
struct Capture {
    block_size: usize,
    num_gpu_blocks: usize,
    requests: Vec<Request>,
}

#[derive(Deserialize)]
struct Request {
    prompt: Vec<u32>,
    max_tokens: usize,
    cached_tokens: Option<usize>,
}

/// What happened to one block, the block named by its whole prefix's tokens
/// (an index in order of first appearance).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Stored(usize),
    Removed(usize),
}

/// Names blocks by their prefix: the same prefix gets the same index in
/// both streams whatever their hashes.
#[derive(Default)]
struct Names {
    by_prefix: HashMap<Vec<u32>, usize>,
}

impl Names {
    fn name(&mut self, prefix: &[u32]) -> usize {
        let next = self.by_prefix.len();
        *self.by_prefix.entry(prefix.to_vec()).or_insert(next)
    }
}

/// One stream's events as operations on named blocks.
fn ops(events: &[KvEvent], names: &mut Names) -> Vec<Op> {
    let mut prefix_of: HashMap<BlockKey, Vec<u32>> = HashMap::new();
    let mut out = Vec::new();
    for e in events {
        match e {
            KvEvent::BlockStored {
                block_hashes,
                parent_block_hash,
                token_ids,
                block_size,
                ..
            } => {
                let mut prefix = match parent_block_hash {
                    Some(p) => prefix_of
                        .get(p)
                        .unwrap_or_else(|| panic!("parent {p:?} was never stored"))
                        .clone(),
                    None => Vec::new(),
                };
                assert_eq!(token_ids.len(), block_hashes.len() * block_size);
                for (h, tokens) in block_hashes.iter().zip(token_ids.chunks(*block_size)) {
                    prefix.extend_from_slice(tokens);
                    prefix_of.insert(*h, prefix.clone());
                    out.push(Op::Stored(names.name(&prefix)));
                }
            }
            KvEvent::BlockRemoved { block_hashes, .. } => {
                for h in block_hashes {
                    let prefix = prefix_of
                        .get(h)
                        .unwrap_or_else(|| panic!("removed {h:?} was never stored"));
                    out.push(Op::Removed(names.name(prefix)));
                }
            }
            KvEvent::AllBlocksCleared => panic!("no reset in this capture"),
        }
    }
    out
}

fn fixture_path(name: &str) -> String {
    format!(
        "{}/tests/fixtures/kv_events/{name}",
        env!("CARGO_MANIFEST_DIR")
    )
}

fn frames(line: &str) -> Vec<Vec<u8>> {
    line.split(' ')
        .map(|f| match f {
            "-" | "" => Vec::new(),
            hex => (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect(),
        })
        .collect()
}

fn real_events() -> Vec<KvEvent> {
    let text = std::fs::read_to_string(fixture_path("vllm_eviction.hex")).unwrap();
    let mut last_seq = None;
    let mut events = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let msg = wire::decode_frames(&frames(line)).unwrap();
        if let Some(prev) = last_seq {
            assert_eq!(msg.seq, prev + 1, "the capture has no gap");
        }
        last_seq = Some(msg.seq);
        events.extend(msg.batch.events);
    }
    events
}

fn capture() -> Capture {
    let text = std::fs::read_to_string(fixture_path("vllm_eviction_requests.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The simulator's events and each request's cached tokens for the same
/// requests, sent one at a time as the capture sent them.
fn simulated(c: &Capture) -> (Vec<KvEvent>, Vec<usize>) {
    let params = EngineParams {
        block_size: c.block_size,
        num_blocks: c.num_gpu_blocks,
        max_num_seqs: 32,
        max_num_batched_tokens: 2048,
        max_model_len: 2048,
        enable_prefix_caching: true,
        priority_scheduling: false,
    };
    params.validate().unwrap();
    let cost = CostModel {
        step_overhead: 0.001,
        prefill_overhead: 0.0,
        prefill_per_token: 0.0,
        decode_per_seq: 0.0,
        per_context_token: 0.0,
        prefill_attention: 0.0,
        api_per_request: 0.0,
        api_per_output_token: 0.0,
    };
    let mut engine = Engine::new(params, cost, 1);
    engine.record_kv_events();
    let mut events = Vec::new();
    let mut cached = Vec::new();
    let mut now = 0.0;
    for (id, r) in c.requests.iter().enumerate() {
        let req = NewRequest {
            id: id as u64,
            prompt: r.prompt.clone(),
            max_tokens: r.max_tokens,
            priority: 0,
            external_tokens: 0,
        };
        engine.add_request(req, now).unwrap();
        let mut steps = 0;
        while engine.has_work() {
            let out = engine.step(now);
            now = out.end;
            events.extend(engine.take_kv_events());
            for f in &out.finished {
                cached.push(f.cached_tokens);
            }
            steps += 1;
            assert!(steps < 100, "request {id} never finished");
        }
    }
    (events, cached)
}

#[test]
fn the_simulator_stores_and_evicts_as_vllm_does() {
    let c = capture();
    let real = real_events();
    let (sim, cached) = simulated(&c);
    let mut names = Names::default();
    let real_ops = ops(&real, &mut names);
    let sim_ops = ops(&sim, &mut names);
    let removed = real_ops
        .iter()
        .filter(|o| matches!(o, Op::Removed(_)))
        .count();
    assert!(
        removed >= 10,
        "the capture overflows the cache ({removed} evictions)"
    );
    for (i, (r, s)) in real_ops.iter().zip(&sim_ops).enumerate() {
        assert_eq!(
            r,
            s,
            "operation {i} differs: vLLM {r:?}, simulator {s:?}\nvLLM:      {:?}\nsimulator: {:?}",
            &real_ops[i.saturating_sub(3)..(i + 4).min(real_ops.len())],
            &sim_ops[i.saturating_sub(3)..(i + 4).min(sim_ops.len())]
        );
    }
    assert_eq!(real_ops.len(), sim_ops.len(), "as many operations");
    // And so each request found as many prompt tokens in the cache.
    let real_cached: Vec<_> = c.requests.iter().map(|r| r.cached_tokens).collect();
    let sim_cached: Vec<_> = cached.into_iter().map(Some).collect();
    assert_eq!(real_cached, sim_cached);
}

#[test]
fn the_capture_stores_a_recomputed_block_twice() {
    // vLLM does not de-duplicate: a prompt of exactly five blocks sent twice
    // recomputes its last block (one token must be computed) and stores it
    // again beside the cached copy. The simulator must see it in the fixture.
    let mut names = Names::default();
    let real_ops = ops(&real_events(), &mut names);
    let mut seen = std::collections::HashSet::new();
    let twice = real_ops
        .iter()
        .filter_map(|o| match o {
            Op::Stored(n) => Some(*n),
            Op::Removed(_) => None,
        })
        .any(|n| !seen.insert(n));
    assert!(twice, "{real_ops:?}");
}

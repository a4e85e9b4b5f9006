//! Prefix-cache block keys against vLLM's own:
//! `tests/fixtures/block_hashes_vllm.json` holds the block hashes vLLM's
//! request hasher computed for prompts that differ in tokens, LoRA adapter
//! and `cache_salt`, and the per-block `extra_keys` its KV events publish
//! (`scripts/block_hash_fixture.py`). llmlb keys blocks with its own chain;
//! two blocks must get equal llmlb hashes exactly when vLLM's are equal, and
//! a record fed vLLM's events must hold the blocks of the same prompt.

use llmlb::kv_events::subscriber::EventSink;
use llmlb::kv_events::wire::decode_payload;
use llmlb::routing::prefix::blocks::{CacheKey, exact_seed, keyed_hashes};
use llmlb::routing::prefix::held::HeldBlocks;
use rmpv::Value as Mp;
use serde_json::Value;

struct Case {
    name: String,
    tokens: Vec<u32>,
    block_size: usize,
    key: CacheKey,
    vllm: Vec<String>,
    extra_keys: Value,
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string("tests/fixtures/block_hashes_vllm.json").unwrap();
    let f: Value = serde_json::from_str(&text).unwrap();
    f["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| Case {
            name: r["name"].as_str().unwrap().into(),
            tokens: r["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect(),
            block_size: r["block_size"].as_u64().unwrap() as usize,
            key: CacheKey {
                adapter: r["lora_name"].as_str().map(String::from),
                salt: r["cache_salt"].as_str().map(String::from),
            },
            vllm: r["block_hashes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|h| h.as_str().unwrap().into())
                .collect(),
            extra_keys: r["event_extra_keys"].clone(),
        })
        .collect()
}

#[test]
fn blocks_are_shared_exactly_when_vllm_shares_them() {
    let cases = cases();
    assert!(cases.len() >= 8);
    let ours: Vec<Vec<u64>> = cases
        .iter()
        .map(|c| keyed_hashes(exact_seed(), &c.tokens, c.block_size, &c.key))
        .collect();
    let mut pairs = 0;
    let mut shared = 0;
    for (i, a) in cases.iter().enumerate() {
        assert_eq!(ours[i].len(), a.vllm.len(), "{}", a.name);
        for (j, b) in cases.iter().enumerate() {
            for (x, hx) in a.vllm.iter().enumerate() {
                for (y, hy) in b.vllm.iter().enumerate() {
                    let theirs = hx == hy;
                    assert_eq!(
                        ours[i][x] == ours[j][y],
                        theirs,
                        "{} block {x} against {} block {y}",
                        a.name,
                        b.name
                    );
                    pairs += 1;
                    shared += usize::from(theirs && i != j);
                }
            }
        }
    }
    assert!(pairs > 500 && shared > 10, "{pairs} pairs, {shared} shared");
}

/// vLLM's map-layout `BlockStored` of a whole prompt, with its extra keys.
fn event_payload(c: &Case, hashes: &[u64]) -> Vec<u8> {
    let extra = match &c.extra_keys {
        Value::Array(blocks) => Mp::Array(
            blocks
                .iter()
                .map(|keys| match keys {
                    Value::Array(k) => {
                        Mp::Array(k.iter().map(|s| Mp::from(s.as_str().unwrap())).collect())
                    }
                    _ => Mp::Nil,
                })
                .collect(),
        ),
        _ => Mp::Nil,
    };
    let event = Mp::Map(vec![
        (Mp::from("type"), Mp::from("BlockStored")),
        (
            Mp::from("block_hashes"),
            Mp::Array(hashes.iter().map(|&h| Mp::from(h)).collect()),
        ),
        (Mp::from("parent_block_hash"), Mp::Nil),
        (
            Mp::from("token_ids"),
            Mp::Array(c.tokens.iter().map(|&t| Mp::from(t)).collect()),
        ),
        (Mp::from("block_size"), Mp::from(c.block_size as u64)),
        (
            Mp::from("lora_name"),
            c.key.adapter.as_deref().map_or(Mp::Nil, Mp::from),
        ),
        (Mp::from("extra_keys"), extra),
    ]);
    let payload = Mp::Array(vec![Mp::F64(0.0), Mp::Array(vec![event]), Mp::from(0)]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &payload).unwrap();
    out
}

#[test]
fn events_are_held_under_the_key_of_the_prompt_that_stored_them() {
    let cases = cases();
    for c in &cases {
        let h = HeldBlocks::new(100);
        h.caught_up();
        // vLLM's hash values, folded to 64 bits as its integer hashes are.
        let theirs: Vec<u64> = c
            .vllm
            .iter()
            .map(|x| u64::from_str_radix(&x[x.len() - 16..], 16).unwrap())
            .collect();
        let batch = decode_payload(&event_payload(c, &theirs)).unwrap();
        h.apply(&batch);
        for other in &cases {
            let prompt = keyed_hashes(exact_seed(), &other.tokens, other.block_size, &other.key);
            let vllm_shared = c
                .vllm
                .iter()
                .zip(&other.vllm)
                .take_while(|(a, b)| a == b)
                .count();
            assert_eq!(
                h.matched(&prompt),
                vllm_shared,
                "{} stored, {} routed",
                c.name,
                other.name
            );
        }
    }
}

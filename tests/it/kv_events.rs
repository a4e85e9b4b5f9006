//! KV-cache events: decoding frames captured from a real vLLM replica, and
//! the simulator's publisher feeding llmlb's subscriber over real loopback
//! ZMQ sockets (live, replay catch-up, restart).

use crate::common;
use crate::kv_support;

use std::collections::HashSet;
use std::sync::Arc;

use llmlb::kv_events::subscriber::{self, Endpoints, EventSink};
use llmlb::kv_events::wire::{self, END_OF_REPLAY};
use llmlb::kv_events::{BlockKey, KvEvent, Message};
use llmlb::replica_sim::SimHandle;
use llmlb::routing::prefix::blocks::{chained_hashes, exact_seed};
use llmlb::routing::prefix::held::HeldBlocks;
use tokio::sync::watch;

use common::until;
use kv_support::{prompt_hashes, sim_with_events, system};

async fn chat(sim: &SimHandle, system: &str, user: &str) {
    kv_support::chat(sim.addr, &sim.config().model, system, user).await;
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

fn fixture(name: &str) -> Vec<Vec<Vec<u8>>> {
    let path = format!(
        "{}/tests/fixtures/kv_events/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(frames)
        .collect()
}

/// Replay answers: `["", topic, seq, payload]` per batch, then the end marker.
fn replayed(name: &str) -> Vec<Message> {
    let mut lines = fixture(name);
    let end = lines.pop().unwrap();
    assert_eq!(end.len(), 4, "end marker frames");
    assert!(end[0].is_empty() && end[1].is_empty() && end[3].is_empty());
    assert_eq!(end[2], END_OF_REPLAY);
    lines
        .iter()
        .map(|f| {
            assert!(f[0].is_empty(), "the delimiter frame");
            wire::decode_frames(&f[1..]).unwrap()
        })
        .collect()
}

#[test]
fn real_vllm_frames_decode() {
    let live: Vec<Message> = fixture("vllm_live.hex")
        .iter()
        .map(|f| wire::decode_frames(f).unwrap())
        .collect();
    let seqs: Vec<u64> = live.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, (1..=7).collect::<Vec<_>>());
    let (mut stored, mut removed) = (0, 0);
    for m in &live {
        assert_eq!(m.topic, b"kv");
        assert_eq!(m.batch.dp_rank, Some(0));
        assert!(m.batch.ts > 1.7e9, "a unix timestamp");
        for e in &m.batch.events {
            match e {
                KvEvent::BlockStored {
                    block_hashes,
                    token_ids,
                    block_size,
                    medium,
                    lora_name,
                    ..
                } => {
                    stored += 1;
                    assert_eq!(*block_size, 128, "vLLM's CPU block size");
                    assert_eq!(token_ids.len(), 128 * block_hashes.len());
                    assert_eq!(medium.as_deref(), Some("GPU"));
                    assert_eq!(lora_name, &None);
                }
                KvEvent::BlockRemoved { block_hashes, .. } => removed += block_hashes.len(),
                KvEvent::AllBlocksCleared => panic!("not in this capture"),
            }
        }
    }
    assert_eq!((stored, removed), (7, 40));
    // The replay endpoint resends the same bytes.
    let again = replayed("vllm_replay_from5.hex");
    assert_eq!(
        again.iter().map(|m| m.seq).collect::<Vec<_>>(),
        vec![5, 6, 7]
    );
    for m in &again {
        assert_eq!(Some(m), live.iter().find(|l| l.seq == m.seq));
    }
}

/// The whole history (sequences 0 to 7) into an index: it holds exactly the
/// blocks stored and not removed, and the prompt stored first, evicted and
/// stored again maps to the same llmlb hashes both times.
#[test]
fn real_history_builds_the_index() {
    let all = replayed("vllm_replay_from0_frames.hex");
    assert_eq!(
        all.iter().map(|m| m.seq).collect::<Vec<_>>(),
        (0..=7).collect::<Vec<_>>()
    );
    let held = HeldBlocks::new(10_000);
    held.caught_up();
    let mut theirs: HashSet<BlockKey> = HashSet::new();
    for m in &all {
        held.apply(&m.batch);
        for e in &m.batch.events {
            match e {
                KvEvent::BlockStored { block_hashes, .. } => theirs.extend(block_hashes),
                KvEvent::BlockRemoved { block_hashes, .. } => {
                    for h in block_hashes {
                        theirs.remove(h);
                    }
                }
                KvEvent::AllBlocksCleared => theirs.clear(),
            }
        }
    }
    let s = held.summary();
    assert!(s.known);
    assert_eq!(s.blocks, theirs.len());
    assert_eq!(s.block_size, Some(128));
    let first = match &all[0].batch.events[0] {
        KvEvent::BlockStored { token_ids, .. } => token_ids.clone(),
        e => panic!("{e:?}"),
    };
    let ours = chained_hashes(exact_seed(), &first, 128);
    assert_eq!(ours.len(), 2);
    assert_eq!(held.matched(&ours), 2, "re-stored at sequence 7");
}

fn endpoints(sim: &SimHandle) -> Endpoints {
    Endpoints {
        events: format!("tcp://{}", sim.kv_events.unwrap()),
        replay: sim.kv_replay.map(|r| format!("tcp://{r}")),
    }
}

/// A fresh index fed by a subscriber to `sim`'s events; send `true` to stop it.
fn subscribe(sim: &SimHandle) -> (Arc<HeldBlocks>, watch::Sender<bool>) {
    let held = Arc::new(HeldBlocks::new(10_000));
    let (stop, rx) = watch::channel(false);
    let sink: Arc<dyn EventSink> = held.clone();
    tokio::spawn(subscriber::run(endpoints(sim), sink, rx));
    (held, stop)
}

#[tokio::test]
async fn sim_events_keep_the_index_exact_and_a_late_subscriber_catches_up() {
    let sim = sim_with_events(true, 400, None).await;
    let bs = sim.config().engine.block_size;
    let (early, stop_early) = subscribe(&sim);
    until("the early subscriber knows the (empty) cache", || {
        early.summary().known
    })
    .await;
    for i in 0..4 {
        chat(&sim, &system(i), "first question").await;
    }
    let want = prompt_hashes(&system(2), "another question", bs);
    until("the early subscriber saw the prompts", || {
        early.matched(&want) >= 8
    })
    .await;
    // Everything but the last, partial block of the system prompt and the
    // user turn is held: the run stops where the prompts differ.
    let full = prompt_hashes(&system(2), "first question", bs);
    let shared = want.iter().zip(&full).take_while(|(a, b)| a == b).count();
    assert_eq!(early.matched(&want), shared);
    // A subscriber started now catches up through the replay endpoint.
    let (late, stop_late) = subscribe(&sim);
    until("the late subscriber caught up", || {
        late.summary().known && late.snapshot() == early.snapshot()
    })
    .await;
    assert_eq!(late.matched(&want), shared);
    let _ = stop_early.send(true);
    let _ = stop_late.send(true);
    sim.shutdown().await;
}

#[tokio::test]
async fn evictions_reach_the_index_and_a_restart_empties_it() {
    // A small cache: 4 distinct long prompts do not fit together.
    let sim = sim_with_events(false, 40, None).await;
    let bs = sim.config().engine.block_size;
    let (held, stop) = subscribe(&sim);
    until("subscribed", || held.summary().subscriptions > 0).await;
    chat(&sim, &system(0), "q").await;
    let first = prompt_hashes(&system(0), "q", bs);
    until("stored", || held.matched(&first) > 0).await;
    for i in 1..6 {
        chat(&sim, &system(i), "q").await;
    }
    until("evicted", || held.matched(&first) == 0).await;
    assert!(
        held.summary().blocks <= 39,
        "never more than the replica holds"
    );
    // The replica restarts on the same ports: its sequence starts at 0
    // again, which empties the index (the new process's cache is empty).
    let events = sim.kv_events.unwrap();
    let before = held.summary().blocks;
    assert!(before > 0);
    sim.shutdown().await;
    let sim = sim_with_events(false, 40, Some(events)).await;
    let last = prompt_hashes(&system(5), "q", bs);
    // The subscriber notices the lost connection and subscribes again.
    until("subscribed again", || held.summary().subscriptions >= 2).await;
    chat(&sim, &system(7), "q").await;
    let after = prompt_hashes(&system(7), "q", bs);
    until("events of the new process", || held.matched(&after) > 0).await;
    assert_eq!(held.matched(&last), 0, "what the old process held is gone");
    assert!(held.summary().known);
    stop.send(true).unwrap();
    sim.shutdown().await;
}

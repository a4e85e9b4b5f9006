//! Helpers shared by the KV-event tests: simulated replicas that publish
//! their cache events on loopback, prompts, and the hashes `exact` mode
//! gives them.

#![allow(dead_code)]

use std::net::SocketAddr;

use llmlb::replica_sim::{KvEventsAddrs, SimConfig, SimHandle};
use llmlb::routing::prefix::blocks::{Prompt, chained_hashes, exact_seed, prompt_token_ids};
use llmlb::tokenize::{ChatMessage, PromptTokenizer};
use tokio::net::TcpListener;

use crate::common;

/// A `fast` replica with `blocks` KV blocks, publishing events (and
/// serving replay when asked) on free loopback ports, or on `events` when given.
pub async fn sim_with_events(replay: bool, blocks: usize, events: Option<SocketAddr>) -> SimHandle {
    let mut config = SimConfig::profile("fast").unwrap();
    config.engine.num_blocks = blocks;
    config.engine.max_model_len = config
        .engine
        .max_model_len
        .min((blocks - 1) * config.engine.block_size);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let kv = KvEventsAddrs {
        events: events.unwrap_or(any),
        replay: replay.then_some(any),
    };
    llmlb::replica_sim::spawn_with_kv_events(listener, config, kv)
        .await
        .unwrap()
}

/// A system prompt of about 16 blocks of 16 tokens, distinct per `i`.
pub fn system(i: usize) -> String {
    format!("System prompt number {i}: answer about topic {i} carefully. ").repeat(12)
}

pub fn chat_body(model: &str, system: &str, user: &str) -> String {
    serde_json::json!({
        "model": model,
        "max_tokens": 2,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    })
    .to_string()
}

/// Sends a chat request straight to `addr`; returns the `x-llmlb-replica`
/// header when there is one.
pub async fn chat(addr: SocketAddr, model: &str, system: &str, user: &str) -> Option<String> {
    let body = chat_body(model, system, user);
    let (status, headers, body) =
        common::call(addr, common::chat_request("/v1/chat/completions", &body)).await;
    assert_eq!(status, 200, "{body:?}");
    headers
        .get("x-llmlb-replica")
        .map(|v| v.to_str().unwrap().to_string())
}

/// `exact` mode's block hashes of a chat prompt.
pub fn prompt_hashes(system: &str, user: &str, block_size: usize) -> Vec<u64> {
    let messages = vec![
        ChatMessage::new("system", system),
        ChatMessage::new("user", user),
    ];
    chained_hashes(
        exact_seed(),
        &prompt_token_ids(&PromptTokenizer::StandIn, Prompt::Chat(&messages)),
        block_size,
    )
}

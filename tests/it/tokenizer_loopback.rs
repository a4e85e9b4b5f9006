//! The model tokenizer on loopback: `llmlb replica-sim --tokenizer` reports the
//! Python `tokenizers` package's prompt token counts in `usage`, and a pool
//! with `[pools.tokenizer]` charges token rate limits with the same counts.

use crate::common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};

use common::*;
use http::StatusCode;
use llmlb::tokenize::{ChatMessage, PromptTokenizer};
use serde_json::{Value, json};
use std::path::Path;

const TINY_LLAMA: &str = "../shared/tokenizers/tiny-llama";

fn fixture() -> Value {
    let text = std::fs::read_to_string("tests/fixtures/tokenizer_tiny_llama.json").unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Kills the simulator process this test started when the test ends.
struct Sim(Child);

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `llmlb replica-sim --profile vllm-cpu-tiny --tokenizer DIR` on a free port.
fn start_sim() -> (Sim, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_llmlb"))
        .args([
            "replica-sim",
            "--profile",
            "vllm-cpu-tiny",
            "--time-scale",
            "20",
        ])
        .args(["--port", "0", "--model", "tiny", "--tokenizer", TINY_LLAMA])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let sim = Sim(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .parse()
        .unwrap();
    (sim, addr)
}

async fn usage(addr: SocketAddr, path: &str, body: Value) -> Value {
    let mut req = chat_request(path, &body.to_string());
    *req.uri_mut() = format!("http://{addr}{path}").parse().unwrap();
    let (status, _, bytes) = call(addr, req).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&bytes)
    );
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    v["usage"].clone()
}

#[tokio::test]
async fn sim_with_tokenizer_reports_the_reference_prompt_tokens() {
    let (_sim, addr) = start_sim();
    let f = fixture();
    for case in f["chats"].as_array().unwrap() {
        let body = json!({"model": "tiny", "messages": case["messages"], "max_tokens": 1});
        let u = usage(addr, "/v1/chat/completions", body).await;
        assert_eq!(u["prompt_tokens"], case["count"], "{}", case["name"]);
    }
    for case in f["texts"].as_array().unwrap() {
        let body = json!({"model": "tiny", "prompt": case["text"], "max_tokens": 1});
        let u = usage(addr, "/v1/completions", body).await;
        assert_eq!(u["prompt_tokens"], case["count"], "{}", case["text"]);
    }
    // A template that refuses the request is a 400, as on vLLM; here the
    // content has a shape no template accepts.
    let body = json!({"model": "tiny", "messages": [{"role": "user", "content": 5}]});
    let mut req = chat_request("/v1/chat/completions", &body.to_string());
    *req.uri_mut() = format!("http://{addr}/v1/chat/completions")
        .parse()
        .unwrap();
    let (status, _, _) = call(addr, req).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

/// The remaining-tokens header after one request, which was charged its
/// prompt tokens plus `max_tokens` up front.
async fn charged(extra: &str, body: &str) -> u32 {
    let up = Upstream::start("a", Mode::Json).await;
    let key = llmlb::gateway::keys::hash_key("sk-t");
    let text = format!(
        "[[tiers]]\nname = \"std\"\npriority = \"low\"\n[[keys]]\nsha256 = \"{key}\"\ntenant = \"t\"\ntier = \"std\"\ntokens_per_minute = 100000\n{}",
        one_pool("least_tokens", &[(&up.url(), 1)], extra)
    );
    let lb = start_llmlb(&text).await;
    let mut r = chat_request("/v1/chat/completions", body);
    r.headers_mut()
        .insert("authorization", "Bearer sk-t".parse().unwrap());
    let (status, h, _) = call(lb.addr, r).await;
    assert_eq!(status, StatusCode::OK);
    let left: u32 = h["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    lb.shutdown().await;
    100_000 - left
}

#[tokio::test]
async fn pool_tokenizer_counts_feed_the_token_rate_limit() {
    let f = fixture();
    let case = f["chats"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "unicode")
        .unwrap();
    let count = case["count"].as_u64().unwrap() as u32;
    let body =
        json!({"model": "llama-3-8b", "messages": case["messages"], "max_tokens": 200}).to_string();
    let with_model = charged(&format!("[pools.tokenizer]\ndir = \"{TINY_LLAMA}\""), &body).await;
    // The bucket refills a little between the charge and the header.
    assert!(
        (count + 200 - 5..=count + 200).contains(&with_model),
        "charged {with_model}, want {}",
        count + 200
    );
    let stand_in = charged("", &body).await;
    assert_ne!(stand_in, with_model, "the stand-in estimate differs");

    // A prompt over 1 KiB is tokenized on the blocking pool: same count.
    let long = "Parcels leave the depot at six; drivers sign each one out. ".repeat(400);
    let messages = vec![
        ChatMessage::new("system", long.clone()),
        ChatMessage::new("user", "When?"),
    ];
    let model = PromptTokenizer::load(Path::new(TINY_LLAMA)).unwrap();
    let count = model.encode_chat(&messages).unwrap().len() as u32;
    let body = json!({"model": "llama-3-8b", "max_tokens": 10,
        "messages": [{"role": "system", "content": long}, {"role": "user", "content": "When?"}]})
    .to_string();
    let charged_long = charged(&format!("[pools.tokenizer]\ndir = \"{TINY_LLAMA}\""), &body).await;
    assert!(
        (count + 10 - 5..=count + 10).contains(&charged_long),
        "charged {charged_long}, want {}",
        count + 10
    );
}

/// A request without `max_tokens` is charged its prompt plus the pool's
/// `balancing.default_max_tokens`.
#[tokio::test]
async fn the_token_charge_uses_the_pools_default_output_allowance() {
    let body = r#"{"model":"llama-3-8b","messages":[{"role":"user","content":"how many pallets are left?"}]}"#;
    let default = charged("", body).await;
    let small = charged("[pools.balancing]\ndefault_max_tokens = 40", body).await;
    // Same prompt: the charges differ by the two allowances (256 and 40),
    // give or take what the bucket refills between charge and header.
    let difference = default as i64 - small as i64;
    assert!((211..=221).contains(&difference), "{difference}");
}

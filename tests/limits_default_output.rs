//! A request that sets no `max_tokens` is charged its prompt plus the
//! pool's `balancing.default_max_tokens` against its key's token limit.

mod common;

use common::*;
use http::StatusCode;

/// The remaining-tokens header after one request without `max_tokens`, in a
/// pool configured with `extra`.
async fn remaining_after_one(extra: &str) -> u32 {
    let up = Upstream::start("a", Mode::Json).await;
    let key = llmlb::gateway::keys::hash_key("sk-d");
    let text = format!(
        "[[tiers]]\nname = \"std\"\npriority = \"low\"\n[[keys]]\nsha256 = \"{key}\"\ntenant = \"t\"\ntier = \"std\"\ntokens_per_minute = 100000\n{}",
        one_pool("least_tokens", &[(&up.url(), 1)], extra)
    );
    let lb = start_llmlb(&text).await;
    let body = r#"{"model":"llama-3-8b","messages":[{"role":"user","content":"how many pallets are left?"}]}"#;
    let mut r = chat_request("/v1/chat/completions", body);
    r.headers_mut()
        .insert("authorization", "Bearer sk-d".parse().unwrap());
    let (status, h, _) = call(lb.addr, r).await;
    assert_eq!(status, StatusCode::OK);
    let left = h["x-ratelimit-remaining-tokens"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    lb.shutdown().await;
    left
}

#[tokio::test]
async fn the_charge_uses_the_pools_default_output_allowance() {
    let default = remaining_after_one("").await;
    let small = remaining_after_one("[pools.balancing]\ndefault_max_tokens = 40").await;
    // Same prompt: the charges differ by the two allowances (256 and 40).
    assert_eq!(small - default, 256 - 40);
}

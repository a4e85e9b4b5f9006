//! Token accounting counts tokens: a client's absurd `max_tokens` is capped
//! at the pool's `max_model_len` for charging and balancing, and settlement
//! uses the `usage` the replica reports.

use crate::common::*;

const KEY: &str = "sk-tokens-0001";
const ABSURD: &str = r#"{"model":"llama-3-8b","stream":true,"messages":[{"role":"user","content":"hi"}],"max_tokens":1000000000}"#;

fn config(up: &Upstream) -> String {
    let digest = llmlb::gateway::keys::hash_key(KEY);
    format!(
        "[gateway]\nauth = true\n[[tiers]]\nname = \"t\"\npriority = \"high\"\n\
         [[keys]]\nsha256 = \"{digest}\"\ntenant = \"acme\"\ntier = \"t\"\ntokens_per_minute = 20000\n\
         [[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\nbalancer = \"least_tokens\"\n\
         [pools.balancing]\nmax_model_len = 4096\n\
         [[pools.replicas]]\nurl = \"{}\"\n",
        up.url()
    )
}

fn keyed(body: &str) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    let mut req = chat_request("/v1/chat/completions", body);
    req.headers_mut()
        .insert("authorization", format!("Bearer {KEY}").parse().unwrap());
    req
}

#[tokio::test]
async fn an_absurd_max_tokens_is_charged_at_most_max_model_len_and_settled_by_usage() {
    let up = Upstream::start("a", Mode::Json).await;
    let lb = start_llmlb(&config(&up)).await;
    // Charged at most 4096 up front and settled at the reported usage (10):
    // several such requests fit in 20000 tokens a minute.
    for i in 0..6 {
        let (status, _, text) = call(lb.addr, keyed(ABSURD)).await;
        assert_eq!(
            status,
            200,
            "request {i}: {}",
            String::from_utf8_lossy(&text)
        );
    }
    assert_eq!(up.requests(), 6);
}

#[tokio::test]
async fn least_tokens_sees_at_most_max_model_len_for_an_absurd_request() {
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let lb = start_llmlb(&config(&up)).await;
    let held = tokio::spawn(call(lb.addr, keyed(ABSURD)));
    until("stream open", || up.requests() == 1).await;
    let replica = lb.state.topology().pools()[0].replicas[0].clone();
    until("prefill done", || replica.outstanding_tokens() < 4096).await;
    assert!(replica.outstanding_tokens() > 0);
    up.release_one();
    assert_eq!(held.await.unwrap().0, 200);
}

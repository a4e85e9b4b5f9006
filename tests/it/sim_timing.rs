//! When the simulator's bytes leave, measured on a paused tokio clock (the
//! simulator's virtual time), not on the wall clock: a chat stream's opening
//! role chunk waits for prefill, as it does on vLLM, while the response
//! headers leave at once.

use crate::sim_support;

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use llmlb::tokenize::stand_in::{count_tokens, render_chat};
use serde_json::{Value, json};
use sim_support::*;
use tokio::time::Instant;

/// A replica whose prefill is slow enough to see: 1 ms per prompt token.
fn slow_prefill() -> llmlb::replica_sim::SimConfig {
    let mut c = fast();
    c.cost.prefill_per_token = 0.001;
    c
}

/// Sends one streaming request and returns, in virtual seconds after the
/// send, when the headers arrived and when each body frame arrived, with the
/// frames' bytes.
async fn timed_stream(addr: std::net::SocketAddr, body: Value) -> (f64, Vec<(f64, Bytes)>) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = http::Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let t0 = Instant::now();
    let resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let headers_at = t0.elapsed().as_secs_f64();
    let mut body = resp.into_body();
    let mut frames = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            frames.push((t0.elapsed().as_secs_f64(), data));
        }
    }
    (headers_at, frames)
}

#[tokio::test(start_paused = true)]
async fn role_chunk_waits_for_prefill() {
    let config = slow_prefill();
    let per_token = config.cost.prefill_per_token;
    let sim = start(config).await;
    let question = "Which replica holds the longest cached prefix of this prompt? ".repeat(20);
    let prompt_tokens = count_tokens(&render_chat([("user", question.as_str())]));
    let prefill = prompt_tokens as f64 * per_token;
    assert!(prefill > 0.2, "the prompt is long enough to see prefill");

    let (headers_at, frames) = timed_stream(
        sim.addr,
        json!({"model": "llmlb-sim", "messages": [{"role": "user", "content": question}],
               "max_tokens": 3, "stream": true}),
    )
    .await;

    // Headers leave before any engine work.
    assert!(headers_at < prefill / 10.0, "headers at {headers_at} s");
    // The first body bytes are the role chunk, and they leave only once
    // the whole prompt was prefilled and the first token exists.
    let (first_at, first) = &frames[0];
    let text = String::from_utf8_lossy(first);
    assert!(text.starts_with("data: "), "{text}");
    assert!(text.contains(r#""role":"assistant""#), "{text}");
    assert!(
        *first_at >= prefill,
        "role chunk at {first_at} s, prefill takes {prefill} s"
    );
    // The role chunk and the first token go out in the same step.
    let all: String = frames
        .iter()
        .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
        .collect();
    let events = sse_events(&all);
    assert_eq!(events.len(), 1 + 3, "role and three tokens");
    let first_token_at = frames
        .iter()
        .find(|(_, b)| {
            let s = String::from_utf8_lossy(b);
            s.matches("data: ").count() > 1 || !s.contains(r#""role""#)
        })
        .map(|(t, _)| *t)
        .expect("a token frame");
    assert!(
        first_token_at - first_at < Duration::from_millis(1).as_secs_f64() + f64::EPSILON,
        "role at {first_at} s, first token at {first_token_at} s"
    );
    sim.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn non_streaming_answer_is_unchanged() {
    let sim = start(slow_prefill()).await;
    let body = post_json(
        sim.addr,
        "/v1/chat/completions",
        json!({"model": "llmlb-sim", "messages": [{"role": "user", "content": "hi"}],
               "max_tokens": 2}),
    )
    .await;
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["usage"]["completion_tokens"], 2);
    sim.shutdown().await;
}

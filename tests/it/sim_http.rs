//! The simulator over real HTTP on loopback: OpenAI SSE format, usage,
//! prefix-cache accounting, `/metrics`, and abort on disconnect.

use crate::sim_support;

use std::time::Duration;

use llmlb::tokenize::stand_in::{count_tokens, render_chat, tokenize};
use serde_json::json;
use sim_support::*;
use tokio::io::AsyncReadExt;

#[tokio::test]
async fn chat_stream_is_openai_sse_with_usage() {
    let sim = start(fast()).await;
    let (status, text) = post(
        sim.addr,
        "/v1/chat/completions",
        json!({"model": "llmlb-sim", "messages": [{"role": "user", "content": "Say hi"}],
               "max_tokens": 7, "stream": true, "stream_options": {"include_usage": true}}),
    )
    .await;
    assert_eq!(status, 200);
    let events = sse_events(&text);
    assert_eq!(events.len(), 1 + 7 + 1, "role, 7 tokens, usage");
    let id = events[0]["id"].as_str().unwrap();
    assert!(id.starts_with("chatcmpl-"));
    for e in &events {
        assert_eq!(e["id"], id);
        assert_eq!(e["object"], "chat.completion.chunk");
        assert_eq!(e["model"], "llmlb-sim");
    }
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let content: String = events[1..8]
        .iter()
        .map(|e| e["choices"][0]["delta"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(count_tokens(&content), 7);
    assert!(
        events[1..7]
            .iter()
            .all(|e| e["choices"][0]["finish_reason"].is_null())
    );
    assert_eq!(events[7]["choices"][0]["finish_reason"], "length");
    let usage = &events[8]["usage"];
    assert_eq!(events[8]["choices"], json!([]));
    let prompt = render_chat([("user", "Say hi")]);
    assert_eq!(usage["prompt_tokens"], count_tokens(&prompt));
    assert_eq!(usage["completion_tokens"], 7);
    assert_eq!(usage["total_tokens"], count_tokens(&prompt) + 7);
    sim.shutdown().await;
}

#[tokio::test]
async fn completion_stream_without_usage_ends_with_done() {
    let sim = start(fast()).await;
    let (status, text) = complete(
        sim.addr,
        json!({"prompt": "Once upon a time", "max_tokens": 3, "stream": true}),
    )
    .await;
    assert_eq!(status, 200);
    let events = sse_events(&text);
    assert_eq!(events.len(), 3);
    assert!(
        events
            .iter()
            .all(|e| e["object"] == "text_completion" && e.get("usage").is_none())
    );
    assert_eq!(events[2]["choices"][0]["finish_reason"], "length");
    sim.shutdown().await;
}

#[tokio::test]
async fn usage_counts_match_and_second_prompt_is_cached() {
    let sim = start(fast()).await;
    let prompt = "The balancer reads every replica's queue and cache before it routes. ".repeat(12);
    let n = count_tokens(&prompt);
    let body = json!({"prompt": prompt, "max_tokens": 5});
    let first = complete_json(sim.addr, body.clone()).await;
    assert_eq!(first["object"], "text_completion");
    assert_eq!(first["usage"]["prompt_tokens"], n);
    assert_eq!(first["usage"]["completion_tokens"], 5);
    assert_eq!(first["usage"]["total_tokens"], n + 5);
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    assert_eq!(
        count_tokens(first["choices"][0]["text"].as_str().unwrap()),
        5
    );
    let second = complete_json(sim.addr, body).await;
    assert_eq!(
        second["usage"]["prompt_tokens_details"]["cached_tokens"],
        (n - 1) / 16 * 16
    );
    assert_eq!(
        second["choices"][0]["text"], first["choices"][0]["text"],
        "same prompt, same filler"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn shared_system_prompt_is_a_shared_prefix_over_http() {
    let sim = start(fast()).await;
    let system = "You answer questions about load balancing for LLM inference fleets. ".repeat(6);
    let ask = |q: &str| {
        json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": q}],
               "max_tokens": 2})
    };
    post_json(sim.addr, "/v1/chat/completions", ask("What is a KV cache?")).await;
    let r = post_json(
        sim.addr,
        "/v1/chat/completions",
        ask("Why route by prefix?"),
    )
    .await;
    let a = tokenize(&render_chat([
        ("system", system.as_str()),
        ("user", "What is a KV cache?"),
    ]));
    let b = tokenize(&render_chat([
        ("system", system.as_str()),
        ("user", "Why route by prefix?"),
    ]));
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    assert_eq!(
        r["usage"]["prompt_tokens_details"]["cached_tokens"],
        shared / 16 * 16
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn metrics_parse_and_move_with_traffic() {
    let sim = start(fast()).await;
    let before = scrape(sim.addr).await;
    assert_eq!(metric(&before, "vllm:generation_tokens_total", &[]), 0.0);
    assert_eq!(
        metric(
            &before,
            "vllm:cache_config_info",
            &[("block_size", "16"), ("num_gpu_blocks", "1024")]
        ),
        1.0
    );
    let prompt = "Tell me about continuous batching in one sentence. ".repeat(4);
    let n = count_tokens(&prompt) as f64;
    let mut tasks = Vec::new();
    for _ in 0..6 {
        let addr = sim.addr;
        let p = prompt.clone();
        tasks.push(tokio::spawn(async move {
            complete_json(addr, json!({"prompt": p, "max_tokens": 4, "stream": false})).await
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let m = scrape(sim.addr).await;
    let model = [("model_name", "llmlb-sim"), ("engine", "0")];
    assert_eq!(metric(&m, "vllm:generation_tokens_total", &model), 24.0);
    assert_eq!(metric(&m, "vllm:prompt_tokens_total", &model), 6.0 * n);
    assert_eq!(metric(&m, "vllm:request_success_total", &LENGTH), 6.0);
    assert_eq!(metric(&m, "vllm:prefix_cache_queries_total", &[]), 6.0 * n);
    assert!(
        metric(&m, "vllm:prefix_cache_hits_total", &[]) > 0.0,
        "identical prompts hit"
    );
    assert_eq!(
        metric(&m, "vllm:time_to_first_token_seconds_count", &[]),
        6.0
    );
    assert_eq!(
        metric(&m, "vllm:inter_token_latency_seconds_count", &[]),
        18.0
    );
    assert_eq!(
        metric(&m, "vllm:e2e_request_latency_seconds_count", &[]),
        6.0
    );
    assert_eq!(
        metric(
            &m,
            "vllm:e2e_request_latency_seconds_bucket",
            &[("le", "+Inf")]
        ),
        6.0
    );
    assert!(metric(&m, "vllm:time_to_first_token_seconds_sum", &[]) > 0.0);
    assert_eq!(metric(&m, "vllm:request_prompt_tokens_sum", &[]), 6.0 * n);
    assert_eq!(metric(&m, "vllm:request_generation_tokens_sum", &[]), 24.0);
    assert_eq!(metric(&m, "vllm:request_params_max_tokens_sum", &[]), 24.0);
    assert_eq!(
        metric(&m, "vllm:request_time_per_output_token_seconds_count", &[]),
        6.0
    );
    assert!(metric(&m, "vllm:iteration_tokens_total_count", &[]) >= 4.0);
    let hits = metric(&m, "vllm:prefix_cache_hits_total", &[]);
    assert_eq!(
        metric(
            &m,
            "vllm:prompt_tokens_by_source_total",
            &[("source", "local_cache_hit")]
        ),
        hits
    );
    assert_eq!(
        metric(
            &m,
            "vllm:prompt_tokens_by_source_total",
            &[("source", "local_compute")]
        ),
        6.0 * n - hits
    );
    assert_eq!(metric(&m, "vllm:num_requests_running", &[]), 0.0);
    assert_eq!(metric(&m, "vllm:kv_cache_usage_perc", &[]), 0.0);
    // Buckets are cumulative.
    let mut buckets: Vec<(f64, f64)> = m
        .iter()
        .filter(|((name, _), _)| name == "vllm:inter_token_latency_seconds_bucket")
        .map(|((_, labels), v)| {
            let le = &labels.iter().find(|(k, _)| k == "le").unwrap().1;
            (
                if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().unwrap()
                },
                *v,
            )
        })
        .collect();
    buckets.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    assert_eq!(buckets.len(), 20);
    assert!(buckets.windows(2).all(|w| w[0].1 <= w[1].1));
    sim.shutdown().await;
}

#[tokio::test]
async fn preemption_under_kv_pressure_is_counted_and_everyone_finishes() {
    let mut cfg = fast();
    cfg.engine.num_blocks = 13;
    cfg.engine.max_model_len = 192;
    let sim = start(cfg).await;
    let mut tasks = Vec::new();
    for i in 0..6 {
        let addr = sim.addr;
        tasks.push(tokio::spawn(async move {
            let prompt =
                format!("request {i} ") + &"with a body long enough to fill blocks ".repeat(6);
            complete_json(addr, json!({"prompt": prompt, "max_tokens": 100})).await
        }));
    }
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(r["usage"]["completion_tokens"], 100);
    }
    let m = scrape(sim.addr).await;
    assert!(metric(&m, "vllm:num_preemptions_total", &[]) >= 1.0);
    assert_eq!(metric(&m, "vllm:request_success_total", &LENGTH), 6.0);
    sim.shutdown().await;
}

#[tokio::test]
async fn client_disconnect_aborts_and_frees_blocks() {
    let sim = start(fast()).await;
    let mut conn = raw_post(
        sim.addr,
        "/v1/completions",
        &json!({"prompt": "A long answer please. ".repeat(20), "max_tokens": 3000, "stream": true}),
    )
    .await;
    // Read until the first token event has arrived.
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("\"text\"") {
        let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "connection closed early");
        seen.extend_from_slice(&buf[..n]);
    }
    assert_eq!(sim.stats().num_running, 1);
    assert!(sim.stats().free_blocks < 1023);
    drop(conn);
    eventually("the request is aborted", || {
        let s = sim.stats();
        s.num_running == 0 && s.finished[2] == 1
    })
    .await;
    let s = sim.stats();
    assert_eq!(s.free_blocks, 1023, "every usable block is free again");
    assert!(
        s.aborted_blocks_freed >= 7,
        "the prompt's blocks were freed: {}",
        s.aborted_blocks_freed
    );
    let m = scrape(sim.addr).await;
    assert_eq!(
        metric(
            &m,
            "vllm:request_success_total",
            &[("finished_reason", "abort")]
        ),
        1.0
    );
    assert_eq!(metric(&m, "vllm:kv_cache_usage_perc", &[]), 0.0);
    sim.shutdown().await;
}

#[tokio::test]
async fn models_errors_and_limits() {
    let sim = start(fast()).await;
    let (status, text) = request(sim.addr, "GET", "/v1/models", None).await;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["data"][0]["id"], "llmlb-sim");
    let (status, text) = complete(sim.addr, json!({"model": "gpt-9", "prompt": "x"})).await;
    assert_eq!(status, 404);
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(v["error"]["message"].as_str().unwrap().contains("gpt-9"));
    for key in ["message", "type", "param", "code"] {
        assert!(v["error"].get(key).is_some(), "{key}");
    }
    let (status, text) = complete(sim.addr, json!({"prompt": "x", "max_tokens": 5000})).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("maximum context length"));
    let (status, _) = request(sim.addr, "GET", "/v1/completions", None).await;
    assert_eq!(status, 405);
    let (status, _) = request(sim.addr, "GET", "/nope", None).await;
    assert_eq!(status, 404);
    let (status, _) = post(
        sim.addr,
        "/v1/chat/completions",
        json!({"messages": "nope"}),
    )
    .await;
    assert_eq!(status, 400);
    sim.shutdown().await;
}

#[tokio::test]
async fn non_streaming_client_that_leaves_is_aborted_too() {
    let sim = start(fast()).await;
    let conn = raw_post(
        sim.addr,
        "/v1/completions",
        &json!({"prompt": "Take your time. ".repeat(10), "max_tokens": 3000}),
    )
    .await;
    eventually("the request runs", || sim.stats().generation_tokens >= 3).await;
    drop(conn);
    eventually("the request is aborted", || {
        let s = sim.stats();
        s.num_running == 0 && s.finished[2] == 1
    })
    .await;
    assert_eq!(sim.stats().free_blocks, 1023);
    assert!(sim.stats().generation_tokens < 3000);
    sim.shutdown().await;
}

#[tokio::test]
async fn priority_field_orders_the_queue_when_enabled() {
    let mut cfg = fast();
    cfg.engine.priority_scheduling = true;
    cfg.engine.max_num_seqs = 1;
    cfg.time_scale = 0.2; // the first request holds the only slot for a while
    let sim = start(cfg).await;
    let addr = sim.addr;
    let send = move |prompt: &'static str, priority: i64, max_tokens: u32| {
        tokio::spawn(async move {
            complete_json(
                addr,
                json!({"prompt": prompt, "max_tokens": max_tokens, "priority": priority}),
            )
            .await;
            tokio::time::Instant::now()
        })
    };
    let first = send("occupy the engine", 0, 40);
    eventually("the first request runs", || sim.stats().num_running == 1).await;
    let low = send("low priority", 5, 20);
    eventually("one waits", || sim.stats().num_waiting == 1).await;
    let high = send("high priority", -1, 2);
    eventually("two wait", || sim.stats().num_waiting == 2).await;
    let (_, low_done, high_done) = (
        first.await.unwrap(),
        low.await.unwrap(),
        high.await.unwrap(),
    );
    assert!(
        high_done < low_done,
        "priority -1 is served before priority 5"
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn a_follow_up_turn_hits_on_the_previous_answer() {
    let sim = start(fast()).await;
    let system = "You help operators size LLM fleets.";
    let question = "How many replicas do I need for 50 requests per second?";
    let first = post_json(
        sim.addr,
        "/v1/chat/completions",
        json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
               "max_tokens": 40}),
    )
    .await;
    let answer = first["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .to_string();
    let second = post_json(
        sim.addr,
        "/v1/chat/completions",
        json!({"messages": [{"role": "system", "content": system}, {"role": "user", "content": question},
                            {"role": "assistant", "content": answer}, {"role": "user", "content": "And for 100?"}],
               "max_tokens": 4}),
    )
    .await;
    // The first turn's prompt and all but its last generated token are in
    // the cache: every full block of them is a hit.
    let computed = first["usage"]["prompt_tokens"].as_u64().unwrap() + 40 - 1;
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert_eq!(
        cached,
        computed / 16 * 16,
        "first turn {first}, second {second}"
    );
    sim.shutdown().await;
}

/// Two replicas started with the same seed (the default) hand out
/// different response ids: ids from a fleet of simulators never collide.
#[tokio::test]
async fn replicas_with_the_same_seed_hand_out_different_ids() {
    assert_eq!(fast().seed, fast().seed);
    let (a, b) = (start(fast()).await, start(fast()).await);
    let body = json!({"model": "llmlb-sim", "messages": [{"role": "user", "content": "hi"}],
                      "max_tokens": 2});
    let mut ids = std::collections::HashSet::new();
    for _ in 0..3 {
        for sim in [&a, &b] {
            let answer = post_json(sim.addr, "/v1/chat/completions", body.clone()).await;
            let id = answer["id"].as_str().unwrap().to_owned();
            assert!(ids.insert(id.clone()), "{id} handed out twice");
        }
    }
}

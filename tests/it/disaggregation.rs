//! Prefill/decode disaggregation through llmlb, against simulated replicas
//! playing vLLM's roles (`llmlb sim --role prefill|decode`) on loopback:
//! the two-step protocol round trip, answers equal to an aggregated
//! replica's, prefill failures retried and fallen back, a decode failure
//! never generating twice, a client leaving aborting whichever side runs,
//! and the per-request decision.

use crate::common;

use common::*;
use llmlb::replica_sim::faults::FaultPatch;
use llmlb::replica_sim::{Role, SimConfig, SimHandle};
use serde_json::Value;
use tokio::net::TcpListener;

const MODEL: &str = "llmlb-sim";

fn replica_config(role: Role) -> SimConfig {
    let mut c = SimConfig::profile("fast").unwrap();
    c.seed = 7;
    c.disaggregation.role = role;
    c
}

async fn replica(config: SimConfig) -> SimHandle {
    llmlb::replica_sim::spawn(TcpListener::bind("127.0.0.1:0").await.unwrap(), config)
}

/// A decode pool `chat` over `decode` and its prefill pool over `prefill`
/// (URLs), with extra `[pools.disaggregation]` keys.
fn pair_config(decode: &[String], prefill: &[String], extra: &str) -> String {
    let mut s = format!(
        "[server]\nreplica_header = true\n\
         [[pools]]\nname = \"chat\"\nmodels = [\"{MODEL}\"]\nbalancer = \"round_robin\"\n\
         [pools.disaggregation]\nprefill_pool = \"chat-prefill\"\n{extra}\n"
    );
    for u in decode {
        s.push_str(&format!("[[pools.replicas]]\nurl = \"{u}\"\n"));
    }
    s.push_str(
        "[[pools]]\nname = \"chat-prefill\"\nrole = \"prefill\"\nbalancer = \"round_robin\"\n",
    );
    for u in prefill {
        s.push_str(&format!("[[pools.replicas]]\nurl = \"{u}\"\n"));
    }
    s
}

/// llmlb in front of the pair (see [`pair_config`]).
async fn front(
    decode: &[&SimHandle],
    prefill: &[&SimHandle],
    extra: &str,
) -> llmlb::daemon::Running {
    let urls = |hs: &[&SimHandle]| hs.iter().map(|h| url(h)).collect::<Vec<_>>();
    start_llmlb(&pair_config(&urls(decode), &urls(prefill), extra)).await
}

fn url(h: &SimHandle) -> String {
    format!("http://{}", h.addr)
}

/// A completion prompt of `words` distinct words.
fn prompt(words: usize, tag: &str) -> String {
    (0..words)
        .map(|i| format!("{tag}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn completion(prompt: &str, max_tokens: u32, stream: bool) -> String {
    serde_json::json!({
        "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": stream,
        "stream_options": {"include_usage": true},
    })
    .to_string()
}

/// The text of a completion answer, streamed or not, and its usage.
fn text_and_usage(body: &[u8]) -> (String, Value) {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        let text = v["choices"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        return (text, v["usage"].clone());
    }
    let mut text = String::new();
    let mut usage = Value::Null;
    for line in String::from_utf8_lossy(body).lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        if let Some(t) = v["choices"][0]["text"].as_str() {
            text.push_str(t);
        }
        if !v["usage"].is_null() {
            usage = v["usage"].clone();
        }
    }
    (text, usage)
}

fn finished(h: &SimHandle) -> u64 {
    h.stats().finished.iter().sum()
}

#[tokio::test]
async fn the_two_steps_answer_what_one_aggregated_replica_answers() {
    let prefill = replica(replica_config(Role::Prefill)).await;
    let decode = replica(replica_config(Role::Decode)).await;
    let alone = replica(replica_config(Role::Both)).await;
    let lb = front(&[&decode], &[&prefill], "when = \"always\"").await;
    let text = prompt(300, "w");
    for (i, stream) in [false, true].into_iter().enumerate() {
        let body = completion(&format!("{text} {i}"), 24, stream);
        let (status, headers, through) =
            call(lb.addr, chat_request("/v1/completions", &body)).await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&through));
        assert_eq!(headers["x-llmlb-replica"], decode.addr.to_string());
        let (_, _, direct) = call(alone.addr, chat_request("/v1/completions", &body)).await;
        let (got, usage) = text_and_usage(&through);
        let (want, direct_usage) = text_and_usage(&direct);
        assert_eq!(got, want, "stream = {stream}");
        assert!(!got.is_empty());
        // The decode replica loaded every prompt token but the last from
        // the prefill replica: it reports them as cached.
        let prompt_tokens = usage["prompt_tokens"].as_u64().unwrap();
        assert_eq!(
            prompt_tokens,
            direct_usage["prompt_tokens"].as_u64().unwrap()
        );
        assert_eq!(
            usage["prompt_tokens_details"]["cached_tokens"].as_u64(),
            Some(prompt_tokens - 1),
            "{usage}"
        );
        assert_eq!(usage["completion_tokens"], 24);
    }
    // The prefill replica ran each request for one token; the decode
    // replica ran each once.
    let p = prefill.stats();
    assert_eq!((finished(&prefill), p.generation_tokens), (2, 2));
    assert_eq!(
        (finished(&decode), decode.stats().generation_tokens),
        (2, 48)
    );
    let m = metrics_text(lb.admin_addr).await;
    assert_eq!(
        metric_value(
            &m,
            "llmlb_disaggregation_decisions_total",
            &[("pool", "chat"), ("branch", "always")]
        ),
        2.0
    );
    assert_eq!(
        metric_value(
            &m,
            "llmlb_prefill_attempts_total",
            &[("pool", "chat-prefill"), ("outcome", "ok")]
        ),
        2.0
    );
    assert_eq!(
        metric_value(
            &m,
            "llmlb_disaggregation_phase_seconds_count",
            &[("phase", "prefill")]
        ),
        2.0
    );
}

#[tokio::test]
async fn a_failed_prefill_moves_to_another_prefill_replica_then_falls_back() {
    let mut broken = replica_config(Role::Prefill);
    broken.faults.error_rate = 1.0;
    let bad = replica(broken).await;
    let good = replica(replica_config(Role::Prefill)).await;
    let decode = replica(replica_config(Role::Decode)).await;
    let lb = front(&[&decode], &[&bad, &good], "when = \"always\"").await;
    let text = prompt(200, "f");
    // Round-robin sends one of these two to the failing replica first.
    for i in 0..2 {
        let body = completion(&format!("{text} {i}"), 8, false);
        let (status, _, answer) = call(lb.addr, chat_request("/v1/completions", &body)).await;
        assert_eq!(status, 200);
        let (_, usage) = text_and_usage(&answer);
        assert!(
            usage["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap()
                > 100
        );
    }
    let m = metrics_text(lb.admin_addr).await;
    let attempts = |outcome| {
        metric_value(
            &m,
            "llmlb_prefill_attempts_total",
            &[("pool", "chat-prefill"), ("outcome", outcome)],
        )
    };
    assert_eq!((attempts("status"), attempts("ok")), (1.0, 2.0));
    // Both prefill replicas failing: the decode replica prefills itself.
    good.set_faults(&FaultPatch {
        error_rate: Some(1.0),
        ..FaultPatch::default()
    })
    .unwrap();
    let body = completion(&prompt(200, "g"), 8, true);
    let (status, _, answer) = call(lb.addr, chat_request("/v1/completions", &body)).await;
    assert_eq!(status, 200);
    let (text, usage) = text_and_usage(&answer);
    assert!(!text.is_empty());
    assert_eq!(
        usage["prompt_tokens_details"]["cached_tokens"], 0,
        "{usage}"
    );
    let m = metrics_text(lb.admin_addr).await;
    let branch = |b| metric_value(&m, "llmlb_disaggregation_decisions_total", &[("branch", b)]);
    assert_eq!((branch("always"), branch("fallback")), (2.0, 1.0));
    assert_eq!(finished(&decode), 3);
}

#[tokio::test]
async fn without_fallback_a_failed_prefill_is_the_clients_error() {
    let mut broken = replica_config(Role::Prefill);
    broken.faults.error_rate = 1.0;
    let bad = replica(broken).await;
    let decode = replica(replica_config(Role::Decode)).await;
    let lb = front(&[&decode], &[&bad], "when = \"always\"\nfallback = false").await;
    let body = completion(&prompt(50, "n"), 8, false);
    let (status, _, answer) = call(lb.addr, chat_request("/v1/completions", &body)).await;
    assert_eq!(status, 502, "{}", String::from_utf8_lossy(&answer));
    assert_eq!(error_code(&answer), "upstream_unavailable");
    assert_eq!(finished(&decode), 0);
}

#[tokio::test]
async fn a_decode_that_fails_after_its_prefill_is_not_generated_again() {
    let prefill = replica(replica_config(Role::Prefill)).await;
    let mut broken = replica_config(Role::Decode);
    broken.faults.error_rate = 1.0;
    let bad = replica(broken).await;
    let other = replica(replica_config(Role::Decode)).await;
    let lb = front(&[&bad, &other], &[&prefill], "when = \"always\"").await;
    let text = prompt(100, "d");
    let mut failed = 0;
    for i in 0..2 {
        let body = completion(&format!("{text} {i}"), 8, true);
        let (status, headers, _) = call(lb.addr, chat_request("/v1/completions", &body)).await;
        if status == 500 {
            failed += 1;
            assert_eq!(headers["x-llmlb-replica"], bad.addr.to_string());
        } else {
            assert_eq!(status, 200);
        }
    }
    // One request met the failing decode replica: its answer is the
    // client's; neither its prefill nor its decode ran again elsewhere.
    assert_eq!(failed, 1);
    assert_eq!(finished(&prefill), 2);
    assert_eq!(finished(&other), 1);
    assert_eq!(finished(&bad), 0);
}

#[tokio::test]
async fn a_client_that_leaves_during_the_prefill_aborts_it_and_skips_the_decode() {
    let mut slow = replica_config(Role::Prefill);
    slow.faults.slowdown = 10_000.0;
    // Prefilled in chunks: the first step ends long after the client left
    // (an engine counts a request finished when its last step starts).
    slow.engine.max_num_batched_tokens = 32;
    let prefill = replica(slow).await;
    let decode = replica(replica_config(Role::Decode)).await;
    let lb = front(&[&decode], &[&prefill], "when = \"always\"").await;
    let mut conn = Conn::open(lb.addr).await;
    let body = completion(&prompt(100, "c"), 8, true);
    let pending = tokio::spawn(async move {
        let _ = conn.send(chat_request("/v1/completions", &body)).await;
    });
    until("the prefill to run", || prefill.stats().num_running == 1).await;
    pending.abort();
    until("the prefill to be aborted", || {
        prefill.stats().finished[2] == 1
    })
    .await;
    let topology = lb.state.topology();
    let p = &topology.pools()[1];
    until("the prefill replica's load to be released", || {
        p.replicas[0].in_flight() == 0
    })
    .await;
    assert_eq!(finished(&decode), 0);
    assert_eq!(decode.stats().num_running + decode.stats().num_waiting, 0);
}

#[tokio::test]
async fn a_client_that_leaves_during_the_decode_aborts_it() {
    let prefill = replica(replica_config(Role::Prefill)).await;
    let mut slow = replica_config(Role::Decode);
    slow.faults.slowdown = 200.0;
    let decode = replica(slow).await;
    let lb = front(&[&decode], &[&prefill], "when = \"always\"").await;
    let mut conn = Conn::open(lb.addr).await;
    let body = completion(&prompt(100, "e"), 200, true);
    let resp = conn.send(chat_request("/v1/completions", &body)).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    use http_body_util::BodyExt;
    body.frame().await.unwrap().unwrap();
    drop(body);
    conn.close();
    until("the decode to be aborted", || {
        decode.stats().finished[2] == 1
    })
    .await;
    assert_eq!(finished(&prefill), 1);
}

#[tokio::test]
async fn auto_keeps_short_prompts_on_the_decode_replica() {
    let prefill = replica(replica_config(Role::Prefill)).await;
    let decode = replica(replica_config(Role::Decode)).await;
    let lb = front(
        &[&decode],
        &[&prefill],
        "min_uncached_tokens = 400\nbusy_prefills = 0",
    )
    .await;
    for (words, tag) in [(10, "s"), (800, "l")] {
        let body = completion(&prompt(words, tag), 4, false);
        let (status, _, _) = call(lb.addr, chat_request("/v1/completions", &body)).await;
        assert_eq!(status, 200);
    }
    assert_eq!(
        finished(&prefill),
        1,
        "only the long prompt was prefilled apart"
    );
    assert_eq!(finished(&decode), 2);
    let m = metrics_text(lb.admin_addr).await;
    let branch = |b| metric_value(&m, "llmlb_disaggregation_decisions_total", &[("branch", b)]);
    assert_eq!((branch("short"), branch("long")), (1.0, 1.0));
}

#[tokio::test]
async fn replicas_refuse_the_side_they_do_not_play() {
    let prefill = replica(replica_config(Role::Prefill)).await;
    let decode = replica(replica_config(Role::Decode)).await;
    let ask = |side: &str| {
        serde_json::json!({
            "model": MODEL, "prompt": "hello", "max_tokens": 1,
            "kv_transfer_params": {side: true},
        })
        .to_string()
    };
    let (status, _, body) = call(
        prefill.addr,
        chat_request("/v1/completions", &ask("do_remote_prefill")),
    )
    .await;
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));
    let (status, _, _) = call(
        decode.addr,
        chat_request("/v1/completions", &ask("do_remote_decode")),
    )
    .await;
    assert_eq!(status, 400);
    let (status, _, body) = call(
        prefill.addr,
        chat_request("/v1/completions", &ask("do_remote_decode")),
    )
    .await;
    assert_eq!(status, 200);
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["kv_transfer_params"]["do_remote_prefill"], true);
    assert_eq!(v["kv_transfer_params"]["remote_port"], prefill.addr.port());
}

#[tokio::test]
async fn the_doctor_probes_both_sides_of_the_protocol() {
    use llmlb::doctor::{Options, Severity, Topic};
    let opts = Options {
        request_timeout: std::time::Duration::from_secs(30),
        ..Options::default()
    };
    let prefill = replica(replica_config(Role::Prefill)).await;
    let decode = replica(replica_config(Role::Decode)).await;
    let text = pair_config(&[url(&decode)], &[url(&prefill)], "");
    let config = llmlb::config::parse(&text).unwrap();
    let report = llmlb::doctor::run(&config, &opts).await;
    let findings: Vec<_> = report
        .replicas
        .iter()
        .flat_map(|r| r.findings.iter().map(move |f| (r.pool.as_str(), f)))
        .filter(|(_, f)| f.topic == Topic::Disaggregation)
        .collect();
    assert_eq!(findings.len(), 2, "{report:?}");
    assert!(
        findings.iter().all(|(_, f)| f.severity == Severity::Ok),
        "{findings:?}"
    );
    assert!(
        findings
            .iter()
            .any(|(pool, f)| *pool == "chat" && f.message.contains("arrived cached")),
        "{findings:?}"
    );
    // The prefill pool is probed with the model of the pool it serves.
    assert!(!report.has_error(Topic::Model), "{report:?}");
    // A replica playing the wrong side is named.
    let wrong = replica(replica_config(Role::Decode)).await;
    let text = pair_config(&[url(&decode)], &[url(&wrong)], "");
    let report = llmlb::doctor::run(&llmlb::config::parse(&text).unwrap(), &opts).await;
    assert!(report.has_error(Topic::Disaggregation), "{report:?}");
}

#[test]
fn fleet_sim_models_a_disaggregated_pool_as_configured() {
    let text = pair_config(
        &["http://127.0.0.1:1".to_string()],
        &[
            "http://127.0.0.1:2".to_string(),
            "http://127.0.0.1:3".to_string(),
        ],
        "",
    );
    let config = llmlb::config::parse(&text).unwrap();
    let decider = llmlb::fleet_sim::decide::Decider::new(&config, MODEL, 1).unwrap();
    // The decode pool's replicas first, then its prefill pool's.
    assert_eq!((decider.fleet_size(), decider.decode_replicas()), (3, 1));
    let prefill = decider.prefill_pool().expect("the prefill pool");
    assert!(std::sync::Arc::ptr_eq(decider.pool_at(1), prefill));
    assert!(std::sync::Arc::ptr_eq(decider.pool_at(0), decider.pool()));
    // Resized as a plan tries splits.
    let bigger = llmlb::fleet_sim::decide::resized_prefill(&config, MODEL, 4).unwrap();
    let decider = llmlb::fleet_sim::decide::Decider::new(&bigger, MODEL, 1).unwrap();
    assert_eq!(decider.fleet_size(), 5);
}

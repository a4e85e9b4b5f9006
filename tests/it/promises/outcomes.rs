//! Every request ends in exactly one outcome, counted once in
//! `llmlb_requests_total`: answered (by status), refused (by status, and
//! by reason in `llmlb_rejections_total`), or closed by the client
//! (`status="499"`).

use std::time::Duration;

use rand::{Rng, SeedableRng};

use crate::common::*;
use crate::sim_support;

fn total(text: &str, status: &str) -> f64 {
    metric_value(text, "llmlb_requests_total", &[("status", status)])
}

/// A replica's JSON answer carries `content-length` (as vLLM's does); the
/// body ends with its last byte and must count as answered.
#[tokio::test]
async fn finished_json_answers_count_as_200_not_499() {
    let sim = sim_support::start(sim_support::fast()).await;
    let lb = start_llmlb(&format!(
        "[[pools]]\nname = \"llama\"\nmodels = [\"llmlb-sim\"]\n\
         [[pools.replicas]]\nurl = \"http://{}\"\n",
        sim.addr
    ))
    .await;
    let body =
        r#"{"model":"llmlb-sim","messages":[{"role":"user","content":"hi"}],"max_tokens":4}"#;
    for _ in 0..3 {
        let (status, headers, _) = call(lb.addr, chat_request("/v1/chat/completions", body)).await;
        assert_eq!(status, 200);
        assert!(headers.contains_key("content-length"));
    }
    let mut text = String::new();
    for _ in 0..100 {
        text = metrics_text(lb.admin_addr).await;
        if total(&text, "200") + total(&text, "499") >= 3.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(total(&text, "200"), 3.0, "{text}");
    assert_eq!(total(&text, "499"), 0.0, "{text}");
}

/// N requests into an overloaded pool (one slot, a short queue), a seeded
/// share of whose clients give up at a random moment: llmlb's request
/// counter adds up to N.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_is_counted_exactly_once_under_overload_and_disconnects() {
    const N: usize = 60;
    let sim = sim_support::start(sim_support::fast()).await;
    let lb = start_llmlb(&format!(
        "[[pools]]\nname = \"llama\"\nmodels = [\"llmlb-sim\"]\nmax_inflight = 1\n\
         [pools.queue]\nmax_depth = 4\nmax_wait = \"60s\"\n\
         [[pools.replicas]]\nurl = \"http://{}\"\n",
        sim.addr
    ))
    .await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(17);
    let mut tasks = Vec::new();
    for i in 0..N {
        let stream = i % 2 == 0;
        // The first client takes the one slot with a long stream (about 2 s
        // of 2 ms steps) and leaves after 100 ms: at least one client
        // surely goes away mid-answer, however fast the machine.
        let max_tokens = if i == 0 { 1000 } else { 24 };
        let body = format!(
            r#"{{"model":"llmlb-sim","stream":{stream},"messages":[{{"role":"user","content":"hello {i}"}}],"max_tokens":{max_tokens}}}"#
        );
        // A third of the others leave after 0–60 ms: while queued, before
        // headers, or mid-stream.
        let give_up = if i == 0 {
            Some(Duration::from_millis(100))
        } else {
            (rng.random_range(0..3) == 0).then(|| Duration::from_millis(rng.random_range(0..60)))
        };
        let addr = lb.addr;
        tasks.push(tokio::spawn(async move {
            // The whole request is written before the client may leave, so
            // llmlb has received every one of the N.
            let raw = format!(
                "POST /v1/chat/completions HTTP/1.1\r\nhost: llmlb.test\r\nconnection: close\r\n\
                 content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            let limit = give_up.unwrap_or(Duration::from_secs(20));
            raw_exchange(addr, raw.as_bytes(), false, limit).await
        }));
        if i == 0 {
            let lb = &lb;
            until_async(
                "the first request holds the slot",
                Duration::from_secs(5),
                async || lb.state.topology().pools()[0].replicas[0].in_flight() == 1,
            )
            .await;
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut counted = 0.0;
    let mut text = String::new();
    for _ in 0..500 {
        text = metrics_text(lb.admin_addr).await;
        counted = metric_value(&text, "llmlb_requests_total", &[]);
        if counted >= N as f64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| {
            l.starts_with("llmlb_requests_total") || l.starts_with("llmlb_rejections_total")
        })
        .collect();
    assert_eq!(
        counted, N as f64,
        "answered + refused + client-closed = N: {lines:#?}"
    );
    assert_eq!(
        metric_value(&text, "llmlb_rejections_total", &[]),
        total(&text, "429"),
        "each refusal (a full queue: 429) has its reason: {lines:#?}"
    );
    let text = metrics_text(lb.admin_addr).await;
    assert!(total(&text, "499") >= 1.0, "some clients left: {text}");
    assert!(
        metric_value(&text, "llmlb_rejections_total", &[]) >= 1.0,
        "the short queue refused some: {text}"
    );
}

/// A client that leaves while queued gets its rate-limit charge back.
#[tokio::test]
async fn a_client_leaving_the_queue_is_counted_and_refunded() {
    const KEY: &str = "sk-queue-0001";
    let up = Upstream::start("a", Mode::StreamHeld).await;
    let digest = llmlb::gateway::keys::hash_key(KEY);
    let lb = start_llmlb(&format!(
        "[gateway]\nauth = true\n[[tiers]]\nname = \"t\"\npriority = \"high\"\n\
         [[keys]]\nsha256 = \"{digest}\"\ntenant = \"acme\"\ntier = \"t\"\nrequests_per_minute = 2\n\
         [[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\nmax_inflight = 1\n\
         [[pools.replicas]]\nurl = \"{}\"\n",
        up.url()
    ))
    .await;
    let keyed = || {
        let mut req = chat_request("/v1/chat/completions", CHAT_STREAM);
        req.headers_mut()
            .insert("authorization", format!("Bearer {KEY}").parse().unwrap());
        req
    };
    let queued = || queue_depths(&lb).iter().sum::<usize>();
    let first = tokio::spawn(call(lb.addr, keyed()));
    until("first dispatched", || up.requests() == 1).await;
    let mut leaving = Conn::open(lb.addr).await;
    let pending = tokio::spawn(async move {
        let _ = leaving.send(keyed()).await;
    });
    until("second queued", || queued() == 1).await;
    pending.abort();
    until("second left the queue", || queued() == 0).await;
    let mut text = String::new();
    for _ in 0..200 {
        text = metrics_text(lb.admin_addr).await;
        if total(&text, "499") >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(total(&text, "499"), 1.0, "{text}");
    // Two requests a minute: the one that left was given back, so a third
    // is admitted (it queues) instead of getting 429.
    let third = tokio::spawn(call(lb.addr, keyed()));
    until("third queued", || queued() == 1).await;
    up.release_one();
    assert_eq!(first.await.unwrap().0, 200);
    until("third dispatched", || up.requests() == 2).await;
    up.release_one();
    assert_eq!(third.await.unwrap().0, 200);
}

/// llmlb in front of one `fast` simulated replica.
async fn behind_sim() -> (llmlb::replica_sim::SimHandle, llmlb::daemon::Running) {
    let sim = sim_support::start(sim_support::fast()).await;
    let lb = start_llmlb(&format!(
        "[[pools]]\nname = \"llama\"\nmodels = [\"llmlb-sim\"]\n\
         [[pools.replicas]]\nurl = \"http://{}\"\n",
        sim.addr
    ))
    .await;
    (sim, lb)
}

/// Every answer from a replica has a first byte, streamed or not (a JSON
/// answer's only frame is also its last).
#[tokio::test]
async fn every_answer_counts_its_first_byte() {
    let (_sim, lb) = behind_sim().await;
    for stream in [false, false, false, true, true] {
        let body = format!(
            r#"{{"model":"llmlb-sim","messages":[{{"role":"user","content":"hi"}}],"max_tokens":3,"stream":{stream}}}"#
        );
        let (status, _, _) = call(lb.addr, chat_request("/v1/chat/completions", &body)).await;
        assert_eq!(status, 200);
    }
    let mut text = String::new();
    for _ in 0..100 {
        text = metrics_text(lb.admin_addr).await;
        if total(&text, "200") >= 5.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(total(&text, "200"), 5.0, "{text}");
    let count = |name: &str| sample(&text, &format!("{name}{{pool=\"llama\"}}"));
    assert_eq!(
        count("llmlb_time_to_first_byte_seconds_count"),
        5.0,
        "{text}"
    );
    assert_eq!(count("llmlb_request_duration_seconds_count"), 5.0, "{text}");
}

/// A client that closes its connection as soon as `data: [DONE]` arrives
/// got the whole stream: counted 200, not 499, even though the replica's
/// last (empty) chunk had not come yet.
#[tokio::test]
async fn a_stream_closed_by_the_client_at_done_is_complete() {
    let (_sim, lb) = behind_sim().await;
    let mut conn = Conn::open(lb.addr).await;
    let req = http::Request::post("/v1/chat/completions")
        .header("host", "llmlb.test")
        .header("content-type", "application/json")
        // The replica waits 150 ms before each frame and before its end.
        .header("x-sim-fault", "slow=150")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            r#"{"model":"llmlb-sim","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"stream":true}"#,
        )))
        .unwrap();
    let resp = conn.send(req).await;
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let mut seen = Vec::new();
    while !seen.ends_with(b"data: [DONE]\n\n") {
        let frame = http_body_util::BodyExt::frame(&mut body)
            .await
            .expect("the stream goes on to [DONE]")
            .unwrap();
        seen.extend_from_slice(&frame.into_data().unwrap_or_default());
    }
    drop(body);
    conn.close();
    let mut text = String::new();
    for _ in 0..100 {
        text = metrics_text(lb.admin_addr).await;
        if total(&text, "200") + total(&text, "499") >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(total(&text, "200"), 1.0, "{text}");
    assert_eq!(total(&text, "499"), 0.0, "{text}");
}

//! Deadline admission (`ttft_objective` on a priority level) through a real
//! llmlb in front of a real simulated replica, both on 127.0.0.1 port 0: an
//! overload that arrives all at once, after the queue learned its drain rate
//! from a few served requests and saw a flood of requests the replica
//! refused as bad (which must not make the fleet look faster).
//!
//! Nothing here asserts a speed. The counts say who was admitted and who was
//! refused; the one timing relation is the product's own promise, each
//! admitted request's time to first token against the objective, checked
//! with room for a noisy machine (at most one in ten over) and against a
//! control run without the objective, where most of the same burst is over.

use crate::common;
use crate::sim_support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use http::StatusCode;
use http_body_util::BodyExt;

const OBJECTIVE: Duration = Duration::from_secs(2);
/// Requests in the burst: many times what one objective's worth of drain holds.
const BURST: usize = 60;
/// The replica's batch and llmlb's `max_inflight`.
const SLOTS: usize = 4;

/// One simulated replica whose requests take about 20 decode steps of
/// 20 ms: about 0.4 s each, four at a time.
fn replica_config() -> llmlb::replica_sim::SimConfig {
    let mut sim = sim_support::fast();
    sim.model = "llama-3-8b".into();
    sim.engine.max_num_seqs = SLOTS;
    sim.cost.step_overhead = 0.02;
    sim
}

fn proxy_config(replica: SocketAddr, objective: Option<Duration>) -> String {
    let objective = objective.map_or(String::new(), |o| {
        format!("ttft_objective = \"{}ms\"\n", o.as_millis())
    });
    format!(
        "[[priorities]]\nname = \"only\"\nmax_wait = \"60s\"\n{objective}\
         [[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\nmax_inflight = {SLOTS}\n\
         [pools.queue]\nmax_depth = 512\ntimeout = \"60s\"\n\
         [[pools.replicas]]\nurl = \"http://{replica}\"\n"
    )
}

const STREAM: &str = r#"{"model":"llama-3-8b","stream":true,"messages":[{"role":"user","content":"tell me a story"}],"max_tokens":20}"#;
/// `n = 2`: the replica refuses it at once (400), a client error.
const REFUSED_BY_REPLICA: &str =
    r#"{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"n":2}"#;

/// What one request of the burst got.
#[derive(Debug)]
enum Answer {
    /// Streamed to the end; time to the first chunk.
    Served(Duration),
    /// 429, with its error code and `Retry-After` seconds.
    Refused(String, Option<u64>),
    Other(StatusCode),
}

async fn stream_one(addr: SocketAddr) -> Answer {
    let mut conn = Conn::open(addr).await;
    let sent = Instant::now();
    let resp = conn
        .send(chat_request("/v1/chat/completions", STREAM))
        .await;
    let status = resp.status();
    if status == StatusCode::TOO_MANY_REQUESTS {
        let retry = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.parse().ok());
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        return Answer::Refused(error_code(&body), retry);
    }
    if status != StatusCode::OK {
        return Answer::Other(status);
    }
    let mut body = resp.into_body();
    let mut ttft = None;
    let mut tail = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            ttft.get_or_insert_with(|| sent.elapsed());
            tail = data.to_vec();
        }
    }
    assert!(tail.ends_with(b"data: [DONE]\n\n"), "a complete stream");
    Answer::Served(ttft.expect("a first chunk"))
}

/// Warms the queue up, floods it with requests the replica refuses, then
/// sends the burst all at once; returns every burst request's answer.
async fn overload(objective: Option<Duration>) -> Vec<Answer> {
    let sim = sim_support::start(replica_config()).await;
    let lb = start_llmlb(&proxy_config(sim.addr, objective)).await;
    // Two rounds of served requests teach the queue its service time.
    for _ in 0..2 {
        let round: Vec<_> = (0..SLOTS)
            .map(|_| tokio::spawn(stream_one(lb.addr)))
            .collect();
        for h in round {
            assert!(matches!(h.await.unwrap(), Answer::Served(_)));
        }
    }
    // Forty requests the replica answers 400 at once: their short holds
    // must not count as service.
    for _ in 0..40 {
        let (status, _, _) = call(
            lb.addr,
            chat_request("/v1/chat/completions", REFUSED_BY_REPLICA),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }
    let burst: Vec<_> = (0..BURST)
        .map(|_| tokio::spawn(stream_one(lb.addr)))
        .collect();
    let mut answers = Vec::new();
    for h in burst {
        answers.push(
            tokio::time::timeout(Duration::from_secs(60), h)
                .await
                .expect("every burst request ends")
                .unwrap(),
        );
    }
    lb.shutdown().await;
    sim.shutdown().await;
    answers
}

fn served(answers: &[Answer]) -> Vec<Duration> {
    answers
        .iter()
        .filter_map(|a| match a {
            Answer::Served(t) => Some(*t),
            _ => None,
        })
        .collect()
}

fn over_objective(ttfts: &[Duration]) -> usize {
    ttfts.iter().filter(|t| **t > OBJECTIVE).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sudden_overload_is_admitted_only_as_far_as_the_objective_holds() {
    let answers = overload(Some(OBJECTIVE)).await;
    let ttfts = served(&answers);
    let mut refused = 0;
    for a in &answers {
        match a {
            Answer::Served(_) => {}
            Answer::Refused(code, retry) => {
                refused += 1;
                assert_eq!(code, "over_objective");
                assert!(retry.is_some_and(|s| s >= 1), "Retry-After {retry:?}");
            }
            Answer::Other(status) => panic!("unexpected {status}"),
        }
    }
    // The slots free at once, and the queue keeps what drains in time:
    // more than the slots, far fewer than the burst.
    assert!(ttfts.len() > SLOTS, "admitted {}", ttfts.len());
    assert!(refused >= BURST / 3, "refused {refused} of {BURST}");
    let late = over_objective(&ttfts);
    let slowest = ttfts.iter().max().copied().unwrap_or_default();
    eprintln!(
        "burst of {BURST}: {} admitted ({late} over the objective, slowest first chunk {slowest:?}), {refused} refused",
        ttfts.len()
    );
    assert!(
        late * 10 <= ttfts.len(),
        "{late} of {} admitted over the objective: {ttfts:?}",
        ttfts.len()
    );

    // Control: the same burst without the objective is all admitted, and
    // most of it misses the objective the first run held.
    let control = overload(None).await;
    let all = served(&control);
    eprintln!(
        "without the objective: {} admitted, {} over the objective",
        all.len(),
        over_objective(&all)
    );
    assert_eq!(all.len(), BURST, "{control:?}");
    assert!(
        over_objective(&all) * 2 > BURST,
        "{} of {BURST} over the objective without deadline admission",
        over_objective(&all)
    );
}

//! `llmlb bench` end to end against a small SSE server on loopback that
//! streams a fixed number of chunks, split across frames, with short gaps.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use serde_json::Value;
use tokio::net::TcpListener;

use llmlb::bench::workload::{ChatOptions, LenRange, RandomOptions, TraceOptions, WorkloadSpec};
use llmlb::bench::{Arrivals, BenchError, BenchSpec, Outcome, run};

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// Stream every chunk, usage, [DONE].
    Ok,
    /// Answer every third request (1st, 4th, ...) with 429.
    RejectEveryThird,
    /// Send one chunk, then nothing for a long time.
    Stall,
    /// One chunk, then an error event.
    ErrorEvent,
    /// Chunks but no usage chunk and no [DONE].
    Truncated,
}

#[derive(Clone)]
struct Server {
    url: String,
    seen: Arc<Mutex<Vec<(String, Value)>>>,
}

const GAP: Duration = Duration::from_millis(2);

fn event(data: String) -> Vec<Bytes> {
    // Each event arrives in two frames, cut inside the JSON.
    let whole = format!("data: {data}\n\n");
    let cut = whole.len() / 2;
    vec![
        Bytes::copy_from_slice(&whole.as_bytes()[..cut]),
        Bytes::copy_from_slice(&whole.as_bytes()[cut..]),
    ]
}

fn sse(chat: bool, tokens: u64, mode: Mode) -> BoxBody<Bytes, Infallible> {
    let mut events: Vec<String> = (0..tokens)
        .map(|i| {
            if chat {
                format!(r#"{{"choices":[{{"index":0,"delta":{{"content":" w{i}"}}}}]}}"#)
            } else {
                format!(r#"{{"choices":[{{"index":0,"text":" w{i}"}}]}}"#)
            }
        })
        .collect();
    if chat {
        events.insert(
            0,
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#.into(),
        );
    }
    match mode {
        Mode::Stall | Mode::ErrorEvent => events.truncate(if chat { 2 } else { 1 }),
        _ => {}
    }
    match mode {
        Mode::ErrorEvent => events.push(
            r#"{"error":{"message":"replica lost","type":"server_error","param":null,"code":"x"}}"#
                .into(),
        ),
        Mode::Ok | Mode::RejectEveryThird => {
            events.push(format!(
                r#"{{"choices":[],"usage":{{"prompt_tokens":3,"completion_tokens":{tokens},"total_tokens":{}}}}}"#,
                tokens + 3
            ));
            events.push("[DONE]".into());
        }
        Mode::Stall | Mode::Truncated => {}
    }
    let stall = mode == Mode::Stall;
    let stream = futures_util::stream::unfold(
        (events.into_iter(), 0usize),
        move |(mut it, i)| async move {
            let ev = it.next()?;
            if i > 0 {
                tokio::time::sleep(GAP).await;
            }
            Some((ev, (it, i + 1)))
        },
    );
    let frames = futures_util::StreamExt::flat_map(stream, |ev| {
        futures_util::stream::iter(event(ev).into_iter().map(|b| Ok(Frame::data(b))))
    });
    let tail = futures_util::stream::unfold(stall, |stall| async move {
        if stall {
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
        None::<(Result<Frame<Bytes>, Infallible>, bool)>
    });
    BodyExt::boxed(StreamBody::new(futures_util::StreamExt::chain(
        frames, tail,
    )))
}

async fn start(mode: Mode) -> Server {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let server = Server {
        url,
        seen: seen.clone(),
    };
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let seen = seen.clone();
            let service = service_fn(move |req: Request<Incoming>| {
                let seen = seen.clone();
                async move {
                    let path = req.uri().path().to_owned();
                    let body = req.into_body().collect().await.unwrap().to_bytes();
                    let json: Value = serde_json::from_slice(&body).unwrap();
                    let n = {
                        let mut s = seen.lock().unwrap();
                        s.push((path.clone(), json.clone()));
                        s.len()
                    };
                    if mode == Mode::RejectEveryThird && n % 3 == 1 {
                        let body = r#"{"error":{"message":"busy","type":"rate_limit","param":null,"code":"busy"}}"#;
                        let resp = Response::builder()
                            .status(StatusCode::TOO_MANY_REQUESTS)
                            .body(BodyExt::boxed(Full::new(Bytes::from(body))))
                            .unwrap();
                        return Ok::<_, Infallible>(resp);
                    }
                    let tokens = json["max_tokens"].as_u64().unwrap();
                    let chat = path.ends_with("/chat/completions");
                    let resp = Response::builder()
                        .header("content-type", "text/event-stream")
                        .header("x-llmlb-replica", if n % 2 == 0 { "even" } else { "odd" })
                        .body(sse(chat, tokens, mode))
                        .unwrap();
                    Ok(resp)
                }
            });
            tokio::spawn(async move {
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    server
}

fn random(input: usize, output: usize) -> WorkloadSpec {
    WorkloadSpec::Random(RandomOptions {
        input_len: LenRange::fixed(input),
        output_len: LenRange::fixed(output),
    })
}

#[tokio::test]
async fn closed_loop_measures_every_request() {
    let server = start(Mode::Ok).await;
    let mut spec = BenchSpec::new(&server.url, "m", random(40, 5));
    spec.arrivals = Arrivals::Closed { concurrency: 4 };
    spec.limits.num_requests = Some(20);
    spec.slo = "ttft=60000".parse().unwrap();
    spec.api_key = Some("k".into());
    spec.headers = vec![("x-tenant".into(), "a".into())];
    let report = run(&spec).await.unwrap();
    let f = &report.figures;
    assert_eq!((f.sent, f.completed, f.failed), (20, 20, 0));
    assert_eq!(f.output_tokens, 100);
    // Prompt tokens come from the server's `usage` (3 each), not from the
    // 40 the workload asked for.
    assert_eq!(f.input_tokens, 20 * 3);
    assert_eq!(f.good_requests, Some(20));
    assert_eq!(f.ttft_ms.count, 20);
    assert_eq!(f.tpot_ms.count, 20);
    assert_eq!(f.itl_ms.count, 20 * 4);
    for r in &report.requests {
        assert_eq!(r.outcome, Outcome::Ok);
        let ttft = r.ttft_ms.unwrap();
        assert!(
            ttft > 0.0 && ttft < r.e2e_ms,
            "ttft {ttft} e2e {}",
            r.e2e_ms
        );
        assert_eq!(r.itl_ms.len(), 4);
        assert_eq!(r.output_tokens, 5);
    }
    assert!(f.ttft_ms.p50 <= f.ttft_ms.p99 && f.ttft_ms.p99 < f.e2e_ms.max);
    assert_eq!(f.replicas.values().sum::<u64>(), 20);
    assert_eq!(f.replicas.len(), 2);
    let seen = server.seen.lock().unwrap();
    assert_eq!(seen.len(), 20);
    for (path, body) in seen.iter() {
        assert_eq!(path, "/v1/completions");
        assert_eq!(body["model"], "m");
        assert_eq!(body["stream"], true);
        assert_eq!(body["stream_options"]["include_usage"], true);
        assert_eq!(body["ignore_eos"], true);
        assert_eq!(body["max_tokens"], 5);
        let prompt = body["prompt"].as_str().unwrap();
        assert_eq!(llmlb::tokenize::stand_in::count_tokens(prompt), 40);
    }
}

#[tokio::test]
async fn open_loop_sends_exactly_the_count_and_counts_429s() {
    let server = start(Mode::RejectEveryThird).await;
    let mut spec = BenchSpec::new(&server.url, "m", random(8, 3));
    spec.arrivals = Arrivals::Open {
        rate: 2000.0,
        burstiness: 0.5,
    };
    spec.limits.num_requests = Some(30);
    let report = run(&spec).await.unwrap();
    let f = &report.figures;
    assert_eq!(f.sent, 30);
    assert_eq!(f.rejected_429, 10);
    assert_eq!(f.errors.get("429"), Some(&10));
    assert_eq!(f.completed, 20);
    assert_eq!(server.seen.lock().unwrap().len(), 30);
}

#[tokio::test]
async fn chat_sessions_grow_and_use_the_chat_endpoint() {
    let server = start(Mode::Ok).await;
    let workload = WorkloadSpec::Chat(ChatOptions {
        turns: LenRange::fixed(3),
        system_len: 20,
        user_len: LenRange::fixed(10),
        output_len: LenRange::fixed(4),
        think_time: Duration::ZERO,
    });
    let mut spec = BenchSpec::new(&server.url, "m", workload);
    spec.limits.num_requests = Some(6);
    let report = run(&spec).await.unwrap();
    assert_eq!(report.figures.completed, 6);
    assert_eq!(report.figures.output_tokens, 24);
    let seen = server.seen.lock().unwrap();
    let lens: Vec<usize> = seen
        .iter()
        .map(|(path, body)| {
            assert_eq!(path, "/v1/chat/completions");
            body["messages"].as_array().unwrap().len()
        })
        .collect();
    // Concurrency 1: two sessions of three turns, one after the other.
    assert_eq!(lens, vec![2, 4, 6, 2, 4, 6]);
}

#[tokio::test]
async fn timeouts_keep_what_was_measured() {
    let server = start(Mode::Stall).await;
    let mut spec = BenchSpec::new(&server.url, "m", random(8, 50));
    spec.limits.num_requests = Some(2);
    spec.limits.request_timeout = Duration::from_millis(300);
    let report = run(&spec).await.unwrap();
    assert_eq!(report.figures.errors.get("timeout"), Some(&2));
    for r in &report.requests {
        assert_eq!(r.outcome, Outcome::Timeout);
        assert!(
            r.ttft_ms.is_some(),
            "the first chunk arrived before the stall"
        );
        assert!(
            (r.e2e_ms - 300.0).abs() < 1e-6,
            "e2e is the timeout: {}",
            r.e2e_ms
        );
    }
}

#[tokio::test]
async fn broken_streams_are_failures() {
    for (mode, message) in [
        (Mode::ErrorEvent, "replica lost"),
        (Mode::Truncated, "[DONE]"),
    ] {
        let server = start(mode).await;
        let mut spec = BenchSpec::new(&server.url, "m", random(8, 5));
        spec.limits.num_requests = Some(3);
        let report = run(&spec).await.unwrap();
        assert_eq!(report.figures.errors.get("stream"), Some(&3));
        assert_eq!(report.figures.completed, 0);
        match &report.requests[0].outcome {
            Outcome::Stream { message: m } => assert!(m.contains(message), "{m}"),
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn duration_bounds_the_run() {
    let server = start(Mode::Ok).await;
    let mut spec = BenchSpec::new(&server.url, "m", random(8, 2));
    spec.arrivals = Arrivals::Closed { concurrency: 2 };
    spec.limits.duration = Some(Duration::from_millis(200));
    let report = run(&spec).await.unwrap();
    assert!(report.figures.sent > 0);
    assert!(report.requests.iter().all(|r| r.start_ms < 200.0));
}

#[tokio::test]
async fn trace_replay_follows_timestamps_and_lengths() {
    let server = start(Mode::Ok).await;
    let dir = std::env::temp_dir().join(format!("llmlb-bench-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("trace.jsonl");
    std::fs::write(
        &path,
        concat!(
            r#"{"timestamp": 1000, "input_length": 1000, "output_length": 100, "hash_ids": [0, 1]}"#,
            "\n",
            r#"{"timestamp": 2000, "input_length": 700, "output_length": 50, "hash_ids": [0, 2]}"#,
            "\n",
            r#"{"timestamp": 4000, "input_length": 300, "output_length": 30, "hash_ids": [3]}"#,
            "\n"
        ),
    )
    .unwrap();
    let workload = WorkloadSpec::Trace(TraceOptions {
        path: path.clone(),
        time_scale: 0.05,
        length_scale: 0.1,
        max_requests: None,
    });
    let mut spec = BenchSpec::new(&server.url, "m", workload);
    spec.arrivals = Arrivals::Timestamps;
    let report = run(&spec).await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(report.figures.completed, 3);
    let mut starts: Vec<f64> = report.requests.iter().map(|r| r.start_ms).collect();
    starts.sort_by(f64::total_cmp);
    // Arrivals at 0, 50 and 150 ms: never early.
    assert!(starts[1] >= 50.0 && starts[2] >= 150.0, "{starts:?}");
    let seen = server.seen.lock().unwrap();
    let mut asked: Vec<(u64, usize)> = seen
        .iter()
        .map(|(_, b)| {
            let p = b["prompt"].as_str().unwrap();
            (
                b["max_tokens"].as_u64().unwrap(),
                llmlb::tokenize::stand_in::count_tokens(p),
            )
        })
        .collect();
    asked.sort();
    // Block 51 tokens; lengths scaled by 0.1 and kept inside their blocks.
    assert_eq!(asked, vec![(3, 30), (5, 70), (10, 100)]);
}

#[tokio::test]
async fn remote_targets_are_refused() {
    let spec = BenchSpec::new("http://192.0.2.1:8000", "m", random(8, 2));
    assert!(matches!(
        run(&spec).await,
        Err(BenchError::RemoteTarget { .. })
    ));
}

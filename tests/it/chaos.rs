//! Chaos on loopback: four fake replicas under steady streaming load through
//! llmlb. One replica is killed (its listener and every open connection
//! dropped at once, as the kernel does when a process dies by SIGKILL),
//! another hangs (accepts, never answers, stops mid-stream), then the first
//! restarts on the same port and the second recovers.
//!
//! Every request must end with a complete stream or a clean error: a JSON
//! error answer, or an SSE error event the client can read. The dead and the
//! hung replica must be ejected, and readmitted after recovery. The counts are
//! printed (`cargo test --test it chaos:: -- --nocapture`). Bounded: about
//! five seconds of load, every wait capped.

use crate::common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{ChannelBody, admin_get, open_stream, replica_entry};
use http::{Response, StatusCode};
use http_body_util::BodyExt;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;

const CHUNKS: usize = 8;
const CHUNK_EVERY: Duration = Duration::from_millis(25);
const WAIT_LIMIT: Duration = Duration::from_secs(8);

/// A replica that can die, hang and come back on the same address.
struct ChaosReplica {
    addr: SocketAddr,
    hung: Arc<AtomicBool>,
    /// Streams being sent right now.
    streaming: Arc<AtomicUsize>,
    /// Completions requests received.
    served: Arc<AtomicUsize>,
    tasks: Arc<Mutex<Vec<AbortHandle>>>,
}

impl ChaosReplica {
    async fn start() -> ChaosReplica {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let r = ChaosReplica {
            addr: listener.local_addr().unwrap(),
            hung: Arc::default(),
            streaming: Arc::default(),
            served: Arc::default(),
            tasks: Arc::default(),
        };
        r.serve(listener);
        r
    }

    fn serve(&self, listener: TcpListener) {
        let (hung, streaming, served, tasks) = (
            self.hung.clone(),
            self.streaming.clone(),
            self.served.clone(),
            self.tasks.clone(),
        );
        let accept = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (hung, streaming, served) = (hung.clone(), streaming.clone(), served.clone());
                let svc = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let (hung, streaming, served) =
                        (hung.clone(), streaming.clone(), served.clone());
                    async move {
                        if hung.load(Ordering::SeqCst) {
                            std::future::pending::<()>().await;
                        }
                        if req.uri().path() == "/health" {
                            return Ok::<_, Infallible>(Response::new(ChannelBody::Fixed(Some(
                                Bytes::from_static(b"ok"),
                            ))));
                        }
                        served.fetch_add(1, Ordering::SeqCst);
                        let _ = req.into_body().collect().await;
                        Ok(sse_stream(hung, streaming))
                    }
                });
                let conn = tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
                tasks.lock().unwrap().push(conn.abort_handle());
            }
        });
        self.tasks.lock().unwrap().push(accept.abort_handle());
    }

    /// Drops the listener and every connection at once.
    fn kill(&self) {
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }

    async fn restart(&self) {
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.serve(listener);
    }
}

/// An SSE answer of `CHUNKS` events; it stalls while the replica hangs and
/// stops when the connection goes away.
fn sse_stream(hung: Arc<AtomicBool>, streaming: Arc<AtomicUsize>) -> Response<ChannelBody> {
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    streaming.fetch_add(1, Ordering::SeqCst);
    tokio::spawn(async move {
        for i in 0..CHUNKS {
            if hung.load(Ordering::SeqCst) {
                tx.closed().await;
                break;
            }
            let event =
                format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"t{i}\"}}}}]}}\n\n");
            if tx.send(Bytes::from(event)).await.is_err() {
                break;
            }
            if i + 1 == CHUNKS {
                let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
            }
            tokio::time::sleep(CHUNK_EVERY).await;
        }
        streaming.fetch_sub(1, Ordering::SeqCst);
    });
    let mut resp = Response::new(ChannelBody::Channel(rx));
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    resp
}

#[derive(Debug, Default)]
struct Counts {
    complete: AtomicUsize,
    /// Streams that ended with an SSE error event.
    sse_error: AtomicUsize,
    /// Answers that were an OpenAI-style JSON error.
    json_error: AtomicUsize,
    /// Anything else: a cut stream without an error event, a transport error.
    broken: AtomicUsize,
}

async fn one_request(addr: SocketAddr, counts: &Counts) {
    let outcome = tokio::time::timeout(WAIT_LIMIT, async {
        let (_conn, resp) = open_stream(addr).await;
        let status = resp.status();
        let body = resp.into_body().collect().await.map(|b| b.to_bytes());
        (status, body)
    })
    .await;
    let counter = match outcome {
        Ok((StatusCode::OK, Ok(body))) if body.ends_with(b"data: [DONE]\n\n") => &counts.complete,
        Ok((StatusCode::OK, Ok(body))) if last_event_is_error(&body) => &counts.sse_error,
        Ok((status, Ok(body))) if status != StatusCode::OK && is_json_error(&body) => {
            &counts.json_error
        }
        other => {
            eprintln!("broken outcome: {other:?}");
            &counts.broken
        }
    };
    counter.fetch_add(1, Ordering::SeqCst);
}

fn last_event_is_error(body: &[u8]) -> bool {
    let text = String::from_utf8_lossy(body);
    let Some(last) = text.trim_end().rsplit("\n\n").next() else {
        return false;
    };
    last.strip_prefix("data: ")
        .and_then(|json| serde_json::from_str::<serde_json::Value>(json).ok())
        .is_some_and(|v| v["error"]["message"].is_string())
}

fn is_json_error(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .is_ok_and(|v| v["error"]["message"].is_string() && v["error"]["code"].is_string())
}

/// Whether replica `name` is eligible, per `GET /admin/replicas`.
async fn eligible(admin: SocketAddr, name: &str) -> bool {
    let (_, text) = admin_get(admin, "/admin/replicas").await;
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    replica_entry(&v, name)["eligible"] == true
}

/// Waits until `name`'s eligibility is `want`; returns how long it took.
async fn wait_eligible(admin: SocketAddr, name: &str, want: bool) -> Duration {
    let start = Instant::now();
    tokio::time::timeout(WAIT_LIMIT, async {
        while eligible(admin, name).await != want {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{name} eligible={want} not reached within {WAIT_LIMIT:?}"));
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_hang_restart_under_streaming_load() {
    let mut replicas = Vec::new();
    for _ in 0..4 {
        replicas.push(ChaosReplica::start().await);
    }
    let mut config = String::from(
        "[server]\ndrain_delay = \"0s\"\n\
         [[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\nbalancer = \"least_connections\"\nretries = 3\n\
         [pools.timeouts]\nconnect = \"200ms\"\nfirst_byte = \"600ms\"\nidle = \"400ms\"\n\
         [pools.health]\nenabled = true\ninterval = \"100ms\"\ntimeout = \"100ms\"\nfall = 2\nrise = 1\n\
         [pools.outlier]\nconsecutive_failures = 2\ncooldown = \"200ms\"\nmax_ejection_time = \"500ms\"\n",
    );
    for (i, r) in replicas.iter().enumerate() {
        config.push_str(&format!(
            "[[pools.replicas]]\nname = \"r{i}\"\nurl = \"http://{}\"\n",
            r.addr
        ));
    }
    let lb = common::start_llmlb(&config).await;
    let (addr, admin) = (lb.addr, lb.admin_addr);
    for i in 0..4 {
        wait_eligible(admin, &format!("r{i}"), true).await;
    }

    // Steady load: 8 clients, each one streaming request after another,
    // until told to stop (and at most 400 requests each).
    let counts = Arc::new(Counts::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..8 {
        let (counts, stop) = (counts.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            for _ in 0..400 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                one_request(addr, &counts).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(600)).await;

    // Kill r0 while it streams.
    let (dead, hung) = (&replicas[0], &replicas[1]);
    let cut_streams = dead.streaming.load(Ordering::SeqCst);
    let sse_errors_before = counts.sse_error.load(Ordering::SeqCst);
    dead.kill();
    let dead_detect = wait_eligible(admin, "r0", false).await;
    // Hang r1.
    hung.hung.store(true, Ordering::SeqCst);
    let hung_detect = wait_eligible(admin, "r1", false).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let served_while_out = (
        dead.served.load(Ordering::SeqCst),
        hung.served.load(Ordering::SeqCst),
    );

    // Recovery: r0 restarts on its port, r1 answers again.
    dead.restart().await;
    hung.hung.store(false, Ordering::SeqCst);
    let dead_back = wait_eligible(admin, "r0", true).await;
    let hung_back = wait_eligible(admin, "r1", true).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        tokio::time::timeout(WAIT_LIMIT, c).await.unwrap().unwrap();
    }

    let get = |a: &AtomicUsize| a.load(Ordering::SeqCst);
    println!(
        "chaos: complete={} sse_error={} json_error={} broken={} | streams cut by the kill={cut_streams} | \
         detection: dead {dead_detect:?}, hung {hung_detect:?} | readmission: dead {dead_back:?}, hung {hung_back:?} | \
         served per replica {:?}",
        get(&counts.complete),
        get(&counts.sse_error),
        get(&counts.json_error),
        get(&counts.broken),
        replicas.iter().map(|r| get(&r.served)).collect::<Vec<_>>(),
    );
    assert_eq!(get(&counts.broken), 0, "every request ends cleanly");
    // Configured detection: active checks fail `fall` (2) times, each after at
    // most `interval` + `timeout` (100ms + 100ms). The slack only absorbs a
    // noisy shared machine; typical figures are printed above.
    let detection = Duration::from_millis(2 * 200) + Duration::from_secs(2);
    assert!(dead_detect < detection && hung_detect < detection);
    assert!(get(&counts.complete) > 0);
    assert!(
        get(&counts.sse_error) >= sse_errors_before + cut_streams,
        "each stream cut by the kill ends with a readable SSE error event"
    );
    // After recovery both came back into rotation and took new work.
    assert!(get(&dead.served) > served_while_out.0, "r0 readmitted");
    assert!(get(&hung.served) > served_while_out.1, "r1 readmitted");
    lb.shutdown().await;
    for r in &replicas {
        r.kill();
    }
}

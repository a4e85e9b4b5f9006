//! Per-request proxy overhead on loopback: one completion request straight
//! to an instant upstream, and the same request through an in-process llmlb
//! in front of that upstream, streaming (a 16-chunk SSE answer) and
//! non-streaming (one JSON answer). The difference between the two figures
//! of a pair is what llmlb adds to a request.
//!
//! Every request runs over one kept-alive HTTP/1.1 connection, one at a time,
//! so the figure is latency, not throughput. The upstream, the proxy and the
//! client share one tokio runtime (two worker threads) on `127.0.0.1`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use llmlb::bench::instant::canned_stream;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;

const MODEL: &str = "instant";
const TOKENS: usize = 16;

/// A one-shot JSON answer shaped like vLLM's `/v1/completions`.
fn canned_json() -> Bytes {
    let text: String = (0..TOKENS).map(|i| format!(" t{i}")).collect();
    Bytes::from(format!(
        "{{\"id\":\"cmpl-instant\",\"object\":\"text_completion\",\"model\":\"{MODEL}\",\
         \"choices\":[{{\"index\":0,\"text\":\"{text}\",\"finish_reason\":\"length\"}}],\
         \"usage\":{{\"prompt_tokens\":1,\"completion_tokens\":{TOKENS},\"total_tokens\":{}}}}}",
        TOKENS + 1
    ))
}

/// Answers every request at once: SSE when the body asks for a stream, JSON
/// otherwise. Runs until the runtime is dropped.
async fn instant_upstream(listener: TcpListener) {
    let sse = canned_stream(TOKENS);
    let json = canned_json();
    let builder = auto::Builder::new(TokioExecutor::new()).http1_only();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (sse, json) = (sse.clone(), json.clone());
        let service = service_fn(move |req: Request<Incoming>| {
            let (sse, json) = (sse.clone(), json.clone());
            async move {
                let body = req.into_body().collect().await.map(|b| b.to_bytes());
                let streaming = body
                    .map(|b| b.windows(13).any(|w| w == b"\"stream\":true"))
                    .unwrap_or(false);
                let (content_type, body) = if streaming {
                    ("text/event-stream", sse)
                } else {
                    ("application/json", json)
                };
                let mut resp = Response::new(Full::new(body));
                resp.headers_mut().insert(
                    header::CONTENT_TYPE,
                    header::HeaderValue::from_static(content_type),
                );
                Ok::<_, Infallible>(resp)
            }
        });
        let conn = builder
            .serve_connection(TokioIo::new(stream), service)
            .into_owned();
        tokio::spawn(async move {
            let _ = conn.await;
        });
    }
}

/// Starts llmlb (one pool, one replica: the upstream) on `127.0.0.1:0`.
async fn start_proxy(upstream: SocketAddr) -> llmlb::daemon::Running {
    let text = format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n\
         [[pools]]\nname = \"bench\"\nmodels = [\"{MODEL}\"]\nbalancer = \"least_connections\"\n\
         [[pools.replicas]]\nurl = \"http://{upstream}\"\n"
    );
    let config = llmlb::config::parse(&text).expect("bench config is valid");
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let admin = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    llmlb::daemon::start(config, listener, admin).expect("llmlb starts")
}

/// One kept-alive client connection.
async fn connect(addr: SocketAddr) -> SendRequest<Full<Bytes>> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    sender
}

/// Sends one completion request and reads the whole answer.
async fn one_request(sender: &mut SendRequest<Full<Bytes>>, addr: SocketAddr, body: &Bytes) {
    sender.ready().await.expect("connection ready");
    let req = Request::post("/v1/completions")
        .header(header::HOST, addr.to_string())
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(body.clone()))
        .expect("request");
    let resp = sender.send_request(req).await.expect("response");
    assert!(resp.status().is_success(), "status {}", resp.status());
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    assert!(!bytes.is_empty());
}

fn request_body(stream: bool) -> Bytes {
    Bytes::from(format!(
        "{{\"model\":\"{MODEL}\",\"prompt\":\"How far is the moon?\",\"max_tokens\":{TOKENS},\"stream\":{stream}}}"
    ))
}

fn overhead(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (upstream, proxy) = rt.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let upstream = listener.local_addr().expect("addr");
        tokio::spawn(instant_upstream(listener));
        let proxy = start_proxy(upstream).await;
        (upstream, proxy)
    });
    let through = proxy.addr;

    let mut group = c.benchmark_group("proxy_overhead");
    for stream in [false, true] {
        let mode = if stream { "stream" } else { "json" };
        let body = request_body(stream);
        for (path, addr) in [("direct", upstream), ("llmlb", through)] {
            group.bench_function(format!("{mode}/{path}"), |b| {
                b.iter_custom(|iters| timed(&rt, addr, &body, iters));
            });
        }
    }
    group.finish();
    rt.block_on(proxy.shutdown());
}

/// `iters` requests on one fresh connection (opened before the clock starts).
fn timed(rt: &Runtime, addr: SocketAddr, body: &Bytes, iters: u64) -> Duration {
    rt.block_on(async {
        let mut sender = connect(addr).await;
        one_request(&mut sender, addr, body).await;
        let start = Instant::now();
        for _ in 0..iters {
            one_request(&mut sender, addr, body).await;
        }
        start.elapsed()
    })
}

criterion_group!(benches, overhead);
criterion_main!(benches);

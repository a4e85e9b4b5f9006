//! Test support: a scriptable upstream replica on a real loopback socket, a
//! way to start llmlb on port 0, and a small HTTP client.

#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc};

/// How a fake replica answers.
#[derive(Clone, Debug)]
pub enum Mode {
    /// 200 with a small JSON body naming the replica.
    Json,
    /// 200 SSE: one chunk at once, the rest only after `release()`.
    StreamHeld,
    /// Never answers (headers never come).
    Hang,
    /// Answers with this status and an error body.
    Status(u16),
}

/// What the replica saw of one request.
#[derive(Clone, Debug)]
pub struct Seen {
    pub headers: HeaderMap,
    pub body: Bytes,
    pub path: String,
}

pub struct Upstream {
    pub addr: SocketAddr,
    pub name: String,
    pub mode: Arc<Mutex<Mode>>,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// Responses (or pending answers) whose client connection went away.
    pub closed: Arc<AtomicUsize>,
    pub closed_notify: Arc<Notify>,
    pub release: Arc<Notify>,
    /// Streams currently held open.
    pub open_streams: Arc<AtomicUsize>,
}

impl Upstream {
    pub async fn start(name: &str, mode: Mode) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let up = Upstream {
            addr,
            name: name.to_string(),
            mode: Arc::new(Mutex::new(mode)),
            seen: Arc::default(),
            closed: Arc::default(),
            closed_notify: Arc::default(),
            release: Arc::default(),
            open_streams: Arc::default(),
        };
        let shared = up.shared();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let shared = shared.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let shared = shared.clone();
                        async move { Ok::<_, Infallible>(shared.answer(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        up
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_mode(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    pub fn requests(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    pub fn last_seen(&self) -> Seen {
        self.seen
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("a request")
    }

    /// Lets one held stream finish.
    pub fn release_one(&self) {
        self.release.notify_one();
    }

    /// Waits until `n` connections have been seen closing early, or panics after `limit`.
    pub async fn wait_closed(&self, n: usize, limit: Duration) {
        tokio::time::timeout(limit, async {
            while self.closed.load(Ordering::SeqCst) < n {
                let notified = self.closed_notify.notified();
                if self.closed.load(Ordering::SeqCst) >= n {
                    break;
                }
                notified.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{}: connection not closed within {limit:?}", self.name));
    }

    fn shared(&self) -> Shared {
        Shared {
            name: self.name.clone(),
            mode: self.mode.clone(),
            seen: self.seen.clone(),
            closed: self.closed.clone(),
            closed_notify: self.closed_notify.clone(),
            release: self.release.clone(),
            open_streams: self.open_streams.clone(),
        }
    }
}

#[derive(Clone)]
struct Shared {
    name: String,
    mode: Arc<Mutex<Mode>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    closed: Arc<AtomicUsize>,
    closed_notify: Arc<Notify>,
    release: Arc<Notify>,
    open_streams: Arc<AtomicUsize>,
}

impl Shared {
    async fn answer(&self, req: Request<Incoming>) -> Response<ChannelBody> {
        // Active health checks (on by default) get vLLM's answer whatever
        // the mode, and are not counted among the requests the replica saw.
        if req.method() == http::Method::GET && req.uri().path() == "/health" {
            return Response::new(ChannelBody::Fixed(Some(Bytes::new())));
        }
        let (parts, body) = req.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        self.seen.lock().unwrap().push(Seen {
            headers: parts.headers,
            body,
            path: parts.uri.path().to_string(),
        });
        let mode = self.mode.lock().unwrap().clone();
        match mode {
            Mode::Json => {
                let body = format!(
                    r#"{{"replica":"{}","object":"chat.completion","usage":{{"prompt_tokens":4,"completion_tokens":6,"total_tokens":10}}}}"#,
                    self.name
                );
                ChannelBody::fixed(StatusCode::OK, "application/json", body)
            }
            Mode::Status(code) => ChannelBody::fixed(
                StatusCode::from_u16(code).unwrap(),
                "application/json",
                r#"{"error":{"message":"replica says no","type":"server_error","code":null}}"#
                    .into(),
            ),
            Mode::Hang => {
                // Never answer; notice when the caller gives up on us.
                let guard = CloseWatch(self.clone());
                std::future::pending::<()>().await;
                drop(guard);
                unreachable!()
            }
            Mode::StreamHeld => {
                let (tx, rx) = mpsc::channel::<Bytes>(16);
                let me = self.clone();
                self.open_streams.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let first = format!("data: {{\"replica\":\"{}\",\"n\":1}}\n\n", me.name);
                    let _ = tx.send(Bytes::from(first)).await;
                    tokio::select! {
                        _ = me.release.notified() => {
                            let _ = tx.send(Bytes::from_static(b"data: {\"n\":2}\n\n")).await;
                            let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
                        }
                        _ = tx.closed() => {
                            me.closed.fetch_add(1, Ordering::SeqCst);
                            me.closed_notify.notify_waiters();
                        }
                    }
                    me.open_streams.fetch_sub(1, Ordering::SeqCst);
                });
                let mut resp = Response::new(ChannelBody::Channel(rx));
                resp.headers_mut()
                    .insert("content-type", "text/event-stream".parse().unwrap());
                resp
            }
        }
    }
}

/// Counts a pending answer whose future was dropped (the connection closed).
struct CloseWatch(Shared);

impl Drop for CloseWatch {
    fn drop(&mut self) {
        self.0.closed.fetch_add(1, Ordering::SeqCst);
        self.0.closed_notify.notify_waiters();
    }
}

pub enum ChannelBody {
    Fixed(Option<Bytes>),
    Channel(mpsc::Receiver<Bytes>),
}

impl ChannelBody {
    fn fixed(status: StatusCode, content_type: &str, body: String) -> Response<ChannelBody> {
        let mut resp = Response::new(ChannelBody::Fixed(Some(Bytes::from(body))));
        *resp.status_mut() = status;
        resp.headers_mut()
            .insert("content-type", content_type.parse().unwrap());
        resp
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            ChannelBody::Fixed(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ChannelBody::Channel(rx) => rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
        }
    }
}

/// A running llmlb for a test.
pub async fn start_llmlb(config_toml: &str) -> llmlb::server::Running {
    let config = llmlb::config::parse(config_toml)
        .unwrap_or_else(|issues| panic!("test config invalid: {issues:?}"));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
    llmlb::server::start(config, listener, admin).unwrap()
}

/// A pool config with the given replica URLs.
pub fn one_pool(balancer: &str, replicas: &[(&str, u32)], extra: &str) -> String {
    let mut s = format!(
        "[[pools]]\nname = \"llama\"\nmodels = [\"llama-3-8b\"]\nbalancer = \"{balancer}\"\n{extra}\n"
    );
    for (url, weight) in replicas {
        s.push_str(&format!(
            "[[pools.replicas]]\nurl = \"{url}\"\nweight = {weight}\n"
        ));
    }
    s
}

/// An address nothing listens on (connections are refused).
pub async fn refused_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    addr
}

/// A one-connection HTTP/1.1 client whose connection the test controls.
pub struct Conn {
    pub sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    pub task: tokio::task::JoinHandle<()>,
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        let task = tokio::spawn(async move {
            let _ = conn.await;
        });
        Conn { sender, task }
    }

    pub async fn send(&mut self, req: Request<Full<Bytes>>) -> Response<Incoming> {
        self.sender.ready().await.unwrap();
        self.sender.send_request(req).await.unwrap()
    }

    /// Closes the TCP connection as a client that goes away would.
    pub fn close(self) {
        self.task.abort();
    }
}

pub fn chat_request(path: &str, body: &str) -> Request<Full<Bytes>> {
    Request::post(path)
        .header("host", "llmlb.test")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

pub const CHAT: &str =
    r#"{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":8}"#;
pub const CHAT_STREAM: &str =
    r#"{"model":"llama-3-8b","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

/// Sends one request on a fresh connection and returns status, headers and body.
pub async fn call(addr: SocketAddr, req: Request<Full<Bytes>>) -> (StatusCode, HeaderMap, Bytes) {
    let mut c = Conn::open(addr).await;
    let resp = c.send(req).await;
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, bytes)
}

/// Parses an OpenAI-style error body and returns its `code`.
pub fn error_code(body: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_else(|e| {
        panic!(
            "error body is not JSON ({e}): {}",
            String::from_utf8_lossy(body)
        )
    });
    let err = &v["error"];
    assert!(err["message"].is_string(), "no error.message in {v}");
    assert!(err["type"].is_string(), "no error.type in {v}");
    err["code"].as_str().expect("error.code").to_string()
}

/// Reads the admin `/metrics` text.
pub async fn metrics_text(admin: SocketAddr) -> String {
    let req = Request::get("/metrics")
        .header("host", "admin")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, _, body) = call(admin, req).await;
    assert_eq!(status, StatusCode::OK);
    String::from_utf8(body.to_vec()).unwrap()
}

/// Sum of the samples of `name` whose label set contains every `label="value"` in `labels`.
pub fn metric_value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.split(['{', ' ']).next() == Some(name)
                && labels
                    .iter()
                    .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A child process that is killed when the test ends, even by a panic, so a
/// failing test never leaves a server running (or a pipe open).
pub struct ChildGuard(pub std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Writes `bytes` on a fresh TCP connection (optionally closing the write
/// half afterwards) and returns everything the server sends until it closes
/// the connection or `limit` passes.
pub async fn raw_exchange(
    addr: SocketAddr,
    bytes: &[u8],
    half_close: bool,
    limit: Duration,
) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    if half_close {
        s.shutdown().await.unwrap();
    }
    let mut out = Vec::new();
    let _ = tokio::time::timeout(limit, async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    out
}

/// The status code of a raw HTTP/1.1 response, if it has a status line.
pub fn raw_status(response: &[u8]) -> Option<u16> {
    let text = std::str::from_utf8(response).ok()?;
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// Sends an admin `POST` and returns status and JSON body.
pub async fn admin_post(admin: SocketAddr, path: &str) -> (StatusCode, serde_json::Value) {
    let req = Request::post(path)
        .header("host", "admin")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, _, body) = call(admin, req).await;
    (
        status,
        serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
    )
}

/// `GET` on the admin listener: status and body text.
pub async fn admin_get(admin: SocketAddr, path: &str) -> (StatusCode, String) {
    let req = Request::get(path)
        .header("host", "admin")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, _, body) = call(admin, req).await;
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Polls `cond` until it holds, panicking with `what` after 5 s.
pub async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    tokio::time::timeout(Duration::from_secs(5), async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

/// Waiters per priority level in the first pool's queue.
pub fn queue_depths(lb: &llmlb::server::Running) -> Vec<usize> {
    lb.state.topology.load().pools[0]
        .admission
        .as_ref()
        .expect("the pool queues")
        .queue
        .depths()
}

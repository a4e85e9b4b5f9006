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

    /// Replicas with these names, all answering in `mode`.
    pub async fn many<const N: usize>(names: [&str; N], mode: Mode) -> [Upstream; N] {
        let mut out = Vec::with_capacity(N);
        for name in names {
            out.push(Upstream::start(name, mode.clone()).await);
        }
        out.try_into()
            .unwrap_or_else(|_| unreachable!("N replicas"))
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
    let req = get_request("/metrics", "admin");
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
    let req = post_request(path, "admin");
    let (status, _, body) = call(admin, req).await;
    (
        status,
        serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
    )
}

/// `GET` on the admin listener: status and body text.
pub async fn admin_get(admin: SocketAddr, path: &str) -> (StatusCode, String) {
    let req = get_request(path, "admin");
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

/// One replica named `a` answering in `mode`, behind a round-robin pool
/// with the extra pool keys `pool`; `server` is TOML placed before the pool
/// (a `[server]` table, or nothing).
pub async fn one_replica(
    mode: Mode,
    server: &str,
    pool: &str,
) -> (Upstream, llmlb::server::Running) {
    let up = Upstream::start("a", mode).await;
    let config = format!(
        "{server}\n{}",
        one_pool("round_robin", &[(&up.url(), 1)], pool)
    );
    (up, start_llmlb(&config).await)
}

/// Sends a streaming chat on a connection of its own and returns the
/// connection and the response, unread.
pub async fn open_stream(addr: SocketAddr) -> (Conn, Response<Incoming>) {
    let mut conn = Conn::open(addr).await;
    let resp = conn
        .send(chat_request("/v1/chat/completions", CHAT_STREAM))
        .await;
    (conn, resp)
}

/// A streaming chat held open: the first chunk has arrived, the rest waits
/// for the replica (or the test) to let it go.
pub async fn held_stream(addr: SocketAddr) -> (Conn, Incoming) {
    let (conn, resp) = open_stream(addr).await;
    let mut body = resp.into_body();
    body.frame()
        .await
        .expect("a first chunk")
        .expect("the first chunk reads");
    (conn, body)
}

/// The value of one Prometheus selector in `text`, written
/// `name{label="value",...}` (or a bare name): the sum of the samples
/// whose labels include every one given.
pub fn sample(text: &str, selector: &str) -> f64 {
    let (name, labels) = match selector.split_once('{') {
        Some((name, rest)) => (name, rest.strip_suffix('}').expect("selector ends in }")),
        None => (selector, ""),
    };
    let pairs: Vec<(&str, &str)> = labels
        .split(',')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("label=\"value\"");
            (k.trim(), v.trim().trim_matches('"'))
        })
        .collect();
    metric_value(text, name, &pairs)
}

/// Asserts the status of a raw HTTP/1.1 response, showing it when it differs.
pub fn assert_raw_status(response: &[u8], want: u16) {
    assert_eq!(
        raw_status(response),
        Some(want),
        "{}",
        String::from_utf8_lossy(response)
    );
}

/// Polls the async `cond` every 10 ms until it holds, panicking with `what`
/// after `limit`.
pub async fn until_async(what: &str, limit: Duration, mut cond: impl AsyncFnMut() -> bool) {
    tokio::time::timeout(limit, async {
        while !cond().await {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out after {limit:?} waiting for {what}"));
}

/// A file in a directory of its own under the system temp dir, named for
/// the test and this process; the directory goes when this drops.
pub struct TempFile {
    pub dir: std::path::PathBuf,
    pub path: std::path::PathBuf,
}

impl TempFile {
    pub fn new(tag: &str, name: &str, text: &str) -> TempFile {
        let dir = std::env::temp_dir().join(format!("llmlb-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        TempFile { dir, path }
    }

    /// `llmlb.toml` holding `text`.
    pub fn config(tag: &str, text: &str) -> TempFile {
        TempFile::new(tag, "llmlb.toml", text)
    }

    pub fn write(&self, text: &str) {
        std::fs::write(&self.path, text).unwrap();
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A config for `llmlb serve`: both listeners on port 0, the further
/// `[server]` keys `server`, then `rest`.
pub fn serve_config(server: &str, rest: &str) -> String {
    format!("[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n{server}\n{rest}")
}

/// `llmlb serve` as a child process (killed when this drops), logging JSON
/// lines at `info` on a pipe; its first line names the bound addresses.
pub struct ServeProcess {
    pub child: ChildGuard,
    pub lines: std::io::Lines<std::io::BufReader<std::process::ChildStderr>>,
    /// The first log line.
    pub first: serde_json::Value,
    pub addr: SocketAddr,
    pub admin_addr: SocketAddr,
}

impl ServeProcess {
    /// Starts `llmlb serve --config config` with `env` added.
    pub fn start(config: &std::path::Path, env: &[(&str, &str)]) -> ServeProcess {
        use std::io::BufRead;
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_llmlb"))
            .args(["--log-format", "json", "serve", "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut child = ChildGuard(child);
        let mut lines = std::io::BufReader::new(child.0.stderr.take().unwrap()).lines();
        let line = lines.next().expect("a first log line").unwrap();
        let first: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let addr = |key: &str| -> SocketAddr {
            let text = first[key].as_str();
            text.and_then(|a| a.parse().ok())
                .unwrap_or_else(|| panic!("no {key} in {line}"))
        };
        let (addr, admin_addr) = (addr("addr"), addr("admin_addr"));
        ServeProcess {
            child,
            lines,
            first,
            addr,
            admin_addr,
        }
    }

    /// Sends a signal (`-TERM`, `-HUP`) to the process.
    pub fn signal(&self, signal: &str) {
        let sent = std::process::Command::new("kill")
            .args([signal, &self.child.0.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill {signal} failed");
    }

    /// Sends SIGTERM and waits up to `limit` for the process to exit.
    pub async fn terminate(&mut self, limit: Duration) -> std::process::ExitStatus {
        self.signal("-TERM");
        let deadline = std::time::Instant::now() + limit;
        loop {
            if let Some(status) = self.child.0.try_wait().unwrap() {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "llmlb did not exit within {limit:?} of SIGTERM"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// The string `field` of every element of the array `v[array]` (the model
/// ids of a `/v1/models` listing, the keys of config issues, ...).
pub fn strings_of<'a>(v: &'a serde_json::Value, array: &str, field: &str) -> Vec<&'a str> {
    let items = v[array]
        .as_array()
        .unwrap_or_else(|| panic!("no array {array} in {v}"));
    items
        .iter()
        .map(|item| {
            item[field]
                .as_str()
                .unwrap_or_else(|| panic!("no string {field} in {item}"))
        })
        .collect()
}

/// The replica named `name` in an admin `/admin/replicas` (or status) document.
pub fn replica_entry<'a>(doc: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    doc["pools"][0]["replicas"]
        .as_array()
        .unwrap_or_else(|| panic!("no replicas in {doc}"))
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no replica {name} in {doc}"))
}

/// A `GET` of `path` with an empty body.
pub fn get_request(path: &str, host: &str) -> Request<Full<Bytes>> {
    Request::get(path)
        .header("host", host)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// A `POST` to `path` with an empty body.
pub fn post_request(path: &str, host: &str) -> Request<Full<Bytes>> {
    Request::post(path)
        .header("host", host)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// llmlb in front of an address that refuses connections and then `good`,
/// round-robin, with the extra pool keys `pool`.
pub async fn refused_then(good: &Upstream, pool: &str) -> llmlb::server::Running {
    let (refused, good) = (format!("http://{}", refused_addr().await), good.url());
    let replicas = [(refused.as_str(), 1), (good.as_str(), 1)];
    start_llmlb(&one_pool("round_robin", &replicas, pool)).await
}

/// Lets `up` finish one held stream and checks that `body` then ends with
/// `[DONE]`; `what` names the stream in the failure.
pub async fn finish_stream(up: &Upstream, body: Incoming, what: &str) {
    up.release_one();
    let rest = body.collect().await.expect("the stream reads").to_bytes();
    assert!(
        rest.ends_with(b"data: [DONE]\n\n"),
        "{what}: {}",
        String::from_utf8_lossy(&rest)
    );
}

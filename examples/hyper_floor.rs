//! The floor under llmlb's request path: the fewest instructions a proxy
//! built on the same stack (tokio, hyper 1.x, hyper-util's `auto` server,
//! mimalloc) can spend on one request, measured the way
//! `scripts/callgrind_overhead.sh` measures llmlb and nginx.
//!
//! It reads the listen address and the first replica's URL from an llmlb
//! config file, so the script can start it in llmlb's place:
//!
//! ```sh
//! cargo build --release --example hyper_floor
//! FLOOR_MODE=pooled target/release/examples/hyper_floor serve --config llmlb.toml
//! ```
//!
//! `FLOOR_MODE` (or a link to the binary named `...-MODE`) picks what it does with a request (nothing else: no
//! routing, no accounting, no timeouts, headers passed as they came):
//! - `answer`: reads the body and answers a fixed JSON body itself: the
//!   server side alone;
//! - `pooled` (the default): reads the body and sends it with hyper-util's
//!   pooled client (`client::legacy`, as llmlb does), the replica's answer
//!   streamed back as hyper hands it over; each upstream connection runs in
//!   a task of its own;
//! - `inline`: the same exchange over hyper's `client::conn::http1`, the
//!   upstream connection driven by the request's own task (polled from the
//!   response body whenever the body has nothing), kept in a small pool of
//!   idle connections of its own;
//! - `flagged`: `inline`, but the body is polled with a waker that does
//!   nothing and the connection only when its own waker fired (a flag per
//!   connection), so a poll of the body that finds nothing does not run
//!   hyper's client dispatcher.
//!
//! `inline` and `flagged` measure a design, they are not a finished
//! client: no timeouts, no check of an idle connection before reuse, no
//! retry, one replica.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker, ready};

use bytes::Bytes;
use futures_util::task::AtomicWaker;
use http::header::{self, HeaderValue};
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};

#[path = "../src/allocator.rs"]
mod allocator;

#[global_allocator]
static ALLOCATOR: allocator::Allocator = allocator::Allocator;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const ANSWER: &str = r#"{"id":"cmpl-floor","object":"text_completion","model":"instant","choices":[{"index":0,"text":" About 384,400 km.","finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":6,"total_tokens":13}}"#;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let config = match args.as_slice() {
        [_, serve, flag, path] if serve == "serve" && (flag == "--config" || flag == "-c") => path,
        _ => return Err("usage: hyper_floor serve --config FILE".into()),
    };
    let (listen, upstream) = read_config(config)?;
    let listener = TcpListener::bind(listen).await?;
    let mode = std::env::var("FLOOR_MODE").unwrap_or_else(|_| mode_from_name(&args[0]));
    match mode.as_str() {
        "answer" => serve(listener, |req| async move {
            let _ = req.into_body().collect().await;
            let mut resp = Response::new(Full::new(Bytes::from_static(ANSWER.as_bytes())));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            resp
        })
        .await
        .map_err(Into::into),
        "pooled" | "inline" | "flagged" => {
            let upstream = Arc::new(Upstream::new(mode.as_str(), upstream));
            serve(listener, move |req| {
                let upstream = Arc::clone(&upstream);
                async move { upstream.forward(req).await }
            })
            .await
            .map_err(Into::into)
        }
        other => {
            Err(format!("FLOOR_MODE must be answer, pooled, inline or flagged, not {other}").into())
        }
    }
}

/// Where a proxied request goes: through hyper-util's pooled client, or
/// over a connection the request's own task drives. One per process, so
/// the size of the larger variant does not matter.
#[allow(clippy::large_enum_variant)]
enum Upstream {
    Pooled {
        client: Client<HttpConnector, Full<Bytes>>,
        uri: Uri,
    },
    Inline(Arc<InlinePool>),
}

impl Upstream {
    fn new(mode: &str, uri: Uri) -> Upstream {
        if mode == "pooled" {
            let mut connector = HttpConnector::new();
            connector.set_nodelay(true);
            let client = Client::builder(TokioExecutor::new()).build(connector);
            Upstream::Pooled { client, uri }
        } else {
            Upstream::Inline(Arc::new(InlinePool::new(uri, mode == "flagged")))
        }
    }

    async fn forward(&self, req: Request<Incoming>) -> Response<Either> {
        let uri = match self {
            Upstream::Pooled { uri, .. } => uri,
            Upstream::Inline(pool) => &pool.upstream,
        };
        let Some(out) = upstream_request(req, uri).await else {
            return bad_gateway();
        };
        let answer = match self {
            Upstream::Pooled { client, .. } => {
                client.request(out).await.map(|r| r.map(Either::Left)).ok()
            }
            Upstream::Inline(pool) => pool.send(out).await.map(|r| r.map(Either::Right)).ok(),
        };
        answer.unwrap_or_else(bad_gateway)
    }
}

/// The mode a link to the binary names after its last `-`
/// (`floor-inline`), so `scripts/callgrind_overhead.sh` can tell the modes
/// apart by file name; `pooled` otherwise.
fn mode_from_name(argv0: &str) -> String {
    let name = std::path::Path::new(argv0)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("");
    match name.rsplit_once('-') {
        Some((_, mode @ ("answer" | "pooled" | "inline" | "flagged"))) => mode.to_string(),
        _ => "pooled".to_string(),
    }
}

/// `[server] listen` and `[[pools]] [[pools.replicas]] url` of the first pool.
fn read_config(path: &str) -> Result<(SocketAddr, Uri), BoxError> {
    let text = std::fs::read_to_string(path)?;
    let doc: toml::Table = toml::from_str(&text)?;
    let listen = doc
        .get("server")
        .and_then(|s| s.get("listen"))
        .and_then(|l| l.as_str())
        .ok_or("server.listen missing")?
        .parse()?;
    let url = doc
        .get("pools")
        .and_then(|p| p.get(0))
        .and_then(|p| p.get("replicas"))
        .and_then(|r| r.get(0))
        .and_then(|r| r.get("url"))
        .and_then(|u| u.as_str())
        .ok_or("pools[0].replicas[0].url missing")?;
    Ok((listen, url.parse()?))
}

/// The accept loop: one task per connection, HTTP/1.1 and h2c as llmlb
/// serves them, `TCP_NODELAY`.
async fn serve<H, F, B>(listener: TcpListener, handler: H) -> std::io::Result<()>
where
    H: Fn(Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let builder = auto::Builder::new(TokioExecutor::new());
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let handler = handler.clone();
        let builder = builder.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let fut = handler(req);
                async move { Ok::<_, Infallible>(fut.await) }
            });
            let _ = builder
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The client's request with its body read whole (as llmlb reads it) and
/// its URI and `Host` pointed at the replica.
async fn upstream_request(req: Request<Incoming>, upstream: &Uri) -> Option<Request<Full<Bytes>>> {
    let (mut parts, body) = req.into_parts();
    let body = body.collect().await.ok()?.to_bytes();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    parts.uri = Uri::builder()
        .scheme("http")
        .authority(upstream.authority()?.as_str())
        .path_and_query(path)
        .build()
        .ok()?;
    let host = HeaderValue::from_str(upstream.authority()?.as_str()).ok()?;
    parts.headers.insert(header::HOST, host);
    Some(Request::from_parts(parts, Full::new(body)))
}

fn bad_gateway() -> Response<Either> {
    let mut resp = Response::new(Either::Empty);
    *resp.status_mut() = http::StatusCode::BAD_GATEWAY;
    resp
}

/// One upstream HTTP/1.1 connection: the handle that sends on it and the
/// future that drives it.
struct Conn {
    sender: SendRequest<Full<Bytes>>,
    /// Boxed: hyper's connection state is several hundred bytes, and a
    /// `Conn` moves in and out of the pool on every request.
    driver: Pin<Box<Connection<TokioIo<TcpStream>, Full<Bytes>>>>,
    /// With `FLOOR_MODE=flagged`: the waker the connection is polled with
    /// while its answer streams, and the flag it sets.
    flag: Arc<ConnFlag>,
    waker: Waker,
}

/// Notes that an upstream connection asked to be polled (its socket is
/// ready, or its body channel wants more) and wakes the request's task,
/// unless the task is inside the body's poll already and will look at the
/// flag before it returns.
#[derive(Default)]
struct ConnFlag {
    woken: AtomicBool,
    polling: AtomicBool,
    task: AtomicWaker,
}

impl Wake for ConnFlag {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::SeqCst);
        if !self.polling.load(Ordering::SeqCst) {
            self.task.wake();
        }
    }
}

/// Idle upstream connections to the one replica, reused last in, first out.
struct InlinePool {
    upstream: Uri,
    idle: Mutex<Vec<Conn>>,
    /// Poll a streaming answer's connection only when it asked to be.
    flagged: bool,
}

impl InlinePool {
    fn new(upstream: Uri, flagged: bool) -> Self {
        InlinePool {
            upstream,
            idle: Mutex::new(Vec::new()),
            flagged,
        }
    }

    async fn connect(&self) -> Result<Conn, BoxError> {
        let authority = self.upstream.authority().ok_or("no authority")?;
        let stream = TcpStream::connect(authority.as_str()).await?;
        stream.set_nodelay(true)?;
        let (sender, driver) = http1::handshake(TokioIo::new(stream)).await?;
        let flag = Arc::new(ConnFlag::default());
        Ok(Conn {
            sender,
            driver: Box::pin(driver),
            waker: Waker::from(Arc::clone(&flag)),
            flag,
        })
    }

    /// Sends `req` on an idle connection (or a new one), driving the
    /// connection from this task until the head arrives; the connection then
    /// travels in the body and comes back here when the answer has ended.
    async fn send(
        self: &Arc<Self>,
        req: Request<Full<Bytes>>,
    ) -> Result<Response<InlineBody>, BoxError> {
        let idle = self.idle.lock().expect("pool lock").pop();
        let mut conn = match idle {
            Some(c) => c,
            None => self.connect().await?,
        };
        // Ready for a request (an idle one may still be finishing the last).
        std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = conn.driver.as_mut().poll(cx) {
                r?;
                return Poll::Ready(Err::<(), BoxError>("connection closed".into()));
            }
            conn.sender.poll_ready(cx).map_err(Into::into)
        })
        .await?;
        let mut sending = std::pin::pin!(conn.sender.send_request(req));
        let resp = std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = conn.driver.as_mut().poll(cx) {
                r?;
                return Poll::Ready(Err::<_, BoxError>("connection closed".into()));
            }
            sending.as_mut().poll(cx).map_err(Into::into)
        })
        .await?;
        // Whatever it was woken for while the head came, look once.
        conn.flag.woken.store(true, Ordering::SeqCst);
        let pool = Arc::clone(self);
        Ok(resp.map(|incoming| InlineBody {
            incoming,
            conn: Some(conn),
            pool,
        }))
    }
}

/// The replica's answer; polling it drives the connection it arrives on.
struct InlineBody {
    incoming: Incoming,
    conn: Option<Conn>,
    pool: Arc<InlinePool>,
}

impl InlineBody {
    /// Polls the connection once so it moves the next bytes into the body,
    /// and, once the answer has ended and the connection can take another
    /// request, gives it back to the pool.
    fn drive(&mut self, cx: &mut Context<'_>, ended: bool) {
        let Some(conn) = self.conn.as_mut() else {
            return;
        };
        if conn.driver.as_mut().poll(cx).is_ready() {
            self.conn = None;
            return;
        }
        if ended {
            let conn = self.conn.take().expect("checked above");
            if !conn.sender.is_closed() {
                self.pool.idle.lock().expect("pool lock").push(conn);
            }
        }
    }
}

impl InlineBody {
    /// `FLOOR_MODE=flagged`: the body is polled with a waker that does
    /// nothing (only the connection fills it, and the connection is polled
    /// right here), and the connection only when its own waker fired.
    fn poll_flagged(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let Some(flag) = self.conn.as_ref().map(|c| Arc::clone(&c.flag)) else {
            return Pin::new(&mut self.incoming).poll_frame(cx);
        };
        flag.task.register(cx.waker());
        flag.polling.store(true, Ordering::SeqCst);
        let mut quiet = Context::from_waker(Waker::noop());
        loop {
            if let Poll::Ready(frame) = Pin::new(&mut self.incoming).poll_frame(&mut quiet) {
                flag.polling.store(false, Ordering::SeqCst);
                if frame.is_none() || self.incoming.is_end_stream() {
                    let waker = self.conn.as_ref().map(|c| c.waker.clone());
                    if let Some(waker) = waker {
                        self.drive(&mut Context::from_waker(&waker), true);
                    }
                }
                return Poll::Ready(frame);
            }
            if self.conn.is_some() && flag.woken.swap(false, Ordering::SeqCst) {
                let waker = self.conn.as_ref().map(|c| c.waker.clone());
                if let Some(waker) = waker {
                    self.drive(&mut Context::from_waker(&waker), false);
                }
                continue;
            }
            flag.polling.store(false, Ordering::SeqCst);
            // A wake between the look above and the store.
            if flag.woken.load(Ordering::SeqCst) && self.conn.is_some() {
                flag.polling.store(true, Ordering::SeqCst);
                continue;
            }
            if self.conn.is_none() {
                // The connection ended: the body has what it will get.
                return Pin::new(&mut self.incoming).poll_frame(cx);
            }
            return Poll::Pending;
        }
    }
}

impl Body for InlineBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        if this.pool.flagged {
            return this.poll_flagged(cx);
        }
        // The body first: the connection is driven only when the body has
        // nothing (driving it on every poll cost about 5 k instructions per
        // streamed event more than hyper-util's pooled client).
        let frame = match Pin::new(&mut this.incoming).poll_frame(cx) {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                this.drive(cx, false);
                ready!(Pin::new(&mut this.incoming).poll_frame(cx))
            }
        };
        let ended = frame.is_none() || this.incoming.is_end_stream();
        if ended {
            this.drive(cx, true);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.incoming.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.incoming.size_hint()
    }
}

/// One body type for the two forwarding modes and the 502 answer.
enum Either {
    Left(Incoming),
    Right(InlineBody),
    Empty,
}

impl Body for Either {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            Either::Left(b) => Pin::new(b).poll_frame(cx),
            Either::Right(b) => Pin::new(b).poll_frame(cx),
            Either::Empty => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Either::Left(b) => b.is_end_stream(),
            Either::Right(b) => b.is_end_stream(),
            Either::Empty => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Either::Left(b) => b.size_hint(),
            Either::Right(b) => b.size_hint(),
            Either::Empty => SizeHint::with_exact(0),
        }
    }
}

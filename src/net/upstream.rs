//! The keep-alive HTTP/1.1 client used to reach replicas, over TCP or TLS
//! by the replica's scheme (see `upstream_tls.rs`).
//!
//! Each replica keeps its own idle connections ([`IdleConns`], held by the
//! replica), so a request finds one without a lookup by host: it takes the
//! most recently returned one (or connects), sends on it, and the answer's
//! body ([`UpstreamBody`]) returns it when the replica's answer has been
//! read to its end. A connection whose answer is not read to the end (the
//! client went away, a timeout) is closed, which is how a replica learns
//! to stop generating. Each connection is driven by a task of its own.
//!
//! A connection idle for longer than the pool's `upstream_idle` is not used
//! again, so a request never goes out on a connection the replica is about
//! to close: it is closed when a request looks at it or when a connection
//! returned after it finds it past its time. A connection found closed
//! before the request was written to it is left for another (or a new
//! one): nothing was sent, so nothing can be generated twice.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use tower_service::Service;

use super::BoxError;
use super::head_deadline::{HeadDeadline, Watch};
use super::upstream_tls::UpstreamTls;
use crate::config::TimeoutConfig;

/// Idle connections kept per replica, at most.
const MAX_IDLE: usize = 1024;

/// Tells clients apart: a replica's idle connections are used only by the
/// client that made them (a reload that changes a pool's TLS settings
/// makes a new client).
static NEXT_CLIENT: AtomicU64 = AtomicU64::new(1);

/// A connection as its requests hold it: the sender, and the deadline its
/// task keeps.
#[derive(Debug)]
struct Sender {
    send: SendRequest<Full<Bytes>>,
    head: Arc<HeadDeadline>,
}

impl Sender {
    fn is_closed(&self) -> bool {
        self.send.is_closed()
    }
}

/// A pool's client to its replicas: the connector (TCP with `TCP_NODELAY`
/// and the pool's connect timeout, TLS for `https://`) and the idle
/// timeout; the idle connections are the replicas'.
#[derive(Clone)]
pub struct UpstreamClient {
    connector: HttpsConnector<HttpConnector>,
    id: u64,
    idle_timeout: Duration,
}

impl std::fmt::Debug for UpstreamClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamClient")
            .field("idle_timeout", &self.idle_timeout)
            .finish_non_exhaustive()
    }
}

/// A client trusting the built-in roots; see [`tls_client`].
pub fn client(timeouts: &TimeoutConfig) -> UpstreamClient {
    tls_client(timeouts, &UpstreamTls::default())
}

/// A client with `TCP_NODELAY` (so each SSE chunk leaves at once instead of
/// waiting up to ~40 ms for Nagle's algorithm), the pool's connect timeout,
/// and the pool's TLS settings for `https://` replicas.
pub fn tls_client(timeouts: &TimeoutConfig, tls: &UpstreamTls) -> UpstreamClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(timeouts.connect));
    connector.set_keepalive(Some(Duration::from_secs(60)));
    UpstreamClient {
        connector: tls.connector(connector),
        id: NEXT_CLIENT.fetch_add(1, Ordering::Relaxed),
        idle_timeout: timeouts.upstream_idle,
    }
}

/// A replica's idle connections, most recently returned last.
#[derive(Clone, Default)]
pub struct IdleConns(Arc<Mutex<Vec<Idle>>>);

impl std::fmt::Debug for IdleConns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IdleConns")
    }
}

struct Idle {
    sender: Sender,
    client: u64,
    since: Instant,
}

impl Idle {
    /// Idle for `timeout` or longer at `now`: not used again.
    fn stale(&self, now: Instant, timeout: Duration) -> bool {
        now.saturating_duration_since(self.since) >= timeout
    }
}

impl IdleConns {
    /// How many are kept now (closed ones included until looked at).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Idle>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The most recent usable connection of `client`; the stale and closed
    /// ones above it are dropped.
    fn take(&self, client: &UpstreamClient) -> Option<Sender> {
        let now = Instant::now();
        let mut idle = self.lock();
        while let Some(c) = idle.pop() {
            if c.client == client.id && !c.stale(now, client.idle_timeout) && !c.sender.is_closed()
            {
                return Some(c.sender);
            }
        }
        None
    }

    /// Keeps `sender` for the next request, and closes the connections
    /// idle past `timeout` (the oldest: the list is in the order they were
    /// returned), so a burst's connections do not stay open after it.
    fn put(&self, sender: Sender, client: u64, timeout: Duration) {
        if sender.is_closed() {
            return;
        }
        let now = Instant::now();
        let stale = |c: &Idle| c.stale(now, timeout);
        let mut idle = self.lock();
        if idle.first().is_some_and(stale) {
            let n = idle.partition_point(stale);
            idle.drain(..n);
        }
        if idle.len() < MAX_IDLE {
            idle.push(Idle {
                sender,
                client,
                since: now,
            });
        }
    }
}

/// Why a request got no answer head.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// No connection was made (refused, unreachable, TLS, connect timeout):
    /// the request was not sent.
    #[error("connect")]
    Connect(#[source] BoxError),
    /// The connection failed after the request was handed to it: it may
    /// have reached the replica.
    #[error("request")]
    Request(#[source] hyper::Error),
    /// No response head within the first-byte limit (or no connection
    /// made within it); the connection is closed.
    #[error("no response head in time")]
    HeadTimeout,
}

impl UpstreamError {
    /// The request provably never left llmlb.
    pub fn is_connect(&self) -> bool {
        matches!(self, UpstreamError::Connect(_))
    }
}

impl UpstreamClient {
    /// Sends `req` (its URI the replica's absolute URL, a `Host` header
    /// set) on one of `conns` or a new connection, and gives the answer's
    /// head; its body returns the connection to `conns` at its end.
    pub async fn request(
        &self,
        conns: &IdleConns,
        req: Request<Full<Bytes>>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        self.request_within(conns, req, None).await
    }

    /// [`Self::request`], failing with [`UpstreamError::HeadTimeout`] when
    /// the response head is not in `first_byte` after the request is sent
    /// (kept by the connection's task, not by a timer per request; a new
    /// connection must be made within it too).
    pub async fn request_within(
        &self,
        conns: &IdleConns,
        mut req: Request<Full<Bytes>>,
        first_byte: Option<Duration>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        // Connected by the absolute URL, sent in origin form.
        let target = std::mem::take(req.uri_mut());
        *req.uri_mut() = match target.path_and_query() {
            Some(pq) => Uri::from(pq.clone()),
            None => Uri::from_static("/"),
        };
        loop {
            let (mut sender, pooled) = match conns.take(self) {
                Some(sender) => (sender, true),
                None => (self.connect_within(&target, first_byte).await?, false),
            };
            // A returned connection may still be finishing its last answer.
            if let Err(e) = sender.send.ready().await {
                match pooled {
                    true => continue,
                    // Closed before anything was written to it.
                    false => return Err(UpstreamError::Connect(e.into())),
                }
            }
            if let Some(limit) = first_byte {
                sender.head.set(limit);
            }
            match sender.send.try_send_request(req).await {
                Ok(resp) => {
                    sender.head.clear();
                    return Ok(self.answer(resp, sender, conns));
                }
                Err(_) if sender.head.expired() => return Err(UpstreamError::HeadTimeout),
                Err(mut e) => match e.take_message() {
                    // Closed before the request was written: another.
                    Some(unsent) if pooled => req = unsent,
                    _ => return Err(UpstreamError::Request(e.into_error())),
                },
            }
        }
    }

    /// [`Self::request`] for a caller that keeps no connections (a check
    /// that sends a few requests).
    pub async fn request_once(
        &self,
        req: Request<Full<Bytes>>,
    ) -> Result<Response<UpstreamBody>, UpstreamError> {
        self.request(&IdleConns::default(), req).await
    }

    /// A new connection, within `limit` when one is given.
    async fn connect_within(
        &self,
        target: &Uri,
        limit: Option<Duration>,
    ) -> Result<Sender, UpstreamError> {
        // On the heap: the connector's future is kilobytes, and the
        // request's future, held inline by the request path's futures
        // above it, is moved by value.
        let connect = Box::pin(self.connect(target));
        match limit {
            None => connect.await,
            Some(limit) => tokio::time::timeout(limit, connect)
                .await
                .unwrap_or(Err(UpstreamError::HeadTimeout)),
        }
    }

    async fn connect(&self, target: &Uri) -> Result<Sender, UpstreamError> {
        let io = self
            .connector
            .clone()
            .call(target.clone())
            .await
            .map_err(UpstreamError::Connect)?;
        let (send, conn) = http1::handshake(io)
            .await
            .map_err(|e| UpstreamError::Connect(e.into()))?;
        let head = Arc::new(HeadDeadline::new());
        let watched = Arc::clone(&head);
        tokio::spawn(async move {
            let mut conn = std::pin::pin!(conn);
            let mut watch = Watch::default();
            std::future::poll_fn(|cx| {
                if let Poll::Ready(ended) = conn.as_mut().poll(cx) {
                    if let Err(e) = ended {
                        tracing::debug!(error = %e, "upstream connection ended");
                    }
                    return Poll::Ready(());
                }
                // A late head: the connection is dropped, which fails the
                // request and tells the replica to stop.
                match watch.poll_expired(&watched, cx) {
                    true => Poll::Ready(()),
                    false => Poll::Pending,
                }
            })
            .await;
        });
        Ok(Sender { send, head })
    }

    fn answer(
        &self,
        resp: Response<Incoming>,
        sender: Sender,
        conns: &IdleConns,
    ) -> Response<UpstreamBody> {
        resp.map(|inner| {
            let mut body = UpstreamBody {
                inner,
                lent: Lent(Some(Back {
                    sender,
                    conns: conns.clone(),
                    client: self.id,
                    idle_timeout: self.idle_timeout,
                })),
            };
            // No body to read (a 204, a HEAD): free at once.
            if body.inner.is_end_stream() {
                body.lent.give_back();
            }
            body
        })
    }
}

/// Where a connection goes when its answer has been read.
#[derive(Debug)]
struct Back {
    sender: Sender,
    conns: IdleConns,
    client: u64,
    idle_timeout: Duration,
}

/// A replica's answer body; read to its end, it returns its connection
/// for the next request to the replica (dropped before, it closes it).
#[derive(Debug)]
pub struct UpstreamBody {
    inner: Incoming,
    lent: Lent,
}

/// An answer's connection, lent until the answer has been read: given
/// back, it serves the replica's next request; dropped, it closes (the
/// replica stops its work on an answer not read to its end).
#[derive(Debug)]
pub struct Lent(Option<Back>);

impl Lent {
    /// The answer was read to its end.
    pub fn give_back(&mut self) {
        if let Some(b) = self.0.take() {
            b.conns.put(b.sender, b.client, b.idle_timeout);
        }
    }

    /// The answer failed: the connection is not used again.
    pub fn close(&mut self) {
        self.0 = None;
    }
}

impl UpstreamBody {
    /// The replica's body and its lent connection, for a body of the
    /// caller's own that reads the answer and gives the connection back
    /// at its end.
    pub fn into_parts(self) -> (Incoming, Lent) {
        (self.inner, self.lent)
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(_))) if this.inner.is_end_stream() => this.lent.give_back(),
            Poll::Ready(None) => this.lent.give_back(),
            Poll::Ready(Some(Err(_))) => this.lent.close(),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The client's error with its causes (`connect: invalid peer certificate:
/// UnknownIssuer`): the error's own message names only the stage that
/// failed.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::atomic::AtomicUsize;
    use tokio::net::TcpListener;

    /// A loopback server answering `ok` to every request; counts the
    /// connections it accepted. `close`: it closes each after its answer.
    async fn server(close: bool) -> (Uri, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let service = hyper::service::service_fn(move |_req| async move {
                    let mut resp = Response::new(Full::new(Bytes::from_static(b"ok")));
                    if close {
                        resp.headers_mut()
                            .insert(http::header::CONNECTION, "close".parse().unwrap());
                    }
                    Ok::<_, std::convert::Infallible>(resp)
                });
                let io = hyper_util::rt::TokioIo::new(tcp);
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new().serve_connection(io, service),
                );
            }
        });
        (
            format!("http://{addr}/v1/models").parse().unwrap(),
            accepted,
        )
    }

    fn get(uri: &Uri) -> Request<Full<Bytes>> {
        let mut req = Request::new(Full::default());
        *req.uri_mut() = uri.clone();
        let host = uri.authority().unwrap().as_str().parse().unwrap();
        req.headers_mut().insert(http::header::HOST, host);
        req
    }

    fn client_with_idle(idle: Duration) -> UpstreamClient {
        let timeouts = TimeoutConfig {
            upstream_idle: idle,
            ..TimeoutConfig::default()
        };
        client(&timeouts)
    }

    /// A client with the idle timeout `idle`, and a replica's empty list
    /// of idle connections.
    fn fresh(idle: Duration) -> (UpstreamClient, IdleConns) {
        (client_with_idle(idle), IdleConns::default())
    }

    async fn read(resp: Response<UpstreamBody>) -> Bytes {
        resp.into_body().collect().await.unwrap().to_bytes()
    }

    /// A GET of `uri` through `client` and `conns`, read to its end.
    async fn fetch(client: &UpstreamClient, conns: &IdleConns, uri: &Uri) -> Bytes {
        read(client.request(conns, get(uri)).await.unwrap()).await
    }

    #[tokio::test]
    async fn an_answer_read_to_its_end_returns_its_connection_for_the_next() {
        let (uri, accepted) = server(false).await;
        let (client, conns) = fresh(Duration::from_secs(4));
        for _ in 0..3 {
            let resp = client.request(&conns, get(&uri)).await.unwrap();
            assert!(conns.is_empty(), "lent while its answer is read");
            assert_eq!(read(resp).await, "ok");
            assert_eq!(conns.len(), 1);
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_answer_dropped_unread_closes_its_connection() {
        let (uri, accepted) = server(false).await;
        let (client, conns) = fresh(Duration::from_secs(4));
        let resp = client.request(&conns, get(&uri)).await.unwrap();
        drop(resp);
        assert!(conns.is_empty());
        assert_eq!(fetch(&client, &conns, &uri).await, "ok");
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_connection_idle_past_the_timeout_is_not_used_again() {
        let (uri, accepted) = server(false).await;
        let (client, conns) = fresh(Duration::from_millis(50));
        fetch(&client, &conns, &uri).await;
        tokio::time::sleep(Duration::from_millis(120)).await;
        fetch(&client, &conns, &uri).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
        // Another client's connections are not taken either.
        let other = client_with_idle(Duration::from_secs(4));
        fetch(&other, &conns, &uri).await;
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
    }

    /// Connections left idle by a burst are closed when a later one is
    /// returned past the idle timeout, not kept open: the burst's three go
    /// idle, the newest serves a request at 120 ms (fresh) and again at
    /// 240 ms, when the other two (idle since 0) are past 200 ms.
    #[tokio::test]
    async fn a_return_closes_the_connections_idle_past_the_timeout() {
        let (uri, accepted) = server(false).await;
        let (client, conns) = fresh(Duration::from_millis(200));
        let burst =
            futures_util::future::join_all((0..3).map(|_| client.request(&conns, get(&uri))));
        for resp in burst.await {
            read(resp.unwrap()).await;
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 3);
        assert_eq!(conns.len(), 3);
        for _ in 0..2 {
            tokio::time::sleep(Duration::from_millis(120)).await;
            fetch(&client, &conns, &uri).await;
        }
        assert_eq!(conns.len(), 1, "the stale ones closed, the last one kept");
    }

    /// A server that closes each connection after its answer: every
    /// request still gets its answer, each on a new connection.
    #[tokio::test]
    async fn a_connection_the_replica_closed_is_replaced_without_an_error() {
        let (uri, accepted) = server(true).await;
        let (client, conns) = fresh(Duration::from_secs(4));
        for _ in 0..5 {
            assert_eq!(fetch(&client, &conns, &uri).await, "ok");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 5);
    }

    /// The request's future is held inline by the request path's futures
    /// and moved by value with them: the connector's future (kilobytes) is
    /// kept out of it.
    #[test]
    fn a_request_future_is_small() {
        let client = client_with_idle(Duration::from_secs(4));
        let conns = IdleConns::default();
        let limit = Some(Duration::from_secs(4));
        let request = client.request_within(&conns, Request::new(Full::default()), limit);
        let size = std::mem::size_of_val(&request);
        assert!(size < 1536, "{size} bytes");
    }

    #[tokio::test]
    async fn nothing_listening_is_a_connect_error() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: Uri = format!("http://{}/", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        drop(listener);
        let client = client_with_idle(Duration::from_secs(4));
        let err = client.request_once(get(&uri)).await.unwrap_err();
        assert!(err.is_connect(), "{err:?}");
    }

    #[derive(Debug, thiserror::Error)]
    #[error("client error (Connect)")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn error_chain_names_every_cause_once() {
        let err = Outer(std::io::Error::other(
            "invalid peer certificate: UnknownIssuer",
        ));
        assert_eq!(
            error_chain(&err),
            "client error (Connect): invalid peer certificate: UnknownIssuer"
        );
    }
}

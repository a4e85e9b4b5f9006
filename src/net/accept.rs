//! The accept loop of every llmlb listener (the proxy's client and admin
//! listeners, each simulated replica): HTTP/1.1 and h2c on one port, `TCP_NODELAY` on every accepted socket, a cap on connections
//! served at once, header limits, and graceful shutdown.
//!
//! Connections beyond `max_connections` are not accepted: they wait in the
//! kernel's listen backlog until a slot frees (and the kernel refuses or drops
//! them when the backlog is full). Request heads larger than
//! `max_header_bytes` or with more than `max_headers` fields get hyper's 431.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use super::body::BoxError;
use super::client_tls::ClientIo;
use super::connection::{Activity, Ended, Phase, TrackedIo, drive};
use super::guarded::Guarded;
use super::shutdown::stopped;
use crate::config::ServerConfig;

/// The header count hyper's HTTP/1 server allows when not told otherwise.
const HYPER_MAX_HEADERS: usize = 100;

/// Connection-level limits of one listener, and its TLS acceptor if any.
#[derive(Clone)]
pub struct Limits {
    pub http2: bool,
    pub max_header_bytes: usize,
    pub max_headers: usize,
    pub header_read_timeout: Duration,
    pub client_idle_timeout: Duration,
    pub max_connections: usize,
    /// How long open connections may finish after the listener stops.
    pub drain_timeout: Duration,
    pub tls: Option<tokio_rustls::TlsAcceptor>,
}

impl Limits {
    pub fn from_config(server: &ServerConfig) -> Limits {
        Limits {
            http2: server.http2,
            max_header_bytes: server.max_header_bytes,
            max_headers: server.max_headers,
            header_read_timeout: server.header_read_timeout,
            client_idle_timeout: server.client_idle_timeout,
            max_connections: server.max_connections,
            drain_timeout: server.drain_timeout,
            tls: None,
        }
    }

    /// No limit worth the name (hyper's default head size, a day for the
    /// timeouts): a listener that trusts its clients, such as a simulated
    /// replica behind llmlb. `drain` bounds the wait for open connections.
    pub fn lenient(drain: Duration) -> Limits {
        const DAY: Duration = Duration::from_secs(24 * 3600);
        Limits {
            http2: true,
            max_header_bytes: 8192 + 4096 * 100,
            max_headers: 100,
            header_read_timeout: DAY,
            client_idle_timeout: DAY,
            max_connections: 100_000,
            drain_timeout: drain,
            tls: None,
        }
    }
}

/// Client connections of one listener: open now, and closed by reason.
#[derive(Debug, Clone)]
pub struct ConnMetrics {
    listener: &'static str,
    open: prometheus::IntGauge,
    closed: prometheus::IntCounterVec,
}

impl ConnMetrics {
    /// Registers the metric families and returns the series of the client
    /// and the admin listener.
    pub fn register(registry: &prometheus::Registry) -> (ConnMetrics, ConnMetrics) {
        let family = crate::telemetry::Family::new(registry);
        let open = family.gauge(
            "llmlb_client_connections",
            "Connections open now, by listener.",
            &["listener"],
        );
        let closed = family.counter(
            "llmlb_client_connections_closed_total",
            "Connections closed, by listener and reason (normal, idle_timeout, \
             header_timeout, drain_timeout, tls_handshake).",
            &["listener", "reason"],
        );
        let series = |listener: &'static str| ConnMetrics {
            listener,
            open: open.with_label_values(&[listener]),
            closed: closed.clone(),
        };
        (series("client"), series("admin"))
    }

    fn opened(this: Option<&Self>) {
        if let Some(m) = this {
            m.open.inc();
        }
    }

    fn closed(this: Option<&Self>, why: Ended) {
        if let Some(m) = this {
            m.open.dec();
            m.closed.with_label_values(&[m.listener, why.label()]).inc();
        }
    }
}

/// Serves `listener` until `shutdown` turns true, then stops accepting and
/// waits up to the drain timeout for open connections to finish their
/// requests; connections still open then are closed. `metrics`, when
/// given, counts the connections open and closed. Each answer's body `B` is
/// served as it is, held by the connection's count of requests in flight
/// (no boxed body in between).
pub async fn run<H, F, B>(
    listener: TcpListener,
    handler: H,
    mut shutdown: watch::Receiver<bool>,
    limits: Limits,
    metrics: Option<ConnMetrics>,
) where
    H: Fn(SocketAddr, Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().max_buf_size(limits.max_header_bytes);
    // hyper's own limit is 100 headers, kept in a stack array; a limit set
    // explicitly, even the same 100, is filled element by element on every
    // request (about 1.7 k instructions), so it is set only when it differs.
    if limits.max_headers != HYPER_MAX_HEADERS {
        builder.http1().max_headers(limits.max_headers);
    }
    builder
        .http2()
        .max_header_list_size(limits.max_header_bytes.min(u32::MAX as usize) as u32);
    if !limits.http2 {
        builder = builder.http1_only();
    }
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let (phase, phase_rx) = watch::channel(Phase::Serve);
    let timeouts = (limits.client_idle_timeout, limits.header_read_timeout);
    loop {
        let permit = tokio::select! {
            permit = Arc::clone(&slots).acquire_owned() => permit.expect("semaphore never closed"),
            _ = stopped(&mut shutdown) => break,
        };
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Typically EMFILE: back off briefly instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
            _ = stopped(&mut shutdown) => break,
        };
        let _ = stream.set_nodelay(true);
        let activity = Activity::new();
        let handler = handler.clone();
        let counted = Arc::clone(&activity);
        let service = service_fn(move |req| {
            let guard = counted.begin();
            // On the heap once: the handler's future is kilobytes, and
            // hyper and the wrapper below would otherwise move it by value
            // a few times per request (memcpy).
            let fut = Box::pin(handler(peer, req));
            async move { Ok::<_, Infallible>(fut.await.map(|b| Guarded::wrap(b, guard))) }
        });
        let phase_rx = phase_rx.clone();
        let (builder, tls) = (builder.clone(), limits.tls.clone());
        let handshake_limit = limits.header_read_timeout;
        let metrics = metrics.clone();
        ConnMetrics::opened(metrics.as_ref());
        tokio::spawn(async move {
            let tracked = TrackedIo::new(stream, Arc::clone(&activity));
            let io = match tls {
                None => ClientIo::Plain(tracked),
                Some(acceptor) => {
                    match tokio::time::timeout(handshake_limit, acceptor.accept(tracked)).await {
                        Ok(Ok(s)) => ClientIo::Tls(Box::new(s)),
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, %peer, "TLS handshake failed");
                            ConnMetrics::closed(metrics.as_ref(), Ended::Handshake);
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            ConnMetrics::closed(metrics.as_ref(), Ended::Handshake);
                            return;
                        }
                    }
                }
            };
            let conn = builder.serve_connection(TokioIo::new(io), service);
            let ended = drive(
                conn,
                |c| c.graceful_shutdown(),
                activity,
                timeouts,
                phase_rx,
                peer,
            )
            .await;
            ConnMetrics::closed(metrics.as_ref(), ended);
            drop(permit);
        });
    }
    drop(listener);
    let _ = phase.send(Phase::Graceful);
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    tokio::select! {
        _ = slots.acquire_many(all) => tracing::debug!("all connections closed"),
        _ = tokio::time::sleep(limits.drain_timeout) => {
            tracing::warn!("drain timeout reached; closing remaining connections");
            let _ = phase.send(Phase::Force);
        }
    }
}

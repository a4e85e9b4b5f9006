//! Accept loop shared by the client and admin listeners: HTTP/1.1 and h2c on
//! one port, `TCP_NODELAY` on every accepted socket, graceful shutdown.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::forwarding::ResponseBody;

/// Serves `listener` until `shutdown` turns true, then stops accepting and
/// waits up to `drain` for open connections to finish their requests.
pub async fn run<H, F>(
    listener: TcpListener,
    handler: H,
    mut shutdown: watch::Receiver<bool>,
    http2: bool,
    drain: Duration,
) where
    H: Fn(SocketAddr, Request<Incoming>) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<ResponseBody>> + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    if !http2 {
        builder = builder.http1_only();
    }
    let graceful = GracefulShutdown::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        // Typically EMFILE: back off briefly instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let handler = handler.clone();
                let service = service_fn(move |req| {
                    let fut = handler(peer, req);
                    async move { Ok::<_, Infallible>(fut.await) }
                });
                let conn = builder.serve_connection(TokioIo::new(stream), service).into_owned();
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, %peer, "connection ended with an error");
                    }
                });
            }
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    break;
                }
            }
        }
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => tracing::debug!("all connections closed"),
        _ = tokio::time::sleep(drain) => tracing::warn!("drain timeout reached; closing remaining connections"),
    }
}

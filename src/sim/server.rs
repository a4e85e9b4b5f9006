//! The accept loop of one replica: HTTP/1.1 and h2c on one port,
//! `TCP_NODELAY`, graceful stop.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::http::{Replica, handle};

/// How long open connections get to finish once the replica stops. Open
/// streams end as soon as the engine driver stops, so this only bounds
/// clients that keep a finished connection open.
const DRAIN: Duration = Duration::from_secs(2);

pub async fn serve(
    listener: TcpListener,
    replica: Arc<Replica>,
    mut shutdown: watch::Receiver<bool>,
) {
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        tracing::warn!(error = %e, "sim: accept failed");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let r = Arc::clone(&replica);
                let service = service_fn(move |req| {
                    let r = Arc::clone(&r);
                    async move { Ok::<_, Infallible>(handle(r, req).await) }
                });
                let conn = builder.serve_connection(TokioIo::new(stream), service).into_owned();
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, %peer, "sim: connection ended with an error");
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
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(DRAIN) => tracing::debug!("sim: drain timeout; closing remaining connections"),
    }
}

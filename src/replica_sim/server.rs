//! The accept loop of one replica: llmlb's own (`net::accept`) with lenient
//! limits and no connection metrics, serving the replica's HTTP front.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;

use super::http::{Replica, handle};
use crate::net::{Limits, accept};

/// How long open connections get to finish once the replica stops. Open
/// streams end as soon as the engine driver stops, so this only bounds
/// clients that keep a finished connection open.
const DRAIN: Duration = Duration::from_secs(2);

pub async fn serve(listener: TcpListener, replica: Arc<Replica>, shutdown: watch::Receiver<bool>) {
    let handler = move |_peer: std::net::SocketAddr, req| handle(Arc::clone(&replica), req);
    accept::run(listener, handler, shutdown, Limits::lenient(DRAIN), None).await;
}

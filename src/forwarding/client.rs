//! The pooled keep-alive HTTP/1.1 client used to reach replicas.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::config::TimeoutConfig;

pub type UpstreamClient = Client<HttpConnector, Full<Bytes>>;

/// A client with `TCP_NODELAY` (so each SSE chunk leaves at once instead of
/// waiting up to ~40 ms for Nagle's algorithm) and the pool's connect timeout.
pub fn client(timeouts: &TimeoutConfig) -> UpstreamClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(timeouts.connect));
    connector.set_keepalive(Some(Duration::from_secs(60)));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(1024)
        .build(connector)
}

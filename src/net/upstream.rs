//! The pooled keep-alive HTTP/1.1 client used to reach replicas, over TCP or
//! TLS by the replica's scheme (see `tls.rs`).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::upstream_tls::UpstreamTls;
use crate::config::TimeoutConfig;

pub type UpstreamClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

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
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(timeouts.upstream_idle)
        // A pooled connection found closed before the request was written
        // is retried on a fresh connection by the client itself: nothing
        // was sent, so nothing can be generated twice.
        .retry_canceled_requests(true)
        .pool_max_idle_per_host(1024)
        .build(tls.connector(connector))
}

/// The client's error with its causes (`client error (Connect): invalid
/// peer certificate: UnknownIssuer`): hyper-util's own message names only
/// the stage that failed.
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

//! The `[server]` table: listeners, drain, client timeouts and limits.

use serde::Deserialize;
use std::net::SocketAddr;
use std::time::Duration;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Client-facing OpenAI-compatible listener.
    #[serde(deserialize_with = "super::duration::listen_addr")]
    pub listen: SocketAddr,
    /// Admin listener: `/metrics`, `/healthz`, `/readyz`.
    #[serde(deserialize_with = "super::duration::listen_addr")]
    pub admin_listen: SocketAddr,
    /// Largest request body accepted; larger bodies get 413.
    pub max_body_bytes: usize,
    /// How long in-flight requests may run after SIGTERM/SIGINT before the process exits.
    #[serde(with = "super::duration")]
    pub drain_timeout: Duration,
    /// Whether to accept HTTP/2 with prior knowledge (h2c) besides HTTP/1.1.
    pub http2: bool,
    /// Bearer token required by the admin listener's mutating endpoints
    /// (`POST /admin/...`); unset means they are open to whoever reaches the
    /// admin listener (which binds to loopback by default).
    pub admin_token: Option<String>,
    /// Add `x-llmlb-replica: NAME` to every proxied response (handy for load
    /// tests and debugging; off by default so replica names stay internal).
    pub replica_header: bool,
    /// How often `llmlb serve` checks the config file for changes (reload on
    /// change); "0s" turns watching off. SIGHUP and `POST /admin/reload`
    /// always reload.
    #[serde(with = "super::duration")]
    pub watch_interval: Duration,
    /// After SIGTERM: how long the client listener keeps accepting (while
    /// `/readyz` already answers 503) so load balancers in front can take
    /// llmlb out of rotation before it stops accepting.
    #[serde(with = "super::duration")]
    pub drain_delay: Duration,
    /// Largest request head (request line and headers) on HTTP/1.1; larger
    /// heads get 431. At least 8192 (hyper's smallest read buffer).
    pub max_header_bytes: usize,
    /// Most header fields in one request; more get 431.
    pub max_headers: usize,
    /// Time a client has to send a complete request head once its first byte
    /// arrived (slowloris); the connection is closed when it runs out.
    #[serde(with = "super::duration")]
    pub header_read_timeout: Duration,
    /// A client connection with no request in flight and no bytes in either
    /// direction for this long is closed.
    #[serde(with = "super::duration")]
    pub client_idle_timeout: Duration,
    /// Client connections served at once; further connections wait in the
    /// listen backlog (not accepted) until one closes.
    pub max_connections: usize,
    /// TLS termination on the client listener; unset: plain HTTP.
    pub tls: Option<TlsConfig>,
    /// Cross-origin access for browsers; unset: no CORS headers.
    pub cors: Option<super::CorsConfig>,
    /// Time to receive a request's whole body once its head is in; 408
    /// `body_timeout` after.
    #[serde(with = "super::duration")]
    pub body_timeout: Duration,
    /// Request body bytes held at once across all connections (being read
    /// or waiting to be forwarded); a request that would go beyond gets 503
    /// `server_busy`.
    pub max_buffered_bytes: usize,
}

/// `[server.tls]`: PEM files of the certificate chain (leaf first) and its
/// private key (PKCS#8, PKCS#1 or SEC1).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:8080".parse().expect("static addr"),
            admin_listen: "127.0.0.1:9090".parse().expect("static addr"),
            max_body_bytes: 32 * 1024 * 1024,
            drain_timeout: Duration::from_secs(30),
            http2: true,
            admin_token: None,
            replica_header: false,
            watch_interval: Duration::from_secs(2),
            drain_delay: Duration::from_secs(5),
            max_header_bytes: 64 * 1024,
            max_headers: 100,
            header_read_timeout: Duration::from_secs(10),
            client_idle_timeout: Duration::from_secs(60),
            max_connections: 10_000,
            tls: None,
            cors: None,
            body_timeout: Duration::from_secs(30),
            max_buffered_bytes: 256 * 1024 * 1024,
        }
    }
}

//! A small keep-alive HTTP client for the background loops: `GET` one path
//! on a replica with a deadline covering the headers and the whole body.
//! Kept apart from the request path's client so probes never queue behind
//! (or hold) connections serving inference traffic. Each pool has its own,
//! built with the pool's TLS settings, so `https://` replicas are probed
//! over TLS with the same trust as requests.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::{UpstreamTls, error_chain};

/// Largest body a probe reads (a vLLM `/metrics` page is ~100 KiB).
const MAX_BODY: usize = 8 * 1024 * 1024;

#[derive(Debug, Clone)]
pub struct Prober {
    client: Client<HttpsConnector<HttpConnector>, Empty<Bytes>>,
}

/// Why a probe failed, as a metric label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProbeError {
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("connection failed: {0}")]
    Connect(String),
    #[error("answered {0}")]
    Status(u16),
    #[error("bad body: {0}")]
    Body(String),
}

impl ProbeError {
    pub fn kind(&self) -> &'static str {
        match self {
            ProbeError::Timeout(_) => "timeout",
            ProbeError::Connect(_) => "connect",
            ProbeError::Status(_) => "status",
            ProbeError::Body(_) => "body",
        }
    }
}

impl Default for Prober {
    /// Trusting the built-in roots only.
    fn default() -> Self {
        Prober::new(&UpstreamTls::default())
    }
}

impl Prober {
    pub fn new(tls: &UpstreamTls) -> Prober {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Prober {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .pool_max_idle_per_host(2)
                .build(tls.connector(connector)),
        }
    }

    /// `GET {scheme}://{authority}{path}` on a replica; the body on a 2xx answer.
    pub async fn get_from(
        &self,
        scheme: &http::uri::Scheme,
        authority: &http::uri::Authority,
        path: &str,
        timeout: Duration,
    ) -> Result<Bytes, ProbeError> {
        self.get_authorized(scheme, authority, path, timeout, None)
            .await
    }

    /// [`Prober::get_from`] with the pool's `Authorization` for the replica
    /// (endpoints such as `/v1/models` sit behind a replica's API key).
    pub async fn get_authorized(
        &self,
        scheme: &http::uri::Scheme,
        authority: &http::uri::Authority,
        path: &str,
        timeout: Duration,
        auth: Option<&http::HeaderValue>,
    ) -> Result<Bytes, ProbeError> {
        let uri = http::Uri::builder()
            .scheme(scheme.clone())
            .authority(authority.clone())
            .path_and_query(path)
            .build()
            .map_err(|e| ProbeError::Connect(e.to_string()))?;
        self.fetch(uri, timeout, auth).await
    }

    /// `GET http://{authority}{path}`; the body on a 2xx answer.
    pub async fn get(
        &self,
        authority: &http::uri::Authority,
        path: &str,
        timeout: Duration,
    ) -> Result<Bytes, ProbeError> {
        let uri = http::Uri::builder()
            .scheme("http")
            .authority(authority.clone())
            .path_and_query(path)
            .build()
            .map_err(|e| ProbeError::Connect(e.to_string()))?;
        self.fetch(uri, timeout, None).await
    }

    async fn fetch(
        &self,
        uri: http::Uri,
        timeout: Duration,
        auth: Option<&http::HeaderValue>,
    ) -> Result<Bytes, ProbeError> {
        let mut req = http::Request::get(uri);
        if let Some(v) = auth {
            req = req.header(http::header::AUTHORIZATION, v.clone());
        }
        let req = req
            .body(Empty::new())
            .map_err(|e| ProbeError::Connect(e.to_string()))?;
        let work = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| ProbeError::Connect(error_chain(&e)))?;
            let status = resp.status();
            let body = Limited::new(resp.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| ProbeError::Body(e.to_string()))?
                .to_bytes();
            if status.is_success() {
                Ok(body)
            } else {
                Err(ProbeError::Status(status.as_u16()))
            }
        };
        tokio::time::timeout(timeout, work)
            .await
            .unwrap_or(Err(ProbeError::Timeout(timeout)))
    }
}

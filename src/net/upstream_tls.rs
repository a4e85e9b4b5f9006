//! TLS to replicas with `https://` URLs: rustls with the `ring` provider,
//! TLS 1.2 and 1.3, HTTP/1.1 inside. One connector serves both schemes, so a
//! pool may mix `http://` and `https://` replicas; the request's URI scheme
//! (the replica's) decides.
//!
//! Trust: the Mozilla root program compiled in by `webpki-roots`, plus the
//! certificates of the pool's `tls.ca_file`. Compiled-in roots rather than
//! the operating system's store: llmlb then verifies the same way in a
//! minimal container image (which often ships no CA store) as on a host,
//! and building a client cannot fail on an unreadable system store.
//! Replicas behind a private CA, the usual case inside a cluster, name that
//! CA in `ca_file`.
//!
//! `tls.server_name` replaces the URL host as SNI and as the name the
//! certificate must carry. The TLS handshake is not part of
//! `timeouts.connect` (TCP only); it counts against `timeouts.first_byte`.

use hyper_rustls::{FixedServerNameResolver, HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use std::sync::Arc;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

use crate::config::{UpstreamTlsConfig, UpstreamTlsError, UpstreamTrust};

/// A pool's client-side TLS settings, read once, ready to build connectors.
#[derive(Debug, Clone)]
pub struct UpstreamTls {
    config: ClientConfig,
    server_name: Option<ServerName<'static>>,
    fingerprint: String,
}

impl Default for UpstreamTls {
    /// Built-in roots only, names from the URLs.
    fn default() -> Self {
        UpstreamTls::from_trust(UpstreamTrust::builtin())
    }
}

impl UpstreamTls {
    /// Reads the CA bundle (if any) and checks the name override.
    pub fn new(cfg: &UpstreamTlsConfig) -> Result<UpstreamTls, UpstreamTlsError> {
        UpstreamTrust::read(cfg).map(UpstreamTls::from_trust)
    }

    fn from_trust(trust: UpstreamTrust) -> UpstreamTls {
        UpstreamTls {
            config: client_config(trust.roots),
            server_name: trust.server_name,
            fingerprint: trust.fingerprint,
        }
    }

    /// Identifies the trusted CA certificates and the name override, so a
    /// reload that changes them (even behind the same file path) is noticed.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Wraps `http` (its TCP settings kept) so `https://` URIs get TLS.
    pub fn connector(&self, mut http: HttpConnector) -> HttpsConnector<HttpConnector> {
        http.enforce_http(false);
        let mut builder = HttpsConnectorBuilder::new()
            .with_tls_config(self.config.clone())
            .https_or_http();
        if let Some(name) = &self.server_name {
            builder = builder.with_server_name_resolver(FixedServerNameResolver::new(name.clone()));
        }
        builder.enable_http1().wrap_connector(http)
    }
}

fn client_config(roots: RootCertStore) -> ClientConfig {
    ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .expect("the ring provider supports TLS 1.2 and 1.3")
        .with_root_certificates(roots)
        .with_no_client_auth()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprint_follows_the_settings() {
        let plain = UpstreamTls::new(&UpstreamTlsConfig::default()).unwrap();
        let named = UpstreamTls::new(&UpstreamTlsConfig {
            ca_file: None,
            server_name: Some("vllm.internal".into()),
        })
        .unwrap();
        assert_eq!(
            plain.fingerprint(),
            UpstreamTls::new(&UpstreamTlsConfig::default())
                .unwrap()
                .fingerprint()
        );
        assert_ne!(plain.fingerprint(), named.fingerprint());
    }

    #[test]
    fn fingerprint_follows_the_ca_file_content() {
        let path = std::env::temp_dir().join(format!("llmlb-ca-{}.pem", std::process::id()));
        let cfg = UpstreamTlsConfig {
            ca_file: Some(path.clone()),
            server_name: None,
        };
        let mut seen = Vec::new();
        for _ in 0..2 {
            let ca = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
            std::fs::write(&path, ca.cert.pem()).unwrap();
            seen.push(UpstreamTls::new(&cfg).unwrap().fingerprint().to_string());
        }
        let _ = std::fs::remove_file(&path);
        assert_ne!(seen[0], seen[1], "same path, new certificate");
        assert_ne!(seen[0], UpstreamTls::default().fingerprint());
    }
}

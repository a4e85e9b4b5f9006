//! The certificate files a config names, read and checked: the client
//! listener's chain and key (`[server.tls]`) and a pool's CA bundle and name
//! override (`[pools.tls]`). Validation reads them once to name a bad file
//! under its key; the listener and the upstream client build their rustls
//! settings from what is read here, so both see the same files the same way.
//!
//! rustls with the `ring` provider, TLS 1.2 and 1.3. Cost: one read and parse
//! of each PEM file per call (at start and on reload, never per request).

use std::path::Path;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::{RootCertStore, ServerConfig};

use super::{TlsConfig, UpstreamTlsConfig};

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {what} {path}: {reason}")]
    Pem {
        what: &'static str,
        path: String,
        reason: String,
    },
    #[error("{0} holds no certificate")]
    NoCertificate(String),
    #[error("certificate and key do not make a TLS config: {0}")]
    Config(String),
}

/// The listener's rustls settings from the configured PEM files, with ALPN
/// `h2` (when HTTP/2 is on) and `http/1.1`.
pub fn server_tls(tls: &TlsConfig, http2: bool) -> Result<ServerConfig, TlsError> {
    let certs = load_certs("certificate chain", &tls.cert)?;
    let key = PrivateKeyDer::from_pem_file(&tls.key).map_err(|e| TlsError::Pem {
        what: "private key",
        path: tls.key.display().to_string(),
        reason: e.to_string(),
    })?;
    let mut config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Config(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| TlsError::Config(e.to_string()))?;
    config.alpn_protocols = if http2 {
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    } else {
        vec![b"http/1.1".to_vec()]
    };
    Ok(config)
}

/// Every certificate of a PEM file (`what` names the file's role in errors).
fn load_certs(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::Pem {
            what,
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(path.display().to_string()));
    }
    Ok(certs)
}

#[derive(Debug, thiserror::Error)]
pub enum UpstreamTlsError {
    #[error(transparent)]
    CaFile(TlsError),
    #[error("certificate {index} of {path} is not a usable CA: {reason}")]
    BadCa {
        index: usize,
        path: String,
        reason: String,
    },
    #[error("{0:?} is neither a DNS name nor an IP address")]
    ServerName(String),
}

impl UpstreamTlsError {
    /// The `[pools.tls]` key the problem is about.
    pub fn key(&self) -> &'static str {
        match self {
            UpstreamTlsError::ServerName(_) => "server_name",
            UpstreamTlsError::CaFile(_) | UpstreamTlsError::BadCa { .. } => "ca_file",
        }
    }
}

/// What a pool trusts: the built-in roots plus its CA bundle, the name its
/// replicas' certificates must carry (when overridden), and a fingerprint of
/// both so a reload that changes them (even behind the same path) is noticed.
#[derive(Debug, Clone)]
pub struct UpstreamTrust {
    pub roots: RootCertStore,
    pub server_name: Option<ServerName<'static>>,
    pub fingerprint: String,
}

impl UpstreamTrust {
    /// Built-in roots only, names from the URLs.
    pub fn builtin() -> UpstreamTrust {
        UpstreamTrust {
            roots: builtin_roots(),
            server_name: None,
            fingerprint: "builtin".into(),
        }
    }

    /// Reads the CA bundle (if any) and checks the name override.
    pub fn read(cfg: &UpstreamTlsConfig) -> Result<UpstreamTrust, UpstreamTlsError> {
        let mut roots = builtin_roots();
        let mut digest = Sha256::new();
        if let Some(path) = &cfg.ca_file {
            let certs = load_certs("CA bundle", path).map_err(UpstreamTlsError::CaFile)?;
            for (index, cert) in certs.into_iter().enumerate() {
                digest.update(cert.as_ref());
                roots.add(cert).map_err(|e| UpstreamTlsError::BadCa {
                    index,
                    path: path.display().to_string(),
                    reason: e.to_string(),
                })?;
            }
        }
        let server_name = match &cfg.server_name {
            Some(name) => Some(
                ServerName::try_from(name.clone())
                    .map_err(|_| UpstreamTlsError::ServerName(name.clone()))?,
            ),
            None => None,
        };
        digest.update(format!("{:?}", cfg.server_name).as_bytes());
        let fingerprint = digest.finalize()[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Ok(UpstreamTrust {
            roots,
            server_name,
            fingerprint,
        })
    }
}

fn builtin_roots() -> RootCertStore {
    RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_files_are_named_in_the_error() {
        let tls = TlsConfig {
            cert: "/nonexistent/cert.pem".into(),
            key: "/nonexistent/key.pem".into(),
        };
        let err = server_tls(&tls, true).expect_err("no files");
        assert!(err.to_string().contains("/nonexistent/cert.pem"), "{err}");
    }

    #[test]
    fn missing_ca_file_is_named() {
        let cfg = UpstreamTlsConfig {
            ca_file: Some("/nonexistent/ca.pem".into()),
            server_name: None,
        };
        let err = UpstreamTrust::read(&cfg).expect_err("no file");
        assert_eq!(err.key(), "ca_file");
        assert!(err.to_string().contains("/nonexistent/ca.pem"), "{err}");
    }

    #[test]
    fn server_name_must_be_a_name_or_address() {
        let mut cfg = UpstreamTlsConfig {
            ca_file: None,
            server_name: Some("vllm.internal".into()),
        };
        assert!(UpstreamTrust::read(&cfg).is_ok());
        cfg.server_name = Some("10.0.0.7".into());
        assert!(UpstreamTrust::read(&cfg).is_ok());
        cfg.server_name = Some("not a name".into());
        let err = UpstreamTrust::read(&cfg).expect_err("spaces");
        assert_eq!(err.key(), "server_name");
    }
}

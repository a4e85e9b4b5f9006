//! TLS termination on the client listener (`[server.tls]`): rustls with the
//! `ring` provider, TLS 1.2 and 1.3, ALPN `h2` (when HTTP/2 is on) and
//! `http/1.1`. The certificate chain and private key are PEM files read once
//! at start.
//!
//! The handshake is bounded by `server.header_read_timeout` (it counts as
//! part of reading the first request head); a failed handshake closes the
//! connection.

use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

use super::connection::TrackedIo;
use crate::config::TlsConfig;

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

/// Builds the acceptor from the configured PEM files.
pub fn acceptor(tls: &TlsConfig, http2: bool) -> Result<TlsAcceptor, TlsError> {
    let certs = load_certs("certificate chain", &tls.cert)?;
    let key = PrivateKeyDer::from_pem_file(&tls.key).map_err(|e| TlsError::Pem {
        what: "private key",
        path: tls.key.display().to_string(),
        reason: e.to_string(),
    })?;
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
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
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Every certificate of a PEM file (`what` names the file's role in errors);
/// also read for the CA bundles that check replicas' certificates.
pub(crate) fn load_certs(
    what: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
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

/// A client socket, in the clear or behind TLS.
pub enum ClientIo {
    Plain(TrackedIo<TcpStream>),
    Tls(Box<tokio_rustls::server::TlsStream<TrackedIo<TcpStream>>>),
}

impl AsyncRead for ClientIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ClientIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ClientIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ClientIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientIo::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            ClientIo::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            ClientIo::Plain(s) => s.is_write_vectored(),
            ClientIo::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientIo::Plain(s) => Pin::new(s).poll_flush(cx),
            ClientIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ClientIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
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
        let err = acceptor(&tls, true).err().expect("no files");
        assert!(err.to_string().contains("/nonexistent/cert.pem"), "{err}");
    }
}

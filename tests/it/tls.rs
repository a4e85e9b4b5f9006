//! TLS termination on the client listener, with a self-signed certificate
//! generated for the test: HTTPS is proxied to a plain-HTTP replica, a
//! cleartext request on the TLS port reaches nothing, and unreadable key
//! material is a config error naming `server.tls`.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::rustls::{ClientConfig, RootCertStore, crypto::ring};

struct Certs {
    dir: std::path::PathBuf,
    cert_der: Vec<u8>,
}

impl Certs {
    fn new(tag: &str) -> Certs {
        let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let dir = std::env::temp_dir().join(format!("llmlb-tls-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("cert.pem"), generated.cert.pem()).unwrap();
        std::fs::write(dir.join("key.pem"), generated.signing_key.serialize_pem()).unwrap();
        Certs {
            dir,
            cert_der: generated.cert.der().to_vec(),
        }
    }

    fn server_toml(&self) -> String {
        format!(
            "[server.tls]\ncert = \"{}\"\nkey = \"{}\"\n",
            self.dir.join("cert.pem").display(),
            self.dir.join("key.pem").display()
        )
    }

    fn connector(&self) -> TlsConnector {
        let mut roots = RootCertStore::empty();
        roots.add(self.cert_der.clone().into()).unwrap();
        let config = ClientConfig::builder_with_provider(Arc::new(ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        TlsConnector::from(Arc::new(config))
    }

    /// A TLS handshake with `addr` as `localhost`, trusting only this certificate.
    async fn handshake(
        &self,
        addr: std::net::SocketAddr,
    ) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(addr).await?;
        self.connector()
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[tokio::test]
async fn https_is_terminated_and_proxied_to_a_plain_replica() {
    let certs = Certs::new("ok");
    let (up, lb) = one_replica(Mode::Json, &certs.server_toml(), "").await;

    let tls = certs
        .handshake(lb.addr)
        .await
        .expect("TLS handshake with llmlb");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    for _ in 0..2 {
        let resp = sender
            .send_request(chat_request("/v1/chat/completions", CHAT))
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert!(String::from_utf8_lossy(&body).contains("\"replica\":\"a\""));
    }
    assert_eq!(up.requests(), 2, "two requests on one TLS connection");
    assert_eq!(up.last_seen().body, CHAT.as_bytes());

    // Cleartext HTTP on the TLS port gets no HTTP answer and reaches nothing.
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{CHAT}",
        CHAT.len()
    );
    let resp = raw_exchange(lb.addr, raw.as_bytes(), false, Duration::from_secs(10)).await;
    assert_eq!(raw_status(&resp), None);
    assert_eq!(up.requests(), 2);
    lb.shutdown().await;
}

#[tokio::test]
async fn untrusted_clients_fail_the_handshake() {
    let certs = Certs::new("untrusted");
    let other = Certs::new("other");
    let (up, lb) = one_replica(Mode::Json, &certs.server_toml(), "").await;
    // A client trusting another certificate refuses llmlb's.
    let result = other.handshake(lb.addr).await;
    assert!(result.is_err());
    assert_eq!(up.requests(), 0);
    lb.shutdown().await;
}

#[test]
fn unreadable_key_material_is_a_config_error() {
    let certs = Certs::new("bad");
    std::fs::write(certs.dir.join("key.pem"), "not a key").unwrap();
    let issues = llmlb::config::parse(&format!(
        "{}{}",
        certs.server_toml(),
        one_pool("round_robin", &[("http://127.0.0.1:1", 1)], "")
    ))
    .unwrap_err();
    assert_eq!(issues.len(), 1, "{issues:?}");
    assert_eq!(issues[0].key, "server.tls");
    assert!(issues[0].reason.contains("key.pem"), "{issues:?}");
}

//! HTTPS to replicas: a loopback replica behind TLS (a self-signed
//! certificate generated for the test) streams a chat completion through
//! llmlb when `[pools.tls] ca_file` trusts its certificate, and answers the
//! health checks and `/metrics` scrapes over TLS too; without the CA the
//! request is a 502 and the replica sees no request; a bad `ca_file` is a
//! config error naming `pools[0].tls.ca_file`.

use crate::common;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{Notify, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::crypto::ring;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// The SSE events the replica streams, in order.
const EVENTS: [&str; 4] = [
    "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n",
    "data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\n",
    "data: {\"choices\":[{\"delta\":{}}],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2}}\n\n",
    "data: [DONE]\n\n",
];

const METRICS: &str = "# TYPE vllm:num_requests_running gauge\n\
vllm:num_requests_running{model_name=\"llama-3-8b\"} 3.0\n\
# TYPE vllm:num_requests_waiting gauge\n\
vllm:num_requests_waiting{model_name=\"llama-3-8b\"} 7.0\n";

/// A temporary directory holding one PEM file, removed at the end.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("llmlb-https-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// An OpenAI-style replica on a loopback TLS port.
struct TlsReplica {
    addr: SocketAddr,
    cert_pem: String,
    /// Paths of the requests that got through the handshake.
    paths: Arc<Mutex<Vec<String>>>,
    seen: Arc<Notify>,
}

impl TlsReplica {
    /// Serves with a self-signed certificate for `names`.
    async fn start(names: &[&str]) -> TlsReplica {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let generated = rcgen::generate_simple_self_signed(names).unwrap();
        let cert = CertificateDer::from(generated.cert.der().to_vec());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(
            generated.signing_key.serialize_der(),
        ));
        let mut config = ServerConfig::builder_with_provider(Arc::new(ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert], key)
            .unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let replica = TlsReplica {
            addr: listener.local_addr().unwrap(),
            cert_pem: generated.cert.pem(),
            paths: Arc::default(),
            seen: Arc::default(),
        };
        let (paths, seen) = (replica.paths.clone(), replica.seen.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, paths, seen) = (acceptor.clone(), paths.clone(), seen.clone());
                tokio::spawn(async move {
                    // A client that does not trust the certificate ends here.
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let svc = service_fn(move |req| {
                        let (paths, seen) = (paths.clone(), seen.clone());
                        async move { Ok::<_, Infallible>(answer(req, &paths, &seen).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        replica
    }

    fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    fn count(&self, path: &str) -> usize {
        self.paths
            .lock()
            .unwrap()
            .iter()
            .filter(|p| *p == path)
            .count()
    }
}

async fn answer(
    req: Request<Incoming>,
    paths: &Mutex<Vec<String>>,
    seen: &Notify,
) -> Response<ChannelBody> {
    let path = req.uri().path().to_string();
    let _ = req.into_body().collect().await;
    paths.lock().unwrap().push(path.clone());
    seen.notify_waiters();
    let (content_type, chunks): (&str, Vec<&'static str>) = match path.as_str() {
        "/v1/chat/completions" => ("text/event-stream", EVENTS.to_vec()),
        "/metrics" => ("text/plain", vec![METRICS]),
        _ => ("text/plain", vec!["ok"]),
    };
    // Each event is its own frame, handed over one at a time.
    let (tx, rx) = mpsc::channel::<Bytes>(1);
    tokio::spawn(async move {
        for chunk in chunks {
            if tx.send(Bytes::from_static(chunk.as_bytes())).await.is_err() {
                return;
            }
        }
    });
    let mut resp = Response::new(ChannelBody::Channel(rx));
    resp.headers_mut()
        .insert("content-type", content_type.parse().unwrap());
    resp
}

fn stream_request() -> Request<Full<Bytes>> {
    chat_request("/v1/chat/completions", CHAT_STREAM)
}

#[tokio::test]
async fn streams_from_an_https_replica_trusted_by_ca_file() {
    let replica = TlsReplica::start(&["localhost", "127.0.0.1"]).await;
    let dir = TempDir::new("trusted");
    let ca = dir.write("ca.pem", &replica.cert_pem);
    let extra = format!(
        "[pools.tls]\nca_file = \"{}\"\n\
         [pools.health]\nenabled = true\ninterval = \"100ms\"\ntimeout = \"100ms\"\n\
         [pools.scrape]\nenabled = true\ninterval = \"100ms\"\ntimeout = \"100ms\"\nstaleness = \"10s\"\n",
        ca.display()
    );
    let lb = start_llmlb(&one_pool("round_robin", &[(&replica.url(), 1)], &extra)).await;

    let (status, headers, body) = call(lb.addr, stream_request()).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(headers["content-type"], "text/event-stream");
    assert_eq!(String::from_utf8_lossy(&body), EVENTS.concat());
    assert_eq!(replica.count("/v1/chat/completions"), 1);

    // The background loops reach the replica over TLS as well: health
    // checks get through the handshake and the scraped load shows up.
    let waiting = [("pool", "llama"), ("state", "waiting")];
    tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let seen = replica.seen.notified();
            let text = metrics_text(lb.admin_addr).await;
            if replica.count("/health") >= 2
                && metric_value(&text, "llmlb_replica_scraped_requests", &waiting) == 7.0
            {
                return;
            }
            seen.await;
        }
    })
    .await
    .expect("health checks and scrapes over TLS within 10s");
    lb.shutdown().await;
}

#[tokio::test]
async fn server_name_override_checks_the_certificate_against_that_name() {
    // The certificate names a service, not the address llmlb dials.
    let replica = TlsReplica::start(&["vllm.internal"]).await;
    let dir = TempDir::new("server-name");
    let ca = dir.write("ca.pem", &replica.cert_pem);
    let with_name = format!(
        "[pools.tls]\nca_file = \"{}\"\nserver_name = \"vllm.internal\"\n",
        ca.display()
    );
    let lb = start_llmlb(&one_pool("round_robin", &[(&replica.url(), 1)], &with_name)).await;
    let (status, _, body) = call(lb.addr, stream_request()).await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    assert_eq!(String::from_utf8_lossy(&body), EVENTS.concat());
    lb.shutdown().await;

    // Without the override the address does not match the certificate.
    let without = format!("[pools.tls]\nca_file = \"{}\"\n", ca.display());
    let lb = start_llmlb(&one_pool("round_robin", &[(&replica.url(), 1)], &without)).await;
    let (status, _, body) = call(lb.addr, stream_request()).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert_eq!(error_code(&body), "upstream_unavailable");
    assert_eq!(replica.count("/v1/chat/completions"), 1);
    lb.shutdown().await;
}

#[tokio::test]
async fn untrusted_replica_certificate_is_a_502() {
    let replica = TlsReplica::start(&["localhost", "127.0.0.1"]).await;
    let lb = start_llmlb(&one_pool("round_robin", &[(&replica.url(), 1)], "")).await;
    let (status, headers, body) = call(lb.addr, stream_request()).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY);
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/json")
    );
    assert_eq!(error_code(&body), "upstream_unavailable");
    // The handshake failed, so no request reached the replica.
    assert_eq!(replica.count("/v1/chat/completions"), 0);
    let text = metrics_text(lb.admin_addr).await;
    assert!(
        metric_value(
            &text,
            "llmlb_upstream_errors_total",
            &[("pool", "llama"), ("kind", "connect")]
        ) >= 1.0,
        "{text}"
    );
    lb.shutdown().await;
}

#[test]
fn bad_ca_file_is_a_config_error() {
    let dir = TempDir::new("bad-ca");
    let cases = [
        (dir.write("empty.pem", "not a certificate\n"), "holds no"),
        (
            dir.write(
                "garbled.pem",
                "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            ),
            "not a usable CA",
        ),
        (dir.0.join("missing.pem"), "missing.pem"),
    ];
    for (path, reason) in cases {
        let extra = format!("[pools.tls]\nca_file = \"{}\"\n", path.display());
        let issues = llmlb::config::parse(&one_pool(
            "round_robin",
            &[("https://127.0.0.1:8443", 1)],
            &extra,
        ))
        .unwrap_err();
        assert_eq!(issues.len(), 1, "{issues:?}");
        assert_eq!(issues[0].key, "pools[0].tls.ca_file");
        assert!(issues[0].reason.contains(reason), "{issues:?}");
        assert!(
            issues[0].reason.contains(&*path.to_string_lossy()),
            "{issues:?}"
        );
    }
}

//! Small OpenAI-style replicas on loopback for the signal and health tests:
//! real hyper servers on `127.0.0.1:0` whose `/metrics` text, `/health`
//! answer and `/v1/chat/completions` behaviour the test controls.

#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;

/// How `/v1/chat/completions` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    Ok = 0,
    Fail500 = 1,
    Full503 = 2,
    Hang = 3,
}

#[derive(Debug)]
pub struct Fake {
    pub addr: SocketAddr,
    mode: AtomicU8,
    health_hangs: AtomicBool,
    metrics_fail: AtomicBool,
    metrics: Mutex<String>,
    /// Delay before the first streamed token (queueing and prefill), in milliseconds.
    pub first_token_delay_ms: AtomicU64,
    /// Delay between two streamed tokens, in milliseconds.
    pub token_delay_ms: AtomicU64,
    pub tokens: AtomicU64,
    /// Chat requests received.
    pub chats: AtomicU64,
    pub health_checks: AtomicU64,
    pub scrapes: AtomicU64,
}

impl Fake {
    pub async fn start() -> Arc<Fake> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let fake = Arc::new(Fake {
            addr: listener.local_addr().unwrap(),
            mode: AtomicU8::new(Mode::Ok as u8),
            health_hangs: AtomicBool::new(false),
            metrics_fail: AtomicBool::new(false),
            metrics: Mutex::new(vllm_metrics(0, 0, 0.0)),
            first_token_delay_ms: AtomicU64::new(0),
            token_delay_ms: AtomicU64::new(1),
            tokens: AtomicU64::new(4),
            chats: AtomicU64::new(0),
            health_checks: AtomicU64::new(0),
            scrapes: AtomicU64::new(0),
        });
        let f = Arc::clone(&fake);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let f = Arc::clone(&f);
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let f = Arc::clone(&f);
                        async move { Ok::<_, Infallible>(f.answer(req).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .http1_only()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        fake
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_mode(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }

    pub fn set_health_hangs(&self, hangs: bool) {
        self.health_hangs.store(hangs, Ordering::SeqCst);
    }

    pub fn set_metrics_fail(&self, fail: bool) {
        self.metrics_fail.store(fail, Ordering::SeqCst);
    }

    pub fn set_metrics(&self, text: String) {
        *self.metrics.lock().unwrap() = text;
    }

    pub fn chats(&self) -> u64 {
        self.chats.load(Ordering::SeqCst)
    }

    async fn answer(&self, req: Request<Incoming>) -> Response<BoxBody<Bytes, Infallible>> {
        match req.uri().path() {
            "/metrics" => {
                self.scrapes.fetch_add(1, Ordering::SeqCst);
                if self.metrics_fail.load(Ordering::SeqCst) {
                    return text(StatusCode::INTERNAL_SERVER_ERROR, "boom".into());
                }
                let body = self.metrics.lock().unwrap().clone();
                text(StatusCode::OK, body)
            }
            "/health" => {
                self.health_checks.fetch_add(1, Ordering::SeqCst);
                if self.health_hangs.load(Ordering::SeqCst) {
                    std::future::pending::<()>().await;
                }
                text(StatusCode::OK, String::new())
            }
            "/v1/chat/completions" => {
                self.chats.fetch_add(1, Ordering::SeqCst);
                let body = req.into_body().collect().await.unwrap().to_bytes();
                let stream = String::from_utf8_lossy(&body).contains("\"stream\":true");
                match self.mode.load(Ordering::SeqCst) {
                    1 => text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        r#"{"error":{"message":"engine died"}}"#.into(),
                    ),
                    2 => text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        r#"{"error":{"message":"queue full"}}"#.into(),
                    ),
                    3 => {
                        std::future::pending::<()>().await;
                        unreachable!()
                    }
                    _ if stream => self.stream(),
                    _ => text(
                        StatusCode::OK,
                        r#"{"object":"chat.completion","choices":[{"message":{"role":"assistant","content":"ok"}}]}"#.into(),
                    ),
                }
            }
            _ => text(StatusCode::NOT_FOUND, String::new()),
        }
    }

    fn stream(&self) -> Response<BoxBody<Bytes, Infallible>> {
        let n = self.tokens.load(Ordering::SeqCst);
        let first = Duration::from_millis(self.first_token_delay_ms.load(Ordering::SeqCst));
        let delay = Duration::from_millis(self.token_delay_ms.load(Ordering::SeqCst));
        let events = futures_util::stream::unfold(0u64, move |i| async move {
            if i > n {
                return None;
            }
            tokio::time::sleep(if i == 0 { first + delay } else { delay }).await;
            let chunk = if i == n {
                "data: [DONE]\n\n".to_string()
            } else {
                format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"t{i} \"}}}}]}}\n\n")
            };
            Some((Ok::<_, Infallible>(Frame::data(Bytes::from(chunk))), i + 1))
        });
        let mut resp = Response::new(StreamBody::new(events).boxed());
        resp.headers_mut()
            .insert("content-type", "text/event-stream".parse().unwrap());
        resp
    }
}

fn text(status: StatusCode, body: String) -> Response<BoxBody<Bytes, Infallible>> {
    let mut resp = Response::new(Full::new(Bytes::from(body)).boxed());
    *resp.status_mut() = status;
    resp
}

/// A vLLM-shaped `/metrics` page with one engine.
pub fn vllm_metrics(running: u64, waiting: u64, kv: f64) -> String {
    let m = "model_name=\"tiny\"";
    format!(
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n\
         # TYPE vllm:num_requests_running gauge\n\
         vllm:num_requests_running{{engine=\"0\",{m}}} {running}.0\n\
         # HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{engine=\"0\",{m}}} {waiting}.0\n\
         # HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n\
         # TYPE vllm:kv_cache_usage_perc gauge\n\
         vllm:kv_cache_usage_perc{{engine=\"0\",{m}}} {kv}\n"
    )
}

/// A running llmlb in front of the fakes, and a client to talk to it.
pub struct Proxy {
    pub running: llmlb::daemon::Running,
    client: hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        Full<Bytes>,
    >,
}

impl Proxy {
    /// Starts llmlb with one pool `p` serving model `m` over `fakes`;
    /// `pool_extra` is TOML added inside the pool (keys, then sub-tables).
    pub async fn start(fakes: &[&Arc<Fake>], pool_keys: &str, pool_tables: &str) -> Proxy {
        let mut toml = format!(
            "[server]\nlisten = \"127.0.0.1:1\"\nadmin_listen = \"127.0.0.1:2\"\ndrain_timeout = \"1s\"\n\
             [[pools]]\nname = \"p\"\nmodels = [\"m\"]\n{pool_keys}\n{pool_tables}\n"
        );
        for f in fakes {
            toml.push_str(&format!("[[pools.replicas]]\nurl = \"{}\"\n", f.url()));
        }
        let config = llmlb::config::parse(&toml).unwrap_or_else(|e| panic!("{e:?}\n{toml}"));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let admin = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let running = llmlb::daemon::start(config, listener, admin).unwrap();
        let client = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .build(hyper_util::client::legacy::connect::HttpConnector::new());
        Proxy { running, client }
    }

    /// Sends one chat request; returns the status and the whole body.
    pub async fn chat(&self, stream: bool, max_tokens: u32) -> (u16, String) {
        let body = format!(
            r#"{{"model":"m","stream":{stream},"max_tokens":{max_tokens},"messages":[{{"role":"user","content":"hello there, how are you today?"}}]}}"#
        );
        let req = Request::post(format!("http://{}/v1/chat/completions", self.running.addr))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let resp = tokio::time::timeout(Duration::from_secs(10), self.client.request(req))
            .await
            .expect("proxy answered within 10 s")
            .unwrap();
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// Starts a streamed chat and returns the response with its body unread.
    pub async fn open_stream(&self, max_tokens: u32) -> Response<Incoming> {
        let body = format!(
            r#"{{"model":"m","stream":true,"max_tokens":{max_tokens},"messages":[{{"role":"user","content":"tell me a long story"}}]}}"#
        );
        let req = Request::post(format!("http://{}/v1/chat/completions", self.running.addr))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        self.client.request(req).await.unwrap()
    }

    async fn admin_get(&self, path: &str) -> String {
        let req = Request::get(format!("http://{}{path}", self.running.admin_addr))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = self.client.request(req).await.unwrap();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8_lossy(&body).into_owned()
    }

    /// `GET /admin/replicas`, the replica of pool `p` at `addr`.
    pub async fn replica(&self, fake: &Fake) -> serde_json::Value {
        let v: serde_json::Value =
            serde_json::from_str(&self.admin_get("/admin/replicas").await).unwrap();
        v["pools"][0]["replicas"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["address"] == fake.addr.to_string())
            .cloned()
            .unwrap()
    }

    /// The admin `/metrics` text.
    pub async fn metrics(&self) -> String {
        self.admin_get("/metrics").await
    }

    /// Polls `/admin/replicas` every 20 ms until `ok` holds for `fake`'s entry;
    /// panics after `limit`.
    pub async fn wait_for(
        &self,
        fake: &Fake,
        limit: Duration,
        what: &str,
        ok: impl Fn(&serde_json::Value) -> bool,
    ) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let r = self.replica(fake).await;
            if ok(&r) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}: {r}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn stop(self) {
        self.running.shutdown().await;
    }
}

/// The value of the first line of `metrics` that starts with `series`.
pub fn metric_value(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

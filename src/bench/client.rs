//! The streaming OpenAI client: sends one request and times its stream.
//!
//! A pooled keep-alive HTTP/1.1 client (hyper-util, `TCP_NODELAY`) posts to
//! `/v1/completions` or `/v1/chat/completions` with `"stream": true`,
//! `"stream_options": {"include_usage": true}`, `"ignore_eos": true` and
//! `max_tokens`, so a vLLM server produces exactly the requested length.
//! Time runs from just before the request is handed to the connection:
//! TTFT at the first frame holding non-empty content, one inter-token gap per
//! later content event (events that arrive in the same frame get a gap of
//! zero, which is what the user sees), end-to-end at the end of the stream.
//! The timeout is one deadline for the whole request, checked at every
//! await, so a timed-out request keeps whatever it measured.

use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, CONTENT_TYPE, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::json;
use tokio::time::{Instant, timeout_at};

use super::error::BenchError;
use super::record::{Outcome, RequestRecord};
use super::sse::{Chunk, SseParser, classify};
use super::workload::{Prompt, RequestSpec};

/// The response header naming the replica that served a request through llmlb.
pub const REPLICA_HEADER: &str = "x-llmlb-replica";

pub struct BenchClient {
    http: Client<HttpConnector, Full<Bytes>>,
    /// Per target: its completions and chat URIs. Requests take the
    /// targets in turn (several llmlb instances behind one client fleet).
    targets: Vec<(Uri, Uri)>,
    next: std::sync::atomic::AtomicUsize,
    headers: HeaderMap,
    model: String,
    timeout: Duration,
}

/// Checks `target` and returns its base (no trailing `/` or `/v1`).
pub fn parse_target(target: &str, allow_remote: bool) -> Result<String, BenchError> {
    let invalid = |reason: &str| BenchError::InvalidTarget {
        target: target.to_owned(),
        reason: reason.to_owned(),
    };
    let uri: Uri = target.parse().map_err(|_| invalid("not a URL"))?;
    if uri.scheme_str() != Some("http") {
        return Err(invalid("only http:// targets are supported"));
    }
    let host = uri.host().ok_or_else(|| invalid("no host"))?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let local = bare.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if !local && !allow_remote {
        return Err(BenchError::RemoteTarget { host: host.into() });
    }
    if uri.query().is_some() {
        return Err(invalid("a query string is not allowed"));
    }
    let base = target.trim_end_matches('/');
    Ok(base.strip_suffix("/v1").unwrap_or(base).to_owned())
}

impl BenchClient {
    pub fn new(
        target: &str,
        allow_remote: bool,
        model: &str,
        extra: &[(String, String)],
        api_key: Option<&str>,
        timeout: Duration,
    ) -> Result<Self, BenchError> {
        let mut targets = Vec::new();
        for one in target.split(',').map(str::trim) {
            let base = parse_target(one, allow_remote)?;
            let uri = |path: &str| {
                format!("{base}{path}")
                    .parse::<Uri>()
                    .map_err(|e| BenchError::InvalidTarget {
                        target: one.into(),
                        reason: e.to_string(),
                    })
            };
            targets.push((uri("/v1/completions")?, uri("/v1/chat/completions")?));
        }
        let mut headers = HeaderMap::new();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(key) = api_key {
            let v = HeaderValue::from_str(&format!("Bearer {key}"))
                .map_err(|_| BenchError::InvalidSpec("--api-key has invalid characters".into()))?;
            headers.insert(AUTHORIZATION, v);
        }
        for (k, v) in extra {
            let name = HeaderName::from_bytes(k.trim().as_bytes())
                .map_err(|_| BenchError::InvalidSpec(format!("invalid header name `{k}`")))?;
            let value = HeaderValue::from_str(v.trim())
                .map_err(|_| BenchError::InvalidSpec(format!("invalid value for header `{k}`")))?;
            headers.append(name, value);
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(10)));
        // Idle connections are dropped before a server's own keep-alive
        // closes them (uvicorn's, in front of vLLM, is 5 s): a request sent
        // on a connection the server is closing fails with "connection
        // closed before message completed" (8 of 62 probes of a calibration
        // between two of its phases did).
        let http = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(4))
            .pool_max_idle_per_host(usize::MAX)
            .build(connector);
        Ok(BenchClient {
            http,
            targets,
            next: std::sync::atomic::AtomicUsize::new(0),
            headers,
            model: model.to_owned(),
            timeout,
        })
    }

    fn request(&self, spec: &RequestSpec) -> Request<Full<Bytes>> {
        let mut body = json!({
            "model": self.model,
            "max_tokens": spec.output_tokens,
            "stream": true,
            "stream_options": {"include_usage": true},
            "ignore_eos": true,
        });
        let turn = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (completions, chat) = &self.targets[turn % self.targets.len()];
        let uri = match &spec.prompt {
            Prompt::Text(t) => {
                body["prompt"] = json!(t);
                completions.clone()
            }
            Prompt::Tokens(ids) => {
                body["prompt"] = json!(ids);
                completions.clone()
            }
            Prompt::Chat(messages) => {
                body["messages"] = messages
                    .iter()
                    .map(|(role, content)| json!({"role": role, "content": content}))
                    .collect();
                chat.clone()
            }
        };
        let bytes = serde_json::to_vec(&body).expect("a JSON value always serializes");
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .body(Full::new(Bytes::from(bytes)))
            .expect("method, URI and body are valid");
        *req.headers_mut() = self.headers.clone();
        req
    }

    /// Sends `spec` and measures it; `run_start` anchors `start_ms`.
    pub async fn send(&self, spec: &RequestSpec, run_start: Instant) -> RequestRecord {
        let req = self.request(spec);
        let sent = Instant::now();
        let deadline = sent + self.timeout;
        let ms = |t: Instant| t.duration_since(sent).as_secs_f64() * 1000.0;
        let mut rec = RequestRecord {
            start_ms: sent.duration_since(run_start).as_secs_f64() * 1000.0,
            ttft_ms: None,
            e2e_ms: 0.0,
            itl_ms: Vec::with_capacity(spec.output_tokens as usize),
            input_tokens: spec.input_tokens,
            output_tokens: 0,
            outcome: Outcome::Ok,
            replica: None,
            error: None,
        };
        let outcome = self.stream(req, deadline, sent, &mut rec).await;
        rec.e2e_ms = ms(Instant::now().min(deadline));
        rec.outcome = outcome;
        rec
    }

    async fn stream(
        &self,
        req: Request<Full<Bytes>>,
        deadline: Instant,
        sent: Instant,
        rec: &mut RequestRecord,
    ) -> Outcome {
        let resp = match timeout_at(deadline, self.http.request(req)).await {
            Err(_) => return Outcome::Timeout,
            Ok(Err(e)) => {
                return Outcome::Transport {
                    message: error_chain(&e),
                };
            }
            Ok(Ok(r)) => r,
        };
        rec.replica = resp
            .headers()
            .get(REPLICA_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let status = resp.status();
        let mut body = resp.into_body();
        if status != http::StatusCode::OK {
            // Drain (bounded by the deadline) so the connection can be
            // reused, and keep what the server said.
            if let Ok(Ok(b)) = timeout_at(deadline, body.collect()).await {
                rec.error = Some(error_message(&b.to_bytes()));
            }
            return Outcome::Http {
                status: status.as_u16(),
            };
        }
        let mut parser = SseParser::default();
        let mut chunks = 0u64;
        let mut usage = None;
        let mut last: Option<Instant> = None;
        let mut done = false;
        let mut failure = None;
        while !done {
            let frame = match timeout_at(deadline, body.frame()).await {
                Err(_) => return Outcome::Timeout,
                Ok(None) => break,
                Ok(Some(Err(e))) => {
                    return Outcome::Stream {
                        message: error_chain(&e),
                    };
                }
                Ok(Some(Ok(f))) => f,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            let now = Instant::now();
            parser.feed(&data, |event| match classify(event) {
                Chunk::Done => done = true,
                Chunk::Error(m) => failure = Some(m),
                Chunk::Data {
                    content,
                    completion_tokens,
                    prompt_tokens,
                } => {
                    if content {
                        chunks += 1;
                        match last {
                            None => {
                                rec.ttft_ms = Some(now.duration_since(sent).as_secs_f64() * 1000.0)
                            }
                            Some(prev) => rec
                                .itl_ms
                                .push(now.duration_since(prev).as_secs_f64() * 1000.0),
                        }
                        last = Some(now);
                    }
                    if completion_tokens.is_some() {
                        usage = completion_tokens;
                    }
                    if let Some(p) = prompt_tokens {
                        // The server's own count beats the requested length.
                        rec.input_tokens = p as usize;
                    }
                }
            });
            if let Some(message) = failure.take() {
                rec.output_tokens = usage.unwrap_or(chunks);
                return Outcome::Stream { message };
            }
        }
        rec.output_tokens = usage.unwrap_or(chunks);
        if done {
            Outcome::Ok
        } else {
            Outcome::Stream {
                message: "stream ended before data: [DONE]".into(),
            }
        }
    }
}

/// The `error.message` of an OpenAI error body, else its first 200 characters.
fn error_message(body: &[u8]) -> String {
    let parsed: Option<serde_json::Value> = serde_json::from_slice(body).ok();
    if let Some(m) = parsed
        .as_ref()
        .and_then(|v| v.pointer("/error/message"))
        .and_then(|m| m.as_str())
    {
        return m.to_owned();
    }
    String::from_utf8_lossy(body).chars().take(200).collect()
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_must_be_local_unless_allowed() {
        assert_eq!(
            parse_target("http://127.0.0.1:8080/", false).unwrap(),
            "http://127.0.0.1:8080"
        );
        assert_eq!(
            parse_target("http://localhost:9/v1", false).unwrap(),
            "http://localhost:9"
        );
        assert!(parse_target("http://[::1]:80", false).is_ok());
        assert!(matches!(
            parse_target("http://10.0.0.5:8000", false),
            Err(BenchError::RemoteTarget { .. })
        ));
        assert!(parse_target("http://10.0.0.5:8000", true).is_ok());
        assert!(parse_target("https://127.0.0.1", false).is_err());
        assert!(parse_target("not a url", false).is_err());
    }
}

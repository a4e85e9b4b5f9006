//! The access log: one structured line per finished request, written when
//! its answer has ended (or the client went away), Envoy-style.
//!
//! The line goes through `tracing` at `info` under the target
//! `llmlb::access`, so it follows `--log-format` (text or JSON) and
//! `RUST_LOG`. The response body is wrapped to see the end of the answer,
//! the first content (time to first token: the first SSE frame carrying
//! generated text, or the first byte of a non-streamed answer) and the
//! replica's `usage` (read from the last 8 KiB of the body, where vLLM puts
//! it in both JSON answers and the final stream chunk). Fields and sampling
//! come from `[telemetry.access_log]`; failed requests are always logged.
//! The same end records the per-model metrics ([`ModelMetrics`]).

use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use serde::Deserialize;

use super::AppState;
use crate::forwarding::Dispatched;
use crate::net::{BoxError, ReportedUsage, ResponseBody};
use crate::telemetry::ModelMetrics;
use crate::telemetry::trace::{RequestTrace, Tracing};

/// How much of the end of a body is kept to find `usage` in.
const TAIL_BYTES: usize = 8 * 1024;

/// What is known when the request arrives.
pub struct AccessStart {
    request_id: String,
    client: SocketAddr,
    method: String,
    path: String,
    start: Instant,
    /// The request's trace span, ended with the line.
    trace: Option<RequestTrace>,
}

impl AccessStart {
    pub fn new<B>(
        req: &Request<B>,
        client: SocketAddr,
        request_id: &HeaderValue,
        start: Instant,
        traces: Option<&Tracing>,
    ) -> Self {
        let method = req.method().to_string();
        let path = req.uri().path().to_owned();
        let trace = traces.map(|t| {
            let trace = t.request(req.headers(), &method, &path);
            trace.set(
                "llmlb.request_id",
                request_id.to_str().unwrap_or("").to_owned(),
            );
            trace
        });
        AccessStart {
            request_id: request_id.to_str().unwrap_or("").to_owned(),
            client,
            method,
            path,
            start,
            trace,
        }
    }

    /// The request's trace span, when tracing is on.
    pub fn trace(&self) -> Option<&RequestTrace> {
        self.trace.as_ref()
    }
}

/// What routing learned (filled in as far as the request got).
#[derive(Debug, Default, Clone)]
pub struct RouteFields {
    pub model: Option<String>,
    pub stream: Option<bool>,
    pub pool: Option<String>,
    /// The routing stage's branches, `+`-joined.
    pub route: Option<String>,
}

/// Token counts from the replica's `usage`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub completion_tokens: Option<u64>,
    #[serde(default)]
    pub prompt_tokens_details: Option<Details>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Details {
    #[serde(default)]
    pub cached_tokens: Option<u64>,
}

/// The last `"usage": {...}` object in `tail`, when it parses.
pub fn find_usage(tail: &[u8]) -> Option<Usage> {
    let key = b"\"usage\"";
    let at = tail.windows(key.len()).rposition(|w| w == key)?;
    let rest = &tail[at + key.len()..];
    let open = rest.iter().position(|&b| b == b'{')?;
    if !rest[..open]
        .iter()
        .all(|b| b.is_ascii_whitespace() || *b == b':')
    {
        return None;
    }
    let mut depth = 0usize;
    for (i, &b) in rest[open..].iter().enumerate() {
        match b {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return serde_json::from_slice(&rest[open..open + i + 1]).ok();
                }
            }
            _ => {}
        }
    }
    None
}

/// Whether an SSE frame carries generated text (a non-empty `content`,
/// `reasoning_content` or `text` string).
pub fn has_content(frame: &[u8]) -> bool {
    [
        &b"\"content\":\""[..],
        b"\"text\":\"",
        b"\"content\": \"",
        b"\"text\": \"",
    ]
    .iter()
    .any(|key| {
        frame
            .windows(key.len())
            .enumerate()
            .any(|(i, w)| w == *key && frame.get(i + key.len()).is_some_and(|&c| c != b'"'))
    })
}

struct Entry {
    start: AccessStart,
    fields: RouteFields,
    status: u16,
    dispatched: Option<Dispatched>,
    mask: u32,
    sampled: bool,
    /// Write the line at all (`[telemetry.access_log] enabled`).
    logging: bool,
    metrics: ModelMetrics,
}

/// Wraps `resp` so that its end writes the access-log line (when
/// `[telemetry.access_log] enabled`).
pub fn wrap(
    state: &AppState,
    mut start: AccessStart,
    fields: RouteFields,
    resp: Response<ResponseBody>,
) -> Response<ResponseBody> {
    let config = state.config();
    let log = &config.telemetry.access_log;
    let logging = log.enabled && tracing::enabled!(target: "llmlb::access", tracing::Level::INFO);
    if !logging && fields.pool.is_none() {
        if let Some(trace) = start.trace.take() {
            trace.end(resp.status().as_u16(), "complete");
        }
        return resp;
    }
    let sampled = logging && (log.sample >= 1.0 || rand::random::<f64>() < log.sample);
    let (parts, body) = resp.into_parts();
    let sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let entry = Entry {
        start,
        fields,
        status: parts.status.as_u16(),
        dispatched: parts.extensions.get::<Dispatched>().cloned(),
        mask: log.field_mask(),
        sampled,
        logging,
        metrics: state.metrics.models.clone(),
    };
    let length = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .or_else(|| body.size_hint().exact());
    let body = Logged {
        inner: body,
        length,
        seen: 0,
        entry: Some(entry),
        sse,
        first_content: None,
        tail: Vec::new(),
        kept: parts.extensions.get::<ReportedUsage>().cloned(),
    };
    Response::from_parts(parts, body.boxed_unsync())
}

struct Logged {
    inner: ResponseBody,
    /// The declared length, when there is one: a server may drop the body
    /// once it has written that many bytes, without polling its end.
    length: Option<u64>,
    seen: u64,
    entry: Option<Entry>,
    sse: bool,
    first_content: Option<Instant>,
    tail: Vec<u8>,
    /// The usage event llmlb asked a stream for and kept from the client.
    kept: Option<ReportedUsage>,
}

impl Logged {
    fn ended(&self) -> bool {
        self.inner.is_end_stream() || self.length.is_some_and(|n| self.seen >= n)
    }

    fn observe(&mut self, data: &Bytes) {
        self.seen += data.len() as u64;
        if self.first_content.is_none() && (!self.sse || has_content(data)) && !data.is_empty() {
            self.first_content = Some(Instant::now());
        }
        self.tail.extend_from_slice(data);
        if self.tail.len() > TAIL_BYTES {
            let cut = self.tail.len() - TAIL_BYTES;
            self.tail.drain(..cut);
        }
    }

    fn finish(&mut self, outcome: &'static str) {
        let Some(mut e) = self.entry.take() else {
            return;
        };
        let usage = find_usage(&self.tail).or_else(|| {
            let kept = self.kept.as_ref()?.event()?;
            find_usage(kept)
        });
        if let Some(trace) = e.start.trace.take() {
            end_trace(trace, &e, outcome, self.first_content, usage);
        }
        record(&e, self.first_content, usage);
        if e.logging && (e.sampled || e.status >= 400 || outcome != "complete") {
            emit(&e, outcome, self.first_content, usage);
        }
    }
}

/// Ends the request's span with what the access log knows.
fn end_trace(
    trace: RequestTrace,
    e: &Entry,
    outcome: &'static str,
    first: Option<Instant>,
    usage: Option<Usage>,
) {
    if let Some(model) = &e.fields.model {
        trace.set("gen_ai.request.model", model.clone());
    }
    if let Some(pool) = &e.fields.pool {
        trace.set("llmlb.pool", pool.clone());
    }
    if let Some(d) = &e.dispatched {
        trace.set("llmlb.replica", d.replica.to_string());
        trace.set("llmlb.attempts", i64::from(d.attempts));
    }
    if let Some(t) = first {
        let ms = t.duration_since(e.start.start).as_secs_f64() * 1000.0;
        trace.set("llmlb.ttft_ms", ms);
    }
    let u = usage.unwrap_or_default();
    if let Some(n) = u.prompt_tokens {
        trace.set("gen_ai.usage.input_tokens", n as i64);
    }
    if let Some(n) = u.completion_tokens {
        trace.set("gen_ai.usage.output_tokens", n as i64);
    }
    trace.end(e.status, outcome);
}

/// Per-model metrics for a request that reached a pool.
fn record(e: &Entry, first: Option<Instant>, usage: Option<Usage>) {
    let (Some(pool), Some(model)) = (&e.fields.pool, &e.fields.model) else {
        return;
    };
    let m = &e.metrics;
    let stream = if e.fields.stream == Some(true) {
        "true"
    } else {
        "false"
    };
    m.requests
        .with_label_values(&[pool, model, stream, &e.status.to_string()])
        .inc();
    if let Some(t) = first.filter(|_| e.status < 400) {
        m.ttft
            .with_label_values(&[pool, model, stream])
            .observe(t.duration_since(e.start.start).as_secs_f64());
    }
    let u = usage.unwrap_or_default();
    if let Some(d) = &e.dispatched {
        let reported = u.prompt_tokens_details.and_then(|d| d.cached_tokens);
        let o = crate::telemetry::prefix_loop::observation(
            e.status,
            d.predicted_cached,
            u.prompt_tokens,
            reported,
        );
        m.prefix_loop.observe(pool, &d.replica, o);
    }
    for (kind, n) in [
        ("prompt", u.prompt_tokens),
        ("completion", u.completion_tokens),
        (
            "cached",
            u.prompt_tokens_details.and_then(|d| d.cached_tokens),
        ),
    ] {
        if let Some(n) = n {
            m.tokens.with_label_values(&[pool, model, kind]).inc_by(n);
        }
    }
}

fn emit(e: &Entry, outcome: &str, first: Option<Instant>, usage: Option<Usage>) {
    let on = |i: usize| e.mask & (1 << i) != 0;
    fn keep<T>(on: bool, v: Option<T>) -> Option<T> {
        v.filter(|_| on)
    }
    let ms = |t: Instant| {
        (t.duration_since(e.start.start).as_secs_f64() * 1000.0 * 100.0).round() / 100.0
    };
    let d = e.dispatched.as_ref();
    let u = usage.unwrap_or_default();
    tracing::info!(
        target: "llmlb::access",
        request_id = keep(on(0), Some(e.start.request_id.as_str())),
        client = keep(on(1), Some(e.start.client.to_string())).as_deref(),
        method = keep(on(2), Some(e.start.method.as_str())),
        path = keep(on(3), Some(e.start.path.as_str())),
        model = keep(on(4), e.fields.model.as_deref()),
        stream = keep(on(5), e.fields.stream),
        pool = keep(on(6), e.fields.pool.as_deref()),
        replica = keep(on(7), d.map(|d| &*d.replica)),
        route = keep(on(8), e.fields.route.as_deref()),
        branch = keep(on(9), d.map(|d| d.branch)),
        status = keep(on(10), Some(e.status)),
        attempts = keep(on(11), d.map(|d| d.attempts)),
        ttft_ms = keep(on(12), first.map(ms)),
        duration_ms = keep(on(13), Some(ms(Instant::now()))),
        prompt_tokens = keep(on(14), u.prompt_tokens),
        completion_tokens = keep(on(15), u.completion_tokens),
        cached_tokens = keep(on(16), u.prompt_tokens_details.and_then(|d| d.cached_tokens)),
        outcome = keep(on(17), Some(outcome)),
        "request"
    );
}

impl Body for Logged {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.observe(data);
                }
                if this.ended() {
                    this.finish("complete");
                }
            }
            Poll::Ready(Some(Err(_))) => this.finish("upstream_error"),
            Poll::Ready(None) => this.finish("complete"),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        if self.ended() {
            self.finish("complete");
        } else {
            self.finish("client_closed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_read_from_json_and_sse_tails() {
        let sse = br#"data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":30,"prompt_tokens_details":{"cached_tokens":8}}}

data: [DONE]

"#;
        let u = find_usage(sse).unwrap();
        assert_eq!(u.prompt_tokens, Some(12));
        assert_eq!(u.completion_tokens, Some(30));
        assert_eq!(u.prompt_tokens_details.unwrap().cached_tokens, Some(8));
        let json = br#"{"id":"x","usage": {"prompt_tokens": 3, "completion_tokens": 4}}"#;
        assert_eq!(find_usage(json).unwrap().completion_tokens, Some(4));
        assert_eq!(find_usage(br#"{"usage":null}"#), None);
        assert_eq!(find_usage(br#"{"usage":{"prompt_tokens":1"#), None);
    }

    #[test]
    fn content_frames_are_told_from_role_and_usage_frames() {
        assert!(has_content(
            br#"data: {"choices":[{"delta":{"content":"Hi"}}]}"#
        ));
        assert!(has_content(br#"data: {"choices":[{"text":" w"}]}"#));
        assert!(!has_content(
            br#"data: {"choices":[{"delta":{"role":"assistant","content":""}}]}"#
        ));
        assert!(!has_content(
            br#"data: {"choices":[],"usage":{"prompt_tokens":1}}"#
        ));
    }
}

//! The access log: one structured line per finished request, written when
//! its answer has ended (or the client went away), Envoy-style.
//!
//! The line goes through `tracing` at `info` under the target
//! `llmlb::access`, so it follows `--log-format` (text or JSON) and
//! `RUST_LOG`. The request's response body ([`super::scope::ScopedBody`])
//! holds the [`Entry`] and sees the end of the answer, the first content
//! (time to first token: the first SSE frame carrying generated text, or the
//! first byte of a non-streamed answer) and the replica's `usage` (read from
//! the last 8 KiB of the body, where vLLM puts it in both JSON answers and
//! the final stream chunk, with [`find_usage`]). Fields and sampling
//! come from `[telemetry.access_log]`; failed requests are always logged.
//! The same end records the per-model metrics ([`ModelMetrics`]).

use std::net::SocketAddr;
use std::time::Instant;

use http::Request;
use http::header::HeaderValue;
use serde::Deserialize;

use super::AppState;
use crate::forwarding::Dispatched;
use crate::telemetry::ModelMetrics;
use crate::telemetry::trace::{RequestTrace, Tracing};

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
    pub total_tokens: Option<u64>,
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
    let key = &crate::net::USAGE_KEY;
    // The last match, found forwards: the forward searcher is the vectorised one.
    let at = key.find_iter(tail).last()?;
    let rest = &tail[at + key.needle().len()..];
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
    use memchr::memmem::Finder;
    static KEYS: std::sync::LazyLock<[Finder<'static>; 4]> = std::sync::LazyLock::new(|| {
        [
            &b"\"content\":\""[..],
            b"\"text\":\"",
            b"\"content\": \"",
            b"\"text\": \"",
        ]
        .map(Finder::new)
    });
    KEYS.iter().any(|key| {
        let len = key.needle().len();
        key.find_iter(frame)
            .any(|i| frame.get(i + len).is_some_and(|&c| c != b'"'))
    })
}

/// The line's record, held by the response body ([`super::scope`]) until
/// the answer ends.
pub struct Entry {
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

impl Entry {
    /// The record for a response with `parts`, or `None` when nothing is to
    /// be written or counted at its end (no line, no pool): the request's
    /// trace span, if any, ends here then.
    pub fn new(
        state: &AppState,
        mut start: AccessStart,
        fields: RouteFields,
        parts: &http::response::Parts,
    ) -> Option<Entry> {
        let config = state.config();
        let log = &config.telemetry.access_log;
        let logging =
            log.enabled && tracing::enabled!(target: "llmlb::access", tracing::Level::INFO);
        if !logging && fields.pool.is_none() {
            if let Some(trace) = start.trace.take() {
                trace.end(parts.status.as_u16(), "complete");
            }
            return None;
        }
        let sampled = logging && (log.sample >= 1.0 || rand::random::<f64>() < log.sample);
        Some(Entry {
            start,
            fields,
            status: parts.status.as_u16(),
            dispatched: parts.extensions.get::<Dispatched>().cloned(),
            mask: log.field_mask(),
            sampled,
            logging,
            metrics: state.metrics.models.clone(),
        })
    }

    /// Ends the trace span, records the per-model metrics and writes the
    /// line (sampled; failures and broken answers always).
    pub fn finish(mut self, outcome: &'static str, first: Option<Instant>, usage: Option<Usage>) {
        if let Some(trace) = self.start.trace.take() {
            end_trace(trace, &self, outcome, first, usage);
        }
        record(&self, first, usage);
        if self.logging && (self.sampled || self.status >= 400 || outcome != "complete") {
            emit(&self, outcome, first, usage);
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
    // The digits, borrowed; `e.status` came from a `StatusCode`, so the
    // fallback is never taken.
    let code = http::StatusCode::from_u16(e.status).unwrap_or(http::StatusCode::BAD_GATEWAY);
    let status = code.as_str();
    m.requests
        .with_label_values(&[pool, model, stream, status])
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
        m.prefix_loop.observe(pool, &d.replica, d.kind, o);
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

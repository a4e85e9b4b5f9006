//! The access log: one structured line per finished request, written from
//! the request's end-of-request record ([`super::record`]), Envoy-style.
//!
//! The line goes through `tracing` at `info` under the target
//! `llmlb::access`, so it follows `--log-format` (text or JSON) and
//! `RUST_LOG`. The request's response body ([`super::scope::ScopedBody`])
//! sees the end of the answer, the first content (time to first token: the
//! first SSE frame carrying generated text, or the first byte of a
//! non-streamed answer) and the replica's `usage` (the last `usage` object
//! of the body, where vLLM puts it in both JSON answers and the final
//! stream chunk; `forwarding::Observed`). Fields and sampling come from
//! `[telemetry.access_log]`; failed requests are always logged. This file
//! also writes the record's per-model metrics ([`ModelMetrics`](crate::telemetry::ModelMetrics)) and ends
//! its trace span.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use super::AppState;
use super::record::{Ended, Record, Spans};
pub use crate::net::Usage;
use crate::telemetry::ModelSeries;
use crate::telemetry::log_line::log_key;
use crate::telemetry::trace::{RequestTrace, Tracing};
use http::header::HeaderValue;
use http::{Method, Request, Uri};

/// What is known when the request arrives. The request's own values are
/// kept (a method, and the id and target as shared bytes), not copied into
/// strings: most requests never need them as text before their line.
pub struct AccessStart {
    request_id: HeaderValue,
    /// The id needs no quoting in the access line (llmlb made it).
    pub(super) id_plain: bool,
    client: SocketAddr,
    method: Method,
    uri: Uri,
    pub(super) start: Instant,
    /// The request's trace span, ended with the line.
    pub(super) trace: Option<RequestTrace>,
}

impl AccessStart {
    pub fn new<B>(
        req: &Request<B>,
        client: SocketAddr,
        request_id: &HeaderValue,
        start: Instant,
        traces: Option<&Tracing>,
    ) -> Self {
        let trace = traces.map(|t| {
            let trace = t.request(req.headers(), req.method().as_str(), req.uri().path());
            trace.set(
                "llmlb.request_id",
                request_id.to_str().unwrap_or("").to_owned(),
            );
            trace
        });
        AccessStart {
            request_id: request_id.clone(),
            id_plain: false,
            client,
            method: req.method().clone(),
            uri: req.uri().clone(),
            start,
            trace,
        }
    }

    /// The request's trace span, when tracing is on.
    pub fn trace(&self) -> Option<&RequestTrace> {
        self.trace.as_ref()
    }

    /// The request's id (`x-request-id`).
    pub fn request_id(&self) -> &str {
        self.request_id.to_str().unwrap_or("")
    }
}

/// Ends the request's span with what the record knows; `error`: the
/// span's status is an error.
pub(super) fn end_trace(
    trace: RequestTrace,
    r: &Record,
    ended: &Ended,
    spans: &Spans,
    error: bool,
) {
    if let Some(model) = &r.fields.model {
        trace.set("gen_ai.request.model", model.clone());
    }
    if let Some(pool) = &r.fields.pool {
        trace.set("llmlb.pool", pool.to_string());
    }
    if let Some(replica) = r.replica() {
        trace.set("llmlb.replica", replica.to_owned());
    }
    if r.fields.progress.attempts > 0 {
        trace.set("llmlb.attempts", i64::from(r.fields.progress.attempts));
    }
    if let Some(e) = &r.refusal {
        trace.set("error.type", e.code);
    }
    if let Some(t) = spans.first_content {
        let ms = t.as_secs_f64() * 1000.0;
        trace.set("llmlb.ttft_ms", ms);
    }
    let u = ended.usage.unwrap_or_default();
    if let Some(n) = u.prompt_tokens {
        trace.set("gen_ai.usage.input_tokens", n as i64);
    }
    if let Some(n) = u.completion_tokens {
        trace.set("gen_ai.usage.output_tokens", n as i64);
    }
    trace.end(r.status, ended.outcome.as_str(), error);
}

/// Per-model metrics for a request that reached a pool, under the record's
/// status `label`.
pub(super) fn record_model(r: &Record, label: &str, ended: &Ended, spans: &Spans) {
    let (Some(pool), Some(model)) = (&r.fields.pool, &r.fields.model) else {
        return;
    };
    let metrics = &r.state().metrics;
    let m = &metrics.models;
    let stream = r.fields.stream == Some(true);
    let u = ended.usage.unwrap_or_default();
    let cached = u.prompt_tokens_details.and_then(|d| d.cached_tokens);
    let ttft = spans
        .first_content
        .filter(|_| r.status < 400)
        .map(|t| t.as_secs_f64());
    let series = match &r.fields.progress.replica {
        Some(replica) => replica.series(pool, metrics).model(model, stream),
        None => std::sync::Arc::new(ModelSeries::new(model, stream)),
    };
    series.record(
        m,
        pool,
        label,
        ttft,
        [u.prompt_tokens, u.completion_tokens, cached],
    );
    if let Some(d) = &r.dispatched {
        let o = crate::telemetry::prefix_loop::observation(
            r.status,
            d.predicted_cached,
            u.prompt_tokens,
            cached,
        );
        m.prefix_loop.observe(pool, &d.replica, d.kind, o);
        let t = crate::telemetry::prefix_loop::ttft_observation(
            r.status,
            stream,
            d.attempts,
            d.predicted_ttft,
            spans.first_content.map(|t| t.as_secs_f64()),
            r.fields.queued.map(|t| t.as_secs_f64()),
        );
        m.prefix_loop.observe_ttft(pool, &d.replica, t);
    }
}

/// Writes the record's line (sampled; failures and broken answers always),
/// when the access log is on.
pub(super) fn write_line(state: &AppState, r: &Record, ended: &Ended, spans: &Spans) {
    if !tracing::enabled!(target: "llmlb::access", tracing::Level::INFO) {
        return;
    }
    let config = state.config();
    let log = &config.telemetry.access_log;
    let failed = r.status >= 400 || ended.outcome != super::record::Outcome::Complete;
    if !log.enabled || !(failed || log.sample >= 1.0 || super::random::random::<f64>() < log.sample)
    {
        return;
    }
    let f = Fields::of(r, ended, spans, log.field_mask());
    if !crate::telemetry::log_line::write(TARGET, "request", |line| f.write(line)) {
        f.trace();
    }
}

const TARGET: &str = "llmlb::access";

/// Milliseconds from whole hundredths, the float the line writes.
fn as_ms(hundredths: u64) -> f64 {
    hundredths as f64 / 100.0
}

/// The access line's fields, each `None` when off in
/// `[telemetry.access_log] fields` or unknown for this request. The spans
/// (`..._ms`) are in whole hundredths of a millisecond.
struct Fields<'a> {
    request_id: Option<&'a str>,
    /// `request_id`, `pool`, `replica` need no quoting: llmlb made the id,
    /// the config's names were checked when it was loaded.
    id_plain: bool,
    pool_plain: bool,
    replica_plain: bool,
    client: Option<SocketAddr>,
    method: Option<&'a str>,
    path: Option<&'a str>,
    model: Option<&'a str>,
    stream: Option<bool>,
    pool: Option<&'a str>,
    replica: Option<&'a str>,
    route: Option<&'a str>,
    branch: Option<&'static str>,
    status: Option<u16>,
    attempts: Option<u32>,
    ttft_ms: Option<u64>,
    duration_ms: Option<u64>,
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    cached_tokens: Option<u64>,
    outcome: Option<&'static str>,
    error: Option<&'static str>,
    error_message: Option<&'a str>,
    ttfb_ms: Option<u64>,
    tier: Option<&'a str>,
    queue_ms: Option<u64>,
    cached_tokens_predicted: Option<u64>,
    ttft_predicted_ms: Option<u64>,
}

impl<'a> Fields<'a> {
    fn of(r: &'a Record, ended: &Ended, spans: &Spans, mask: u32) -> Self {
        let on = |i: usize| mask & (1 << i) != 0;
        fn keep<T>(on: bool, v: Option<T>) -> Option<T> {
            v.filter(|_| on)
        }
        // Seconds as milliseconds in whole hundredths (a negative or
        // infinite expectation saturates rather than panicking as
        // `Duration` would).
        let ms = |secs: f64| (secs.max(0.0) * 1000.0 * 100.0).round() as u64;
        let span_ms = |d: Duration| ms(d.as_secs_f64());
        let d = r.dispatched.as_ref();
        let u = ended.usage.unwrap_or_default();
        let e = r.refusal.as_ref();
        let replica = r.fields.progress.replica.as_deref();
        Fields {
            request_id: keep(on(0), Some(r.start.request_id())),
            id_plain: r.start.id_plain,
            pool_plain: r.fields.pool_plain,
            replica_plain: replica.is_some_and(|r| r.name_plain),
            client: keep(on(1), Some(r.start.client)),
            method: keep(on(2), Some(r.start.method.as_str())),
            path: keep(on(3), Some(r.start.uri.path())),
            model: keep(on(4), r.fields.model.as_deref()),
            stream: keep(on(5), r.fields.stream),
            pool: keep(on(6), r.fields.pool.as_deref()),
            replica: keep(on(7), replica.map(|r| r.name.as_str())),
            route: keep(on(8), r.fields.route.as_deref()),
            branch: keep(on(9), d.map(|d| d.branch)),
            status: keep(on(10), Some(r.status)),
            attempts: keep(on(11), Some(r.fields.progress.attempts).filter(|&n| n > 0)),
            ttft_ms: keep(on(12), spans.first_content.map(span_ms)),
            duration_ms: keep(on(13), Some(span_ms(spans.total))),
            prompt_tokens: keep(on(14), u.prompt_tokens),
            completion_tokens: keep(on(15), u.completion_tokens),
            cached_tokens: keep(
                on(16),
                u.prompt_tokens_details.and_then(|d| d.cached_tokens),
            ),
            outcome: keep(on(17), Some(ended.outcome.as_str())),
            error: keep(on(18), e.map(|e| e.code)),
            error_message: keep(on(18), e.map(|e| e.message.as_str())),
            ttfb_ms: keep(
                on(19),
                spans.first_byte.filter(|_| d.is_some()).map(span_ms),
            ),
            tier: keep(on(20), r.fields.tier.as_deref()),
            queue_ms: keep(on(21), r.fields.queued.map(span_ms)),
            cached_tokens_predicted: keep(on(22), d.and_then(|d| d.predicted_cached)),
            ttft_predicted_ms: keep(on(23), d.and_then(|d| d.predicted_ttft).map(ms)),
        }
    }

    /// Straight into the log's buffer, in `trace`'s order and form. A
    /// method is a token (never quoted), the branch, outcome and error
    /// llmlb's own words: plain, not checked.
    fn write(&self, l: &mut crate::telemetry::log_line::Line<'_>) {
        l.text(log_key!("request_id"), self.request_id, self.id_plain);
        l.addr(log_key!("client"), self.client);
        l.text(log_key!("method"), self.method, true);
        l.str(log_key!("path"), self.path);
        l.str(log_key!("model"), self.model);
        l.bool(log_key!("stream"), self.stream);
        l.text(log_key!("pool"), self.pool, self.pool_plain);
        l.text(log_key!("replica"), self.replica, self.replica_plain);
        l.str(log_key!("route"), self.route);
        l.text(log_key!("branch"), self.branch, true);
        l.u64(log_key!("status"), self.status.map(u64::from));
        l.u64(log_key!("attempts"), self.attempts.map(u64::from));
        l.hundredths(log_key!("ttft_ms"), self.ttft_ms);
        l.hundredths(log_key!("duration_ms"), self.duration_ms);
        l.u64(log_key!("prompt_tokens"), self.prompt_tokens);
        l.u64(log_key!("completion_tokens"), self.completion_tokens);
        l.u64(log_key!("cached_tokens"), self.cached_tokens);
        l.text(log_key!("outcome"), self.outcome, true);
        l.text(log_key!("error"), self.error, true);
        l.str(log_key!("error_message"), self.error_message);
        l.hundredths(log_key!("ttfb_ms"), self.ttfb_ms);
        l.str(log_key!("tier"), self.tier);
        l.hundredths(log_key!("queue_ms"), self.queue_ms);
        l.u64(
            log_key!("cached_tokens_predicted"),
            self.cached_tokens_predicted,
        );
        l.hundredths(log_key!("ttft_predicted_ms"), self.ttft_predicted_ms);
    }

    /// Through `tracing` (a terminal's colours, or another subscriber).
    fn trace(&self) {
        tracing::info!(
            target: TARGET,
            request_id = self.request_id,
            client = self.client.map(|c| c.to_string()).as_deref(),
            method = self.method,
            path = self.path,
            model = self.model,
            stream = self.stream,
            pool = self.pool,
            replica = self.replica,
            route = self.route,
            branch = self.branch,
            status = self.status,
            attempts = self.attempts,
            ttft_ms = self.ttft_ms.map(as_ms),
            duration_ms = self.duration_ms.map(as_ms),
            prompt_tokens = self.prompt_tokens,
            completion_tokens = self.completion_tokens,
            cached_tokens = self.cached_tokens,
            outcome = self.outcome,
            error = self.error,
            error_message = self.error_message,
            ttfb_ms = self.ttfb_ms.map(as_ms),
            tier = self.tier,
            queue_ms = self.queue_ms.map(as_ms),
            cached_tokens_predicted = self.cached_tokens_predicted,
            ttft_predicted_ms = self.ttft_predicted_ms.map(as_ms),
            "request"
        );
    }
}

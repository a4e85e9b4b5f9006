//! The end-of-request record: every signal about a finished request is
//! written from one [`Record`], in one place ([`Record::finish`]), so the
//! access-log line, `llmlb_requests_total`, the duration and
//! time-to-first-byte histograms, the retry counter, the refusal counter,
//! the per-model and per-version counters and the trace span's status
//! cannot disagree.
//!
//! A request ends in exactly one [`Outcome`] (the set is closed; the table
//! is in docs/OPERATIONS.md):
//!
//! | outcome | when | log `status` | metric `status` label |
//! |---|---|---|---|
//! | `complete` | the answer (a replica's, whatever its status, or one llmlb made) was handed over to its end | the answer's | the answer's |
//! | `refused` | llmlb answered with an error of its own (400, 401, 404, 413, 429, 503 ...) | the error's | the error's |
//! | `upstream_error` | no replica gave an answer: every attempt failed to connect, or the connection broke before the response head | 502 | `502` |
//! | `timeout` | no response head within the pool's `first_byte` | 504 | `504` |
//! | `stream_error` | the replica's answer broke after its head (reset, idle timeout) | the answer's | `stream_error` |
//! | `client_closed` | the client went away before the response head | 499 | `499` |
//! | `client_closed_midstream` | the client went away during the answer | the answer's | `499` |
//!
//! The record is made when the request arrives (its id, start, trace
//! span), filled in as it goes ([`RouteFields`]: model, pool, canary
//! version, the forwarding attempts) and finished once: by the response
//! body's scope when the answer ends ([`super::scope`]), or by the
//! request's [`Unanswered`] guard when the client went away before a
//! response existed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::AppState;
use super::access_log::{AccessStart, Usage};
use crate::forwarding::{Dispatched, Progress};
use crate::telemetry::Metrics;

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Complete,
    Refused,
    UpstreamError,
    Timeout,
    StreamError,
    ClientClosed,
    ClientClosedMidstream,
}

impl Outcome {
    /// The access log's `outcome` field and the span's `llmlb.outcome`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Complete => "complete",
            Outcome::Refused => "refused",
            Outcome::UpstreamError => "upstream_error",
            Outcome::Timeout => "timeout",
            Outcome::StreamError => "stream_error",
            Outcome::ClientClosed => "client_closed",
            Outcome::ClientClosedMidstream => "client_closed_midstream",
        }
    }

    /// Whether the request failed on llmlb's or the replica's side (the
    /// span's error status, `llmlb_version_errors_total`): a 5xx, a broken
    /// stream, no answer. A client's own error (4xx) or its leaving is not.
    pub fn is_error(self, status: u16) -> bool {
        match self {
            Outcome::UpstreamError | Outcome::Timeout | Outcome::StreamError => true,
            Outcome::ClientClosed | Outcome::ClientClosedMidstream => false,
            Outcome::Complete | Outcome::Refused => status >= 500,
        }
    }
}

/// The `status` label of the request counters: the HTTP status, except a
/// broken stream (`stream_error`) and a client that left (`499`, as NGINX
/// names a client-closed request).
#[derive(Debug, Clone, Copy)]
enum Label {
    Status(http::StatusCode),
    Text(&'static str),
}

impl Label {
    fn of(outcome: Outcome, status: u16) -> Label {
        match outcome {
            Outcome::StreamError => Label::Text("stream_error"),
            Outcome::ClientClosed | Outcome::ClientClosedMidstream => Label::Text("499"),
            _ => match http::StatusCode::from_u16(status) {
                Ok(code) => Label::Status(code),
                Err(_) => Label::Text("502"),
            },
        }
    }

    fn as_str(&self) -> &str {
        match self {
            Label::Status(code) => code.as_str(),
            Label::Text(t) => t,
        }
    }
}

/// What the request path learned, filled in as far as the request got.
#[derive(Debug, Default)]
pub struct RouteFields {
    pub model: Option<String>,
    pub stream: Option<bool>,
    pub pool: Option<Arc<str>>,
    /// `pool` needs no quoting in the access line (the pool's
    /// `name_plain`).
    pub pool_plain: bool,
    /// The routing stage's branches, `+`-joined.
    pub route: Option<String>,
    /// The canary version the request was sent to.
    pub version: Option<Arc<str>>,
    /// The forwarding attempts so far (written by `forwarding::forward`).
    pub progress: Progress,
    /// The caller's tier (its own, else the default tier).
    pub tier: Option<Arc<str>>,
    /// How long the request waited in its pool's queue, when it went
    /// through one and was let out.
    pub queued: Option<std::time::Duration>,
}

/// Why llmlb answered with an error itself.
#[derive(Debug)]
pub struct Refusal {
    /// The `reason` label of `llmlb_rejections_total`.
    pub reason: &'static str,
    /// The JSON body's `code`, the log's `error` field.
    pub code: &'static str,
    /// The error as a log line may show it.
    pub message: String,
    pub outcome: Outcome,
}

impl Refusal {
    pub fn of(err: &super::ApiError) -> Refusal {
        use crate::forwarding::ForwardError;
        let outcome = match err {
            super::ApiError::Upstream(ForwardError::UpstreamUnavailable { .. }) => {
                Outcome::UpstreamError
            }
            super::ApiError::Upstream(ForwardError::UpstreamTimeout { .. }) => Outcome::Timeout,
            _ => Outcome::Refused,
        };
        Refusal {
            reason: err.reason(),
            code: err.code(),
            message: err.log_message(),
            outcome,
        }
    }
}

/// What the end of the answer showed.
#[derive(Debug, Clone, Copy)]
pub struct Ended {
    pub outcome: Outcome,
    /// The first body byte handed on.
    pub first_byte: Option<Instant>,
    /// The first generated content (streams) or byte (other answers).
    pub first_content: Option<Instant>,
    pub usage: Option<Usage>,
}

/// The request's spans from its start, each read once for the metrics,
/// the trace and the access line.
pub(super) struct Spans {
    pub total: Duration,
    /// To the first body byte handed on.
    pub first_byte: Option<Duration>,
    /// To the first generated content.
    pub first_content: Option<Duration>,
}

impl Spans {
    fn of(start: Instant, end: Instant, ended: &Ended) -> Spans {
        let since = |t: Instant| t.duration_since(start);
        Spans {
            total: since(end),
            first_byte: ended.first_byte.map(since),
            first_content: ended.first_content.map(since),
        }
    }
}

/// One request's record, finished once.
pub struct Record {
    state: Arc<AppState>,
    pub(super) start: AccessStart,
    pub(super) fields: RouteFields,
    /// The HTTP status sent (499 when none was).
    pub(super) status: u16,
    pub(super) dispatched: Option<Dispatched>,
    pub(super) refusal: Option<Refusal>,
}

impl Record {
    pub fn new(
        state: &Arc<AppState>,
        start: AccessStart,
        fields: RouteFields,
        status: u16,
        dispatched: Option<Dispatched>,
        refusal: Option<Refusal>,
    ) -> Record {
        Record {
            state: Arc::clone(state),
            start,
            fields,
            status,
            dispatched,
            refusal,
        }
    }

    /// The outcome of an answer llmlb made itself with an error, fixed when
    /// it was made.
    pub fn refused(&self) -> Option<Outcome> {
        self.refusal.as_ref().map(|r| r.outcome)
    }

    /// Writes every signal about the request, once.
    pub fn finish(mut self, ended: Ended) {
        let spans = Spans::of(self.start.start, Instant::now(), &ended);
        let label = Label::of(ended.outcome, self.status);
        let label = label.as_str();
        let state = Arc::clone(&self.state);
        let metrics: &Metrics = &state.metrics;
        let pool = self.fields.pool.as_deref().unwrap_or("");
        let duration = spans.total.as_secs_f64();
        match &self.fields.progress.replica {
            Some(replica) => {
                let series = replica.series(pool, metrics);
                series.finished(label);
                series.duration().observe(duration);
                if let Some(t) = spans.first_byte.filter(|_| self.dispatched.is_some()) {
                    series.first_byte().observe(t.as_secs_f64());
                }
            }
            None => {
                metrics.requests.with_label_values(&[pool, "", label]).inc();
                metrics
                    .request_duration
                    .with_label_values(&[pool])
                    .observe(duration);
            }
        }
        let resent = self.fields.progress.attempts.saturating_sub(1);
        if resent > 0 {
            metrics
                .retries
                .with_label_values(&[pool])
                .inc_by(u64::from(resent));
        }
        if let Some(r) = &self.refusal {
            metrics.rejections.with_label_values(&[r.reason]).inc();
        }
        let error = ended.outcome.is_error(self.status);
        if let Some(version) = &self.fields.version {
            state
                .routing_metrics
                .record_version(pool, version, label, error, duration);
        }
        super::access_log::record_model(&self, label, &ended, &spans);
        if let Some(trace) = self.start.trace.take() {
            super::access_log::end_trace(trace, &self, &ended, &spans, error);
        }
        super::access_log::write_line(&state, &self, &ended, &spans);
    }

    pub(super) fn state(&self) -> &AppState {
        &self.state
    }

    /// The replica that answered or was tried last, by name.
    pub(super) fn replica(&self) -> Option<&str> {
        self.fields
            .progress
            .replica
            .as_ref()
            .map(|r| r.name.as_str())
    }
}

/// Finishes a request whose client went away before a response existed
/// (while it was read, queued, or waiting for the replica's head): hyper
/// drops the handler's future and this guard, still holding the record,
/// finishes it as `client_closed`. Made when hyper hands the request over,
/// before its future first runs (hyper may drop a future it never polled).
pub struct Unanswered {
    pub start: Option<AccessStart>,
    pub fields: RouteFields,
    state: Arc<AppState>,
}

impl Unanswered {
    pub fn new(state: &Arc<AppState>, start: AccessStart) -> Unanswered {
        Unanswered {
            start: Some(start),
            fields: RouteFields::default(),
            state: Arc::clone(state),
        }
    }

    /// The handler produced a response: the record goes with it.
    pub fn answered(mut self) -> (AccessStart, RouteFields) {
        let start = self.start.take().expect("answered once");
        (start, std::mem::take(&mut self.fields))
    }
}

impl Drop for Unanswered {
    fn drop(&mut self) {
        let Some(start) = self.start.take() else {
            return;
        };
        let fields = std::mem::take(&mut self.fields);
        let record = Record::new(&self.state, start, fields, 499, None, None);
        record.finish(Ended {
            outcome: Outcome::ClientClosed,
            first_byte: None,
            first_content: None,
            usage: None,
        });
    }
}

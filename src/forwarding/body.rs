//! The response body llmlb streams back to the client.
//!
//! [`ProxyBody`] passes the replica's frames through one by one as they arrive
//! (no buffering), enforces the idle-between-chunks timeout, records time to
//! first byte, and carries the replica's [`InFlightGuard`]: the load is released
//! at end of stream, on error, or when hyper drops the body because the client
//! went away. Dropping the body also drops the upstream connection, which is
//! how a vLLM replica learns to abort the request and free its KV cache.
//!
//! Output tokens released from the guard come from the replica's `usage`
//! (`completion_tokens`) whenever it reports one; only a stream without
//! `usage` falls back to one token per SSE `data:` event. When llmlb asked
//! the stream for usage itself, the usage event is removed on the way out
//! ([`UsageStrip`]). What the client was sent, and the kept event, feed
//! the body's [`Observer`] (first byte, first content, `[DONE]`, `usage`),
//! which the request's scope above reads for its end-of-request record: the
//! answer is observed here once, with one search for `"usage"` per frame.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use super::Dispatched;
use super::idle::IdleTimer;
use super::observed::{Observed, Observer};
use super::usage_strip::UsageStrip;
use crate::net::{BoxError, Lent, USAGE_KEY, UpstreamBody};
use crate::pool::{Failure, Pool};
use crate::replica::{InFlightGuard, Replica};
use crate::routing::{Expected, StreamBroken};
use crate::telemetry::Metrics;

/// What a stream that breaks reports to: the pool (the break counts toward
/// the replica's outlier ejection), `llmlb_upstream_errors_total`, and the
/// request's [`StreamBroken`] flag. The request's own signals (its status
/// label, duration, time to first byte) are written by its end-of-request
/// record above forwarding, which reads the flag.
#[derive(Debug)]
pub struct BreakReport {
    pub metrics: Arc<Metrics>,
    pub owner: Arc<Pool>,
    /// The replica that answered.
    pub replica: Arc<Replica>,
    pub broken: StreamBroken,
    /// For the log line about the break.
    pub request_id: http::HeaderValue,
}

pub struct ProxyBody {
    inner: Incoming,
    /// The connection the answer came on, given back at its end.
    lent: Lent,
    idle: IdleTimer,
    /// Released at end of stream.
    guard: Option<InFlightGuard>,
    /// `exact` mode: the prompt counts as held on the replica until its
    /// events report it or the stream ends.
    expected: Option<Expected>,
    report: BreakReport,
    /// Server-sent events: a failure mid-stream becomes a readable error event.
    sse: bool,
    ended: bool,
    /// Output tokens accounted so far (from `usage` when reported).
    output_seen: u64,
    /// Removes the usage event llmlb asked for, when it did.
    strip: Option<UsageStrip>,
    /// What the client was sent, for the request's record.
    observer: Observer,
    /// The search for `"usage"` in the frame about to go out, when it was
    /// made on the same bytes (`None`: not made).
    searched: Option<Option<usize>>,
    /// Where the request went, for its record.
    dispatched: Option<Dispatched>,
}

impl ProxyBody {
    pub fn new(
        inner: UpstreamBody,
        idle_timeout: Duration,
        guard: InFlightGuard,
        report: BreakReport,
        sse: bool,
    ) -> ProxyBody {
        let (inner, lent) = inner.into_parts();
        ProxyBody {
            inner,
            lent,
            idle: IdleTimer::new(idle_timeout),
            guard: Some(guard),
            expected: None,
            report,
            sse,
            ended: false,
            output_seen: 0,
            strip: None,
            observer: Observer::new(sse),
            searched: None,
            dispatched: None,
        }
    }

    /// Keeps `expected` until the stream ends.
    pub fn carrying(mut self, expected: Option<Expected>) -> ProxyBody {
        self.expected = expected;
        self
    }

    /// Removes the usage event of a stream llmlb asked for usage, keeping
    /// its counts for the record ([`Observed::kept`]).
    pub fn strip_usage(mut self) -> ProxyBody {
        if self.sse {
            self.strip = Some(UsageStrip::default());
        }
        self
    }

    /// What the client has been sent so far.
    pub fn observed(&self) -> &Observed {
        self.observer.observed()
    }

    /// Notes where the request went (attempts, replica, branch).
    pub fn dispatched_to(&mut self, to: Dispatched) {
        self.dispatched = Some(to);
    }

    /// Where the request went, when [`Self::dispatched_to`] said.
    pub fn dispatched(&self) -> Option<&Dispatched> {
        self.dispatched.as_ref()
    }

    /// The replica's answer is an event stream (its `Content-Type`).
    pub fn is_sse(&self) -> bool {
        self.sse
    }

    /// Set when the replica's stream breaks.
    pub fn broken(&self) -> &StreamBroken {
        &self.report.broken
    }

    /// Output tokens, after the observer has seen `data` (a frame for the
    /// client): the replica's own count when a `usage` it reported was read
    /// since the last frame, else about one per SSE `data:` event.
    fn account(&mut self, data: &[u8]) {
        let report = self.observer.take_report();
        let Some(guard) = self.guard.as_mut() else {
            return;
        };
        let seen = match report {
            Some(Some(n)) => n.max(self.output_seen),
            _ if self.sse => self.output_seen + count_sse_events(data),
            _ => self.output_seen,
        };
        guard.produced(seen - self.output_seen);
        self.output_seen = seen;
    }

    /// The frame for the client: the usage event llmlb asked for is taken
    /// out. `None` when nothing is left of it.
    fn outgoing(&mut self, frame: Frame<Bytes>, usage_at: Option<usize>) -> Option<Frame<Bytes>> {
        let Some(strip) = self.strip.as_mut() else {
            // The frame goes as it came: the search made holds for it.
            self.searched = Some(usage_at);
            return Some(frame);
        };
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(other) => return Some(other),
        };
        let filtered = strip.filter(data, usage_at);
        if let Some(usage) = filtered.usage {
            self.observer.kept(usage);
        }
        if filtered.pass.is_empty() {
            return None;
        }
        // The filter's walk found where "usage" is in what it passes.
        self.searched = Some(filtered.usage_in_pass);
        Some(Frame::data(filtered.pass))
    }

    /// What the usage filter still holds when the replica's stream ends.
    fn leftover(&mut self) -> Option<Frame<Bytes>> {
        let rest = self.strip.as_mut()?.flush();
        (!rest.is_empty()).then(|| Frame::data(rest))
    }

    /// The answer ended: its connection goes back for the next request
    /// (unless a failure closed it first), its guards are released.
    fn finish(&mut self) {
        self.lent.give_back();
        self.ended = true;
        self.guard = None;
        self.expected = None;
    }

    /// Ends the stream after an upstream failure: SSE clients get an error
    /// event they can parse; others see the response cut off.
    fn fail(
        &mut self,
        kind: &str,
        message: String,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        // Not read to its end: its connection is not used again.
        self.lent.close();
        let r = &self.report;
        r.metrics
            .upstream_errors
            .with_label_values(&[&r.owner.name, &r.replica.name, kind])
            .inc();
        r.broken.set();
        r.owner
            .record_failure(&r.replica, Failure::Reset, &r.metrics);
        tracing::warn!(
            request_id = r.request_id.to_str().unwrap_or(""),
            pool = %r.owner.name,
            replica = %r.replica.name,
            kind,
            error = %message,
            "upstream stream failed"
        );
        self.finish();
        if self.sse {
            let event = serde_json::json!({
                "error": {"message": message, "type": "server_error", "code": kind}
            });
            Poll::Ready(Some(Ok(Frame::data(Bytes::from(format!(
                "data: {event}\n\n"
            ))))))
        } else {
            Poll::Ready(Some(Err(message.into())))
        }
    }
}

/// The last frame and what the usage filter still held, as one frame.
/// (Trailers never come with a held event: an SSE stream that ends with an
/// unfinished event has no trailers worth keeping over its bytes.)
fn join(last: Option<Frame<Bytes>>, rest: Option<Frame<Bytes>>) -> Option<Frame<Bytes>> {
    let Some(rest) = rest else {
        return last;
    };
    match last.map(Frame::into_data) {
        Some(Ok(data)) => {
            let rest = rest.into_data().unwrap_or_default();
            Some(Frame::data([data, rest].concat().into()))
        }
        _ => Some(rest),
    }
}

/// `data:` events in one chunk, not counting the final `[DONE]`: the lines
/// that start with `data:`. An event split across two chunks may be
/// missed; the estimate only steers balancing. The lines are found with
/// `memchr`; a line too short for `data:` ends the walk (a frame of one
/// event, vLLM's usual one, is one search: its blank line is all that
/// follows its line).
fn count_sse_events(chunk: &[u8]) -> u64 {
    let mut n = 0;
    let mut line = chunk;
    loop {
        if let Some(rest) = line.strip_prefix(b"data:")
            && !rest.trim_ascii_start().starts_with(b"[DONE]")
        {
            n += 1;
        }
        match memchr::memchr(b'\n', line) {
            Some(i) if line.len() - (i + 1) >= 5 => line = &line[i + 1..],
            _ => return n,
        }
    }
}

impl ProxyBody {
    /// The next frame for the client.
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self;
        if this.ended {
            return Poll::Ready(None);
        }
        loop {
            match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => {
                    // One search for `"usage"` per frame, for both the
                    // usage filter and the observer.
                    let usage_at = frame.data_ref().and_then(|data| {
                        // Prefill is over once the replica answers.
                        if let Some(guard) = this.guard.as_mut() {
                            guard.prefill_done();
                        }
                        USAGE_KEY.find(data)
                    });
                    // A body of known length ends with its last byte: hyper
                    // stops polling there, so this is where the answer is
                    // complete (not a client that went away).
                    let last = this.inner.is_end_stream();
                    // The idle timeout counts from the last frame; after
                    // the answer's last there is nothing to wait for (an
                    // answer that arrives whole reads no clock here).
                    if !last {
                        this.idle.touch();
                    }
                    let mut out = this.outgoing(frame, usage_at);
                    if last {
                        let rest = this.leftover();
                        if rest.is_some() {
                            // Joined: the frame is not the one searched.
                            this.searched = None;
                        }
                        out = join(out, rest);
                        this.finish();
                    }
                    match out {
                        Some(frame) => return Poll::Ready(Some(Ok(frame))),
                        None if last => return Poll::Ready(None),
                        // All of it was the usage event: its count goes to
                        // the balancer now, and the next frame is read.
                        None => {
                            this.account(&[]);
                            continue;
                        }
                    }
                }
                Poll::Ready(Some(Err(e))) => {
                    return this.fail("stream", format!("replica stream broke: {e}"));
                }
                Poll::Ready(None) => {
                    let rest = this.leftover();
                    this.finish();
                    return Poll::Ready(rest.map(Ok));
                }
                Poll::Pending if this.idle.expired(cx) => {
                    return this.fail(
                        "idle_timeout",
                        format!(
                            "replica sent nothing for {}",
                            crate::config::format_duration(this.idle.timeout())
                        ),
                    );
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl Body for ProxyBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let polled = this.poll_next(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
        {
            let usage_at = match this.searched.take() {
                Some(at) => at,
                None => USAGE_KEY.find(data),
            };
            this.observer.frame(data, usage_at);
            this.account(data);
        }
        this.searched = None;
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        if self.ended {
            SizeHint::with_exact(0)
        } else if self.strip.is_some() {
            // Bytes may be taken out: the replica's length no longer holds.
            SizeHint::default()
        } else {
            self.inner.size_hint()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::count_sse_events;

    #[test]
    fn counts_data_events_but_not_done() {
        assert_eq!(
            count_sse_events(b"data: {\"a\":1}\n\ndata: {\"b\":2}\n\n"),
            2
        );
        assert_eq!(count_sse_events(b"data: [DONE]\n\n"), 0);
        assert_eq!(count_sse_events(b": keep-alive\n\n"), 0);
        assert_eq!(count_sse_events(b"{\"x\":\"data: inside\"}"), 0);
        assert_eq!(count_sse_events(b""), 0);
        assert_eq!(count_sse_events(b"data:x\r\ndata: [DONE]\ndata:"), 2);
        assert_eq!(count_sse_events(b"\n\ndata:\n"), 1);
        assert_eq!(count_sse_events(b"xdata: a\n"), 0);
    }

    /// Counting at the lines' starts counts every `data:` found at a
    /// line's start: every chunk of up to five pieces below.
    #[test]
    fn counts_what_a_search_for_data_finds_at_line_starts() {
        let pieces: [&[u8]; 5] = [b"data:", b"\n", b"x", b" [DONE]", b"\r\n"];
        let mut chunks = vec![Vec::new()];
        for _ in 0..5 {
            let longer: Vec<Vec<u8>> = chunks
                .iter()
                .flat_map(|c| pieces.iter().map(move |p| [c.as_slice(), p].concat()))
                .collect();
            chunks.extend(longer);
        }
        for chunk in chunks {
            let found = (0..chunk.len())
                .filter(|&i| chunk[i..].starts_with(b"data:"))
                .filter(|&i| i == 0 || chunk[i - 1] == b'\n')
                .filter(|&i| !chunk[i + 5..].trim_ascii_start().starts_with(b"[DONE]"))
                .count() as u64;
            assert_eq!(count_sse_events(&chunk), found, "{chunk:?}");
        }
    }
}

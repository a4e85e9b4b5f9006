//! The response body of an admitted request: holds the queue [`Permit`] until
//! the stream ends (or the client goes away), and settles the caller's token
//! charge with the `usage` the replica reports: in the response body, or
//! the usage event llmlb asked a stream for and kept from the client
//! ([`ReportedUsage`] in the response's extensions). Without either, the
//! charge stays at its estimate.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::{AdmissionMetrics, Permit};
use crate::gateway::Caller;
use crate::net::{BoxError, ReportedUsage, ResponseBody, usage_tokens};

/// What to settle when the response ends.
#[derive(Debug)]
pub struct Settlement {
    pub caller: Caller,
    /// Tokens charged up front (prompt estimate plus output allowance).
    pub estimated: u64,
    pub metrics: AdmissionMetrics,
}

pub struct AdmittedBody {
    inner: ResponseBody,
    permit: Option<Permit>,
    settlement: Option<Settlement>,
    /// `usage.total_tokens` as last reported by the replica.
    reported: Option<u64>,
    /// The usage event kept from the client, when llmlb asked for one.
    kept: Option<ReportedUsage>,
}

impl AdmittedBody {
    pub fn new(
        inner: ResponseBody,
        permit: Option<Permit>,
        settlement: Option<Settlement>,
    ) -> AdmittedBody {
        AdmittedBody {
            inner,
            permit,
            settlement,
            reported: None,
            kept: None,
        }
    }

    /// Wraps a response's body, reading also the usage llmlb kept from the
    /// client's stream.
    pub fn respond(
        resp: http::Response<ResponseBody>,
        permit: Option<Permit>,
        settlement: Option<Settlement>,
    ) -> http::Response<ResponseBody> {
        use http_body_util::BodyExt;
        let kept = resp.extensions().get::<ReportedUsage>().cloned();
        resp.map(|body| {
            let mut admitted = AdmittedBody::new(body, permit, settlement);
            admitted.kept = kept;
            admitted.boxed_unsync()
        })
    }

    fn finish(&mut self) {
        self.permit = None;
        if let Some(s) = self.settlement.take() {
            if let Some(kept) = self.kept.as_ref().and_then(|k| k.tokens("total_tokens")) {
                self.reported = Some(kept);
            }
            let used = self.reported.unwrap_or(s.estimated);
            if self.reported.is_some() {
                s.caller.settle(s.estimated, used, Instant::now());
            }
            if let Some(tenant) = &s.caller.tenant {
                s.metrics
                    .tenant_tokens
                    .with_label_values(&[tenant])
                    .inc_by(used);
            }
        }
    }
}

impl Drop for AdmittedBody {
    fn drop(&mut self) {
        // The replica's in-flight guard (inside `inner`) goes first, then the
        // queue permit: a waiter granted by this permit must find the slot
        // already free.
        drop(std::mem::replace(
            &mut self.inner,
            crate::net::full_body(Bytes::new()),
        ));
        self.finish();
    }
}

impl Body for AdmittedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if this.settlement.is_some()
                    && let Some(n) = frame
                        .data_ref()
                        .and_then(|d| usage_tokens(d, "total_tokens"))
                {
                    this.reported = Some(n);
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => this.finish(),
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

//! One request's scope in one response body: everything a routed request
//! must do when its answer ends rides in [`ScopedBody`], the single wrapper
//! around the forwarding body (`forwarding::ProxyBody`, which keeps the data
//! path: idle timeout, first byte, the replica's in-flight guard). It is a
//! `net::Watched` body whose watcher, [`Scoped`], is the request's state;
//! `Watched` calls its end exactly once.
//!
//! The scope holds, as plain optional fields, the pool's `max_pending`
//! guard, the queue permit, the token settlement and the request's
//! end-of-request record ([`super::record`]). The answer is observed once,
//! by the body that makes it: the replica's `ProxyBody` notes the first
//! byte, the first generated content, a stream's closing `data: [DONE]` and
//! the replica's `usage` (in the body, or in the usage event llmlb kept from
//! the client) as frames pass, and the scope takes that
//! `forwarding::Observed` when the answer ends; a body llmlb made is observed by
//! the scope's own `forwarding::Observer`. The settlement and the record
//! read the same usage. The end-of-answer work runs exactly once, when the
//! body ends, fails or is dropped (the client went away).
//!
//! The chain a frame crosses is one static type, [`ScopedBody`], with no
//! boxed body in between: the scope watches an [`AnswerBody`], the
//! replica's `ProxyBody` itself or a body llmlb made (an error, a local
//! answer); the accept loop then wraps it in its per-connection count
//! (`net::Guarded`). Every answer is wrapped, also one with nothing to do
//! at its end (an empty scope): that costs a length add per frame, less
//! than a boxed layer would.
//!
//! Order at the end: the forwarding body (its in-flight guard) goes first,
//! then the pending guard and the queue permit (a waiter the permit grants
//! finds the replica's slot already free), then the settlement and the
//! record. A body of declared length finishes its record with its last
//! byte, as a server may drop it without polling its end; so does a stream
//! whose `data: [DONE]` went by (a client may close on it before the
//! stream's last, empty chunk). Cost per frame: a length add and a look
//! at the forwarding body's `done` flag; its [`Observed`] is copied once,
//! at the end. No body bytes are kept.

use bytes::Bytes;
use http::Response;
use http::header;
use http_body::Body;
use http_body_util::Either;

use std::sync::Arc;

use super::AppState;
use super::access_log::AccessStart;
use super::pending::PendingGuard;
use super::record::{Ended, Outcome, Record, Refusal, RouteFields};
use crate::admission::{Permit, Settlement};
use crate::forwarding::{Observed, Observer, ProxyBody};
use crate::net::{End, ResponseBody, USAGE_KEY, Watch, Watched};
use crate::routing::StreamBroken;

/// What a routed request holds until its answer ends (all optional: a
/// request refused early holds nothing).
#[derive(Default)]
pub struct Scope {
    /// The pool's `max_pending` count.
    pub pending: Option<PendingGuard>,
    /// The queue slot.
    pub permit: Option<Permit>,
    /// The caller's token charge, settled with the reported usage.
    pub settlement: Option<Settlement>,
}

impl Scope {
    /// A routed request's scope. Its charge is settled at the end when the
    /// caller has a key or the request went through a queue; otherwise
    /// there is nothing to settle.
    pub fn routed(
        pending: Option<PendingGuard>,
        permit: Option<Permit>,
        settlement: Settlement,
    ) -> Scope {
        let settles = permit.is_some() || settlement.caller.key.is_some();
        Scope {
            pending,
            permit,
            settlement: settles.then_some(settlement),
        }
    }
}

/// An answer's body before its scope: the replica's stream as forwarding
/// passes it on (`Left`), or a body llmlb made itself (`Right`).
pub type AnswerBody = Either<Box<ProxyBody>, ResponseBody>;

/// The response body of every answer: the [`AnswerBody`] watched by the
/// request's [`Scoped`] state, which is kept on the heap (one allocation a
/// request): it is over a kilobyte, and the response is moved by value
/// several times on its way into hyper's connection (`memcpy`).
pub type ScopedBody = Watched<Box<Scoped>, AnswerBody>;

/// Wraps `resp` in the request's scope: its end-of-request record (with
/// the `refusal` when llmlb answered with an error itself) and what
/// `scope` holds.
pub fn respond(
    state: &Arc<AppState>,
    access: AccessStart,
    fields: RouteFields,
    refusal: Option<Refusal>,
    scope: Scope,
    resp: Response<AnswerBody>,
) -> Response<ScopedBody> {
    let (parts, body) = resp.into_parts();
    let sse = match &body {
        // A replica's answer: its body read the same header when it was
        // made (`forwarding::stream_back`), and nothing changes it since.
        Either::Left(replica) => replica.is_sse(),
        Either::Right(_) => parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream")),
    };
    // The body's exact size is its `Content-Length` (a replica's, as hyper
    // read it, or one llmlb made), found without a header lookup.
    let length = body.size_hint().exact().or_else(|| {
        (parts.headers.get(header::CONTENT_LENGTH))
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
    });
    // A replica's answer: where it came from, and its stream's break flag.
    let (broken, dispatched) = match &body {
        Either::Left(replica) => (
            Some(replica.broken().clone()),
            replica.dispatched().cloned(),
        ),
        Either::Right(_) => (None, None),
    };
    let record = Record::new(
        state,
        access,
        fields,
        parts.status.as_u16(),
        dispatched,
        refusal,
    );
    let mut scoped = Box::new(Scoped::new(scope, Some(record), sse, length));
    scoped.broken = broken;
    Response::from_parts(parts, Watched::new(body, scoped))
}

/// What a request's answer holds and observes until it ends.
pub struct Scoped {
    scope: Scope,
    record: Option<Record>,
    /// The declared length, when there is one: a server may drop the body
    /// once it has written that many bytes, without polling its end.
    length: Option<u64>,
    seen: u64,
    /// Set by forwarding when the replica's stream broke.
    broken: Option<StreamBroken>,
    /// The answer so far, as its body observed it.
    answer: Observed,
    /// The observer of a body llmlb made (the replica's observes itself).
    own: Observer,
}

impl Scoped {
    pub fn new(scope: Scope, record: Option<Record>, sse: bool, length: Option<u64>) -> Scoped {
        Scoped {
            scope,
            record,
            length,
            seen: 0,
            broken: None,
            answer: Observed::default(),
            own: Observer::new(sse),
        }
    }

    /// Whether the whole answer was handed on: its declared length, or a
    /// stream's `data: [DONE]`.
    fn delivered(&self) -> bool {
        self.length.is_some_and(|n| self.seen >= n) || self.answer.done
    }

    /// How the answer ended, `how` its body ended.
    fn outcome(&self, how: End) -> Outcome {
        if let Some(fixed) = self.record.as_ref().and_then(Record::refused) {
            return fixed;
        }
        if self.broken.as_ref().is_some_and(StreamBroken::is_set) {
            return Outcome::StreamError;
        }
        match how {
            End::Complete => Outcome::Complete,
            End::Failed => Outcome::StreamError,
            End::Dropped { at_end } if at_end || self.delivered() => Outcome::Complete,
            End::Dropped { .. } => Outcome::ClientClosedMidstream,
        }
    }

    /// Finishes the request's record, once.
    fn finish(&mut self, how: End) {
        if self.record.is_some() {
            let outcome = self.outcome(how);
            let (usage, _) = self.answer.usage();
            if let Some(record) = self.record.take() {
                record.finish(Ended {
                    outcome,
                    first_byte: self.answer.first_byte,
                    first_content: self.answer.first_content,
                    usage,
                });
            }
        }
    }
}

impl Watch<AnswerBody> for Scoped {
    fn data(&mut self, body: &AnswerBody, data: &Bytes) {
        self.seen += data.len() as u64;
        if self.record.is_none() && self.scope.settlement.is_none() {
            return;
        }
        // The replica's answer is read from its body when it ends (below);
        // a body llmlb made is observed here.
        let done = match body {
            Either::Left(replica) => replica.observed().done,
            Either::Right(_) => {
                self.own.frame(data, USAGE_KEY.find(data));
                self.answer = *self.own.observed();
                self.answer.done
            }
        };
        if done || self.length.is_some_and(|n| self.seen >= n) || body.is_end_stream() {
            self.last_look(body);
            self.finish(End::Complete);
        }
    }

    /// The replica's answer as its body observed it, taken once at the end
    /// (the body goes before the end is told when it is dropped).
    fn last_look(&mut self, body: &AnswerBody) {
        if let Either::Left(replica) = body {
            self.answer = *replica.observed();
        }
    }

    /// Releases what the scope holds (the forwarding body has ended or
    /// gone already), then settles and finishes the record.
    fn end(&mut self, how: End) {
        self.scope.pending = None;
        if self.scope.permit.is_some() {
            // The tenant's fair share is corrected with what the replica
            // reports before the slot frees.
            let reported = self.answer.usage().0.and_then(|u| {
                let prompt = u.prompt_tokens?;
                let output = u.completion_tokens.unwrap_or(0);
                Some((prompt, output))
            });
            if let (Some((prompt, output)), Some(permit)) = (reported, &mut self.scope.permit) {
                permit.report_usage(prompt, output);
            }
        }
        self.scope.permit = None;
        if let Some(settlement) = self.scope.settlement.take() {
            let (_, total) = self.answer.usage();
            settlement.settle(total);
        }
        self.finish(how);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::{Admit, Level, PoolQueue, QueueParams};
    use crate::net::{Guarded, full_body};
    use crate::server::pending::{Gate, Gates};
    use http_body_util::BodyExt;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    /// The items of a scope, and the counters that show them settled.
    struct Fixture {
        gate: Arc<Gate>,
        queue: Arc<PoolQueue>,
        state: Arc<AppState>,
        /// Queue slots still held when the inner body went.
        held_at_inner_drop: Arc<Mutex<Vec<usize>>>,
    }

    impl Fixture {
        fn new() -> Fixture {
            let config = crate::config::parse(
                "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\nmax_pending = 1\n[[pools.replicas]]\nurl = \"http://127.0.0.1:1\"\n",
            )
            .unwrap();
            let queue = PoolQueue::new(
                QueueParams {
                    prefix_handoff: Duration::ZERO,
                    levels: vec![Level {
                        name: "only".into(),
                        max_wait: Duration::from_secs(1),
                        promote_after: Duration::from_secs(1),
                        ttft_objective: None,
                    }],
                    max_depth: 1,
                    fair: Default::default(),
                },
                Box::new(|| 1),
            );
            Fixture {
                gate: Gates::build(&config).get("p").unwrap(),
                queue,
                state: AppState::new(config),
                held_at_inner_drop: Arc::default(),
            }
        }

        fn body(&self) -> ScopedBody {
            let Admit::Now(permit) = self.queue.admit(0, Instant::now(), Duration::ZERO) else {
                panic!("a free slot");
            };
            let scope = Scope {
                pending: Some(self.gate.try_enter().unwrap()),
                permit: Some(permit),
                settlement: None,
            };
            let inner = Guarded::wrap(
                full_body("data: x\n\n"),
                InnerDrop(
                    Arc::clone(&self.queue),
                    Arc::clone(&self.held_at_inner_drop),
                ),
            );
            let inner = Either::Right(inner.boxed_unsync());
            let peer = "127.0.0.1:1".parse().unwrap();
            let id = http::HeaderValue::from_static("r1");
            let access = AccessStart::new(&http::Request::new(()), peer, &id, Instant::now(), None);
            let fields = RouteFields {
                pool: Some("p".into()),
                ..RouteFields::default()
            };
            let record = Record::new(&self.state, access, fields, 200, None, None);
            Watched::new(
                inner,
                Box::new(Scoped::new(scope, Some(record), true, None)),
            )
        }

        /// Requests the record counted, whatever their status label.
        fn recorded(&self) -> u64 {
            ["200", "499"]
                .map(|l| {
                    self.state
                        .metrics
                        .requests
                        .with_label_values(&["p", "", l])
                        .get()
                })
                .iter()
                .sum()
        }

        fn assert_settled_once(&self) {
            assert_eq!(self.gate.pending(), 0);
            assert_eq!(self.queue.active(), 0);
            assert_eq!(self.recorded(), 1);
        }
    }

    /// Stands for the replica's in-flight guard inside the forwarding body.
    struct InnerDrop(Arc<PoolQueue>, Arc<Mutex<Vec<usize>>>);

    impl Drop for InnerDrop {
        fn drop(&mut self) {
            self.1.lock().unwrap().push(self.0.active());
        }
    }

    #[tokio::test]
    async fn an_ended_body_settles_each_item_once() {
        let f = Fixture::new();
        let mut body = f.body();
        assert_eq!((f.gate.pending(), f.queue.active()), (1, 1));
        assert!(body.frame().await.unwrap().is_ok());
        assert_eq!(f.recorded(), 1, "the last byte finishes the record");
        assert_eq!(f.gate.pending(), 1, "the guards go at the body's end");
        assert!(body.frame().await.is_none());
        f.assert_settled_once();
        drop(body);
        f.assert_settled_once();
    }

    #[tokio::test]
    async fn a_body_dropped_early_settles_each_item_once_inner_first() {
        let f = Fixture::new();
        let body = f.body();
        drop(body);
        f.assert_settled_once();
        // The replica's slot went while the queue slot was still held.
        assert_eq!(*f.held_at_inner_drop.lock().unwrap(), [1]);
    }
}

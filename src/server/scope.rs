//! One request's scope in one response body: everything a routed request
//! must do when its answer ends rides in [`ScopedBody`], the single wrapper
//! around the forwarding body (`forwarding::ProxyBody`, which keeps the data
//! path: idle timeout, first byte, the replica's in-flight guard). It is a
//! `net::Watched` body whose watcher, [`Scoped`], is the request's state;
//! `Watched` calls its end exactly once.
//!
//! The scope holds, as plain optional fields, the canary version record,
//! the pool's `max_pending` guard, the queue permit, the token settlement
//! and the access-log entry. Each frame is observed once: its length, the
//! first generated content and the last 8 KiB of the body, where the
//! replica's `usage` is found once at the end for both the settlement and
//! the access log (or in the usage event llmlb kept from the client,
//! `net::ReportedUsage`). The end-of-answer work runs exactly once, when the
//! body ends, fails or is dropped (the client went away).
//!
//! The chain a frame crosses is one static type, [`ScopedBody`], with no
//! boxed body in between: the scope watches an [`AnswerBody`], the
//! replica's `ProxyBody` itself or a body llmlb made (an error, a local
//! answer); the accept loop then wraps it in its per-connection count
//! (`net::Guarded`). Every answer is wrapped, also one with nothing to do
//! at its end (an empty scope and no log line): that costs a length add
//! per frame, less than a boxed layer would.
//!
//! Order at the end: the forwarding body (its in-flight guard) goes first,
//! then the version record, the pending guard and the queue permit (a
//! waiter the permit grants finds the replica's slot already free), then
//! the settlement and the access-log line. A body of declared length writes
//! its line with its last byte, as a server may drop it without polling
//! its end. Cost per frame: a length add, a content scan until the first
//! content, and a copy into the tail buffer while a settlement or a line
//! is pending (cut back once per 8 KiB of body, not per frame).

use std::time::Instant;

use bytes::Bytes;
use http::Response;
use http::header;
use http_body::Body;
use http_body_util::Either;

use super::AppState;
use super::access_log::{AccessStart, Entry, RouteFields, Usage, find_usage, has_content};
use super::pending::PendingGuard;
use crate::admission::{Permit, Settlement};
use crate::forwarding::ProxyBody;
use crate::net::{End, ReportedUsage, ResponseBody, Watch, Watched};
use crate::routing::VersionRecord;

/// How much of the end of a body is kept to find `usage` in.
const TAIL_BYTES: usize = 8 * 1024;

/// What a routed request holds until its answer ends (all optional: a
/// request refused early holds nothing).
#[derive(Default)]
pub struct Scope {
    /// The canary version's outcome, recorded at the end.
    pub version: Option<VersionRecord>,
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
        version: Option<VersionRecord>,
        pending: Option<PendingGuard>,
        permit: Option<Permit>,
        settlement: Settlement,
    ) -> Scope {
        let settles = permit.is_some() || settlement.caller.key.is_some();
        Scope {
            version,
            pending,
            permit,
            settlement: settles.then_some(settlement),
        }
    }
}

/// An answer's body before its scope: the replica's stream as forwarding
/// passes it on (`Left`), or a body llmlb made itself (`Right`).
pub type AnswerBody = Either<ProxyBody, ResponseBody>;

/// The response body of every answer: the [`AnswerBody`] watched by the
/// request's [`Scoped`] state.
pub type ScopedBody = Watched<Scoped, AnswerBody>;

/// Wraps `resp` in the request's scope: its access-log entry (when there is
/// a line to write or a pool to count) and what `scope` holds.
pub fn respond(
    state: &AppState,
    access: AccessStart,
    fields: RouteFields,
    scope: Scope,
    resp: Response<AnswerBody>,
) -> Response<ScopedBody> {
    let (parts, body) = resp.into_parts();
    let entry = Entry::new(state, access, fields, &parts);
    let sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let length = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .or_else(|| body.size_hint().exact());
    let kept = parts.extensions.get::<ReportedUsage>().cloned();
    let scoped = Scoped::new(scope, entry, sse, length, kept);
    Response::from_parts(parts, Watched::new(body, scoped))
}

/// The last [`TAIL_BYTES`] of a body, where its `usage` is read. Up to
/// twice that is kept and cut back at once: one copy per 8 KiB of body
/// rather than one per frame.
#[derive(Default)]
struct Tail(Vec<u8>);

impl Tail {
    fn push(&mut self, data: &[u8]) {
        self.0.extend_from_slice(data);
        if self.0.len() > 2 * TAIL_BYTES {
            let cut = self.0.len() - TAIL_BYTES;
            self.0.drain(..cut);
        }
    }

    /// The last [`TAIL_BYTES`] (all of a shorter body).
    fn last(&self) -> &[u8] {
        &self.0[self.0.len().saturating_sub(TAIL_BYTES)..]
    }
}

/// What a request's answer holds and observes until it ends.
pub struct Scoped {
    scope: Scope,
    entry: Option<Entry>,
    sse: bool,
    /// The declared length, when there is one: a server may drop the body
    /// once it has written that many bytes, without polling its end.
    length: Option<u64>,
    seen: u64,
    first_content: Option<Instant>,
    tail: Tail,
    /// The usage event llmlb asked a stream for and kept from the client.
    kept: Option<ReportedUsage>,
    /// The usage once read (the body's usage, the token total).
    usage: Option<(Option<Usage>, Option<u64>)>,
}

impl Scoped {
    pub fn new(
        scope: Scope,
        entry: Option<Entry>,
        sse: bool,
        length: Option<u64>,
        kept: Option<ReportedUsage>,
    ) -> Scoped {
        Scoped {
            scope,
            entry,
            sse,
            length,
            seen: 0,
            first_content: None,
            tail: Tail::default(),
            kept,
            usage: None,
        }
    }

    /// The replica's usage: the body's last `usage` object, else the event
    /// kept from the client. The kept event is preferred for the token
    /// total, which is what the charge is settled with. Read once, when the
    /// answer has ended.
    fn usage(&mut self) -> (Option<Usage>, Option<u64>) {
        if let Some(read) = self.usage {
            return read;
        }
        let kept = self
            .kept
            .as_ref()
            .and_then(ReportedUsage::event)
            .and_then(|e| find_usage(e));
        let body = find_usage(self.tail.last());
        let total = kept
            .and_then(|u| u.total_tokens)
            .or(body.and_then(|u| u.total_tokens));
        let read = (body.or(kept), total);
        self.usage = Some(read);
        read
    }

    /// Writes the access-log line (and the per-model metrics), once.
    fn log(&mut self, outcome: &'static str) {
        if self.entry.is_some() {
            let (usage, _) = self.usage();
            if let Some(entry) = self.entry.take() {
                entry.finish(outcome, self.first_content, usage);
            }
        }
    }
}

impl Watch for Scoped {
    fn data(&mut self, data: &Bytes, at_end: bool) {
        self.seen += data.len() as u64;
        if self.entry.is_none() && self.scope.settlement.is_none() {
            return;
        }
        if self.first_content.is_none() && !data.is_empty() && (!self.sse || has_content(data)) {
            self.first_content = Some(Instant::now());
        }
        self.tail.push(data);
        if at_end || self.length.is_some_and(|n| self.seen >= n) {
            self.log("complete");
        }
    }

    /// Releases what the scope holds (the forwarding body has ended or
    /// gone already), then settles and logs.
    fn end(&mut self, how: End) {
        let outcome = match how {
            End::Complete => "complete",
            End::Failed => "upstream_error",
            End::Dropped { at_end } if at_end || self.length.is_some_and(|n| self.seen >= n) => {
                "complete"
            }
            End::Dropped { .. } => "client_closed",
        };
        self.scope.version = None;
        self.scope.pending = None;
        if self.scope.permit.is_some() {
            // The tenant's fair share is corrected with what the replica
            // reports before the slot frees.
            let reported = self.usage().0.and_then(|u| {
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
            let (_, total) = self.usage();
            settlement.settle(total);
        }
        self.log(outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admission::{Admit, Level, PoolQueue, QueueParams};
    use crate::net::{Guarded, full_body};
    use crate::routing::RoutingMetrics;
    use crate::server::pending::{Gate, Gates};
    use http_body_util::BodyExt;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    /// The items of a scope, and the counters that show them settled.
    struct Fixture {
        gate: Arc<Gate>,
        queue: Arc<PoolQueue>,
        versions: RoutingMetrics,
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
                versions: RoutingMetrics::new(&prometheus::Registry::new()),
                held_at_inner_drop: Arc::default(),
            }
        }

        fn body(&self) -> ScopedBody {
            let Admit::Now(permit) = self.queue.admit(0, Instant::now(), Duration::ZERO) else {
                panic!("a free slot");
            };
            let scope = Scope {
                version: Some(VersionRecord {
                    metrics: self.versions.clone(),
                    pool: "p".into(),
                    version: "v1".into(),
                    status: 200,
                    start: Instant::now(),
                    broken: None,
                }),
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
            Watched::new(inner, Scoped::new(scope, None, true, None, None))
        }

        fn versions_recorded(&self) -> u64 {
            self.versions
                .version_requests
                .with_label_values(&["p", "v1", "200"])
                .get()
        }

        fn assert_settled_once(&self) {
            assert_eq!(self.gate.pending(), 0);
            assert_eq!(self.queue.active(), 0);
            assert_eq!(self.versions_recorded(), 1);
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
        assert_eq!(f.versions_recorded(), 0, "nothing settles mid-answer");
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

    #[test]
    fn usage_is_read_once_from_the_tail_or_the_kept_event() {
        let f = Fixture::new();
        let kept = ReportedUsage::default();
        kept.set(Bytes::from_static(
            br#"data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}"#,
        ));
        let mut body = f.body();
        let scoped = body.watch_mut();
        scoped.kept = Some(kept);
        scoped.tail = Tail(br#"data: {"usage":null}"#.to_vec());
        let (usage, total) = scoped.usage();
        assert_eq!(total, Some(7));
        assert_eq!(usage.and_then(|u| u.completion_tokens), Some(4));
        scoped.tail.0.clear();
        assert_eq!(scoped.usage().0, usage, "read once");
    }

    #[test]
    fn the_tail_is_the_last_8_kib_however_much_is_kept() {
        let mut tail = Tail::default();
        let body: Vec<u8> = (0..5 * TAIL_BYTES + 123).map(|i| (i % 251) as u8).collect();
        for (n, frame) in body.chunks(1000).enumerate() {
            tail.push(frame);
            let seen = ((n + 1) * 1000).min(body.len());
            assert_eq!(tail.last(), &body[seen.saturating_sub(TAIL_BYTES)..seen]);
            assert!(tail.0.len() <= 2 * TAIL_BYTES);
        }
    }
}

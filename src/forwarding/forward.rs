//! One proxied request: pick a replica, send the original bytes, retry on
//! another replica when the connection fails before any response byte, and
//! hand back a streaming response.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, Entry, HeaderMap, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;

use super::Origin;
use super::body::{BreakReport, ProxyBody};
use super::error::ForwardError;
use super::headers::{FORWARDED_FOR, REPLICA_HEADER, REQUEST_ID, strip_hop_by_hop};
use super::recent::Outcome;
use crate::balancing::{Branch, Pick, RequestInfo};
use crate::net::{UpstreamBody, UpstreamError};
use crate::pool::{Choice, choose};
use crate::pool::{Failure, Pool};
use crate::replica::{Replica, ReplicaId};
use crate::routing::StreamBroken;
use crate::routing::{Decision, Expected};
use crate::telemetry::Metrics;
use crate::telemetry::clock::now_millis;
use crate::telemetry::log_line::write_ip;
use crate::telemetry::trace::StageSpan;

/// Everything needed to send one client request upstream.
pub struct ForwardRequest<'a> {
    pub pool: &'a Arc<Pool>,
    pub method: Method,
    /// The client's, as parsed from its request.
    pub path_and_query: PathAndQuery,
    /// Client headers, hop-by-hop ones already removed.
    pub headers: HeaderMap,
    /// The body to send, and the one with `stream_options` added when llmlb
    /// asks the stream for its usage.
    pub body: super::Outbound,
    pub info: RequestInfo<'a>,
    /// The routing stage's limits and preference among the pool's replicas.
    pub route: &'a Decision,
    /// Whom it is for; where its attempts are counted and traced.
    pub origin: &'a Origin<'a>,
    /// Name the serving replica in an `x-llmlb-replica` response header.
    pub expose_replica: bool,
    /// Where the attempts are written down as they are made (the
    /// request's record, which counts the re-sends).
    pub progress: &'a mut super::Progress,
}

/// Sends the request to a replica the decision allows, moving to another
/// only when the connection was never made, and hands back the answer as
/// it streams. The request is borrowed: the caller's future holds it, and
/// this one does not hold a second copy.
pub async fn forward(
    req: &mut ForwardRequest<'_>,
) -> Result<Response<Box<ProxyBody>>, ForwardError> {
    let pool = req.pool;
    // Streams are asked for their token count (`stream_usage`); the usage
    // event goes to accounting, not to a client that did not ask for it.
    let asked_usage = req.body.with_usage.take();
    let mut headers = std::mem::take(&mut req.headers);
    prepare_upstream_headers(&mut headers, req.origin.request_id, req.origin.client_ip);
    let mut headers = Upstream(Some(headers));
    let mut tried = Tried::default();
    let max_attempts = pool.retries + 1;
    let mut slot_deadline: Option<tokio::time::Instant> = None;
    loop {
        let Some((replica, pick)) = next_pick(req, tried.as_slice(), &mut slot_deadline).await?
        else {
            continue;
        };
        let replica = &replica;
        // The slot is taken as part of the pick: the check and the count are
        // one atomic step, so a request that lost the race picks again.
        let Some(mut guard) = replica.try_acquire_tokens(
            u64::from(req.info.prompt_tokens),
            req.info.expected_output(pool.balancing.default_max_tokens),
        ) else {
            continue;
        };
        pool.record_branch(pick.branch, req.origin.metrics);
        tried.push(replica.id);
        let n = tried.len() as u32;
        let (expected, seq) = dispatch(req, &mut guard, pick.branch, n);
        if let Some(a) = &req.route.adapter {
            guard.run_adapter(a);
        }
        // A replica not tried yet may take the request again: only then does
        // this attempt send a copy of the headers.
        let retry = n < max_attempts && (n as usize) < pool.replicas.len();
        let (attempt, sent, strip_usage) = send_with_usage(
            req,
            replica,
            &mut headers,
            retry,
            asked_usage.as_ref(),
            n as usize,
        )
        .await?;
        let resp = match sent {
            Err(UpstreamError::HeadTimeout) => {
                return Err(timed_out(req, replica, attempt.as_ref(), seq));
            }
            Err(err) => {
                let not_sent = attempt_failed(req, replica, attempt.as_ref(), seq, &err);
                drop(guard);
                if !not_sent || n >= max_attempts {
                    return Err(ForwardError::UpstreamUnavailable {
                        pool: pool.name.clone(),
                        attempts: n,
                    });
                }
                continue;
            }
            Ok(resp) => resp,
        };
        answered(req, replica, attempt, seq, resp.status());
        let mut resp = stream_back(resp, req, replica, guard, expected, strip_usage);
        resp.body_mut().dispatched_to(super::Dispatched {
            replica: Arc::clone(&replica.series(&pool.name, req.origin.metrics).replica),
            branch: pick.branch.as_str(),
            attempts: n,
            predicted_cached: req.route.predicted_for(replica.id),
            predicted_ttft: req.route.predicted_ttft_for(replica.id),
            kind: req.route.kind_label(),
        });
        return Ok(resp);
    }
}

/// The replicas a request was sent to, in order: the first few on the
/// stack (a request is sent once or twice; a `Vec` allocated for each one
/// showed in its profile), any more after them in a `Vec`.
#[derive(Default)]
struct Tried {
    few: [ReplicaId; 4],
    len: usize,
    more: Vec<ReplicaId>,
}

impl Tried {
    fn push(&mut self, id: ReplicaId) {
        match self.few.get_mut(self.len) {
            Some(slot) => *slot = id,
            None => {
                if self.more.is_empty() {
                    self.more.extend_from_slice(&self.few);
                }
                self.more.push(id);
            }
        }
        self.len += 1;
    }

    /// How many, as a count of attempts.
    fn len(&self) -> usize {
        self.len
    }

    fn as_slice(&self) -> &[ReplicaId] {
        match self.more.is_empty() {
            true => &self.few[..self.len],
            false => &self.more,
        }
    }
}

/// The next replica to try and the balancer's pick; `None` after waiting
/// for a slot (pick again). `max_inflight` is a hard limit: when every
/// replica the request may use is full it waits for one of them (never for
/// a replica it may not use, and never by overfilling one).
async fn next_pick(
    req: &ForwardRequest<'_>,
    tried: &[ReplicaId],
    slot_deadline: &mut Option<tokio::time::Instant>,
) -> Result<Option<(Arc<Replica>, Pick)>, ForwardError> {
    let pool = req.pool;
    match choose(pool, req.route, tried, &req.info, now_millis()) {
        Choice::Pick(replica, pick) => Ok(Some((replica, pick))),
        Choice::Wait(allowed) => {
            wait_for_slot(pool, &allowed, slot_deadline).await?;
            Ok(None)
        }
        Choice::NoReplica(branch) => {
            pool.record_branch(branch, req.origin.metrics);
            Err(if tried.is_empty() {
                ForwardError::NoHealthyReplica {
                    pool: pool.name.clone(),
                }
            } else {
                ForwardError::UpstreamUnavailable {
                    pool: pool.name.clone(),
                    attempts: tried.len() as u32,
                }
            })
        }
    }
}

/// Writes attempt `n` down before it is sent: in the request's record (a
/// re-send counts only once another replica took it), the adapter swap it
/// causes, the status page's recent dispatches and the debug log. Returns
/// what `exact` mode expects on the replica while the answer lives, and
/// the status-page entry to settle.
fn dispatch(
    req: &mut ForwardRequest<'_>,
    guard: &mut crate::replica::InFlightGuard,
    branch: Branch,
    n: u32,
) -> (Option<Expected>, u64) {
    let pool = req.pool;
    let sent = req.route.dispatched_with(guard);
    let replica = guard.replica();
    req.progress.attempts = n;
    req.progress.replica = Some(Arc::clone(replica));
    if sent.swap {
        req.origin
            .metrics
            .lora_swaps
            .with_label_values(&[&pool.name, &replica.name])
            .inc();
    }
    let series = replica.series(&pool.name, req.origin.metrics);
    let seq = req.origin.recent.record(
        Arc::clone(&series.pool),
        Arc::clone(&series.replica),
        branch.as_str(),
        req.route.route_label(),
        n,
    );
    tracing::debug!(
        request_id = req.origin.request_id.to_str().unwrap_or(""),
        pool = %pool.name,
        replica = %replica.name,
        route = %req.route.route_label(),
        branch = branch.as_str(),
        attempt = n,
        "dispatch"
    );
    (sent.sent, seq)
}

/// Sends attempt `n`: the body with `stream_options` added when llmlb asks
/// the stream for its usage, unless this replica refused it before. A 400
/// to that generated nothing: the same replica gets the body as the client
/// sent it (and keeps getting it if that one is taken). A replica whose
/// last answer to the field was not a 400 is not expected to refuse it:
/// no copy of the headers is kept for that second send, and a 400 goes
/// to the client (the next stream keeps a copy again). Returns the
/// attempt's span, what the send gave, and whether the answer carries a
/// usage event llmlb asked for (to strip). `retry`: another replica may
/// take the request after this attempt.
async fn send_with_usage(
    req: &ForwardRequest<'_>,
    replica: &Replica,
    headers: &mut Upstream,
    retry: bool,
    asked_usage: Option<&Bytes>,
    n: usize,
) -> Result<(Option<StageSpan>, Sent, bool), ForwardError> {
    let with_usage = asked_usage.filter(|_| !replica.refuses_stream_options());
    let may_refuse = with_usage.is_some() && !replica.takes_stream_options();
    let body = with_usage.unwrap_or(&req.body.body);
    let first = headers.for_send(retry || may_refuse);
    let (attempt, sent) = send_once(req, replica, first, body, n).await?;
    if let (Some(_), Ok(resp)) = (with_usage, &sent) {
        replica.note_takes_stream_options(resp.status() != StatusCode::BAD_REQUEST);
    }
    match sent {
        Ok(resp) if may_refuse && resp.status() == StatusCode::BAD_REQUEST => {
            drop(resp);
            if let Some(a) = attempt {
                a.set("http.response.status_code", 400);
            }
            let again = headers.for_send(retry);
            let (attempt, again) = send_once(req, replica, again, &req.body.body, n).await?;
            if let Ok(r) = &again
                && r.status() != StatusCode::BAD_REQUEST
                && replica.note_refuses_stream_options()
            {
                tracing::warn!(request_id = req.origin.request_id.to_str().unwrap_or(""), pool = %req.pool.name, replica = %replica.name, "replica refuses stream_options: streams to it go as sent, their tokens counted from the stream");
            }
            Ok((attempt, again, false))
        }
        other => Ok((attempt, other, with_usage.is_some())),
    }
}

/// No response head within the first-byte timeout: the attempt fails and
/// counts against the replica; the request ends there (the replica may be
/// working on it).
fn timed_out(
    req: &ForwardRequest<'_>,
    replica: &Replica,
    attempt: Option<&StageSpan>,
    seq: u64,
) -> ForwardError {
    let pool = req.pool;
    if let Some(a) = attempt {
        a.fail("timeout");
    }
    req.origin.recent.settle(seq, Outcome::Timeout);
    count_upstream_error(req.origin.metrics, pool, replica, "timeout");
    pool.record_failure(replica, Failure::Timeout, req.origin.metrics);
    ForwardError::UpstreamTimeout {
        pool: pool.name.clone(),
        timeout: crate::config::format_duration(pool.timeouts.first_byte),
    }
}

/// A transport error: the attempt fails and counts against the replica.
/// True when the request provably never left: only a connection that was
/// never made (refused, TLS failure, connect timeout) proves it; anything
/// else may have reached the replica, and sending it again elsewhere could
/// generate twice.
fn attempt_failed(
    req: &ForwardRequest<'_>,
    replica: &Replica,
    attempt: Option<&StageSpan>,
    seq: u64,
    err: &UpstreamError,
) -> bool {
    let pool = req.pool;
    let not_sent = err.is_connect();
    let (kind, failure, outcome) = if not_sent {
        ("connect", Failure::Connect, Outcome::Connect)
    } else {
        ("reset", Failure::Reset, Outcome::Reset)
    };
    if let Some(a) = attempt {
        a.fail(kind);
    }
    req.origin.recent.settle(seq, outcome);
    count_upstream_error(req.origin.metrics, pool, replica, kind);
    pool.record_failure(replica, failure, req.origin.metrics);
    tracing::info!(request_id = req.origin.request_id.to_str().unwrap_or(""), pool = %pool.name, replica = %replica.name, error = %crate::net::error_chain(err), "upstream attempt failed");
    not_sent
}

/// A response head: its status on the attempt's span (which ends here)
/// and the status page; a 5xx counts against the replica, except 503 (a
/// replica saying "full", vLLM's queue limits, not "dead").
fn answered(
    req: &ForwardRequest<'_>,
    replica: &Replica,
    attempt: Option<StageSpan>,
    seq: u64,
    status: StatusCode,
) {
    if let Some(a) = attempt {
        a.set("http.response.status_code", i64::from(status.as_u16()));
    }
    req.origin
        .recent
        .settle(seq, Outcome::Status(status.as_u16()));
    let pool = req.pool;
    match status.as_u16() {
        503 => {}
        500..=599 => pool.record_failure(replica, Failure::ServerError, req.origin.metrics),
        _ => pool.record_success(replica),
    }
}

/// Waits until one of `candidates` (all at their limit) ends a request, up
/// to the pool's queue timeout counted from the first wait (503 after).
async fn wait_for_slot(
    pool: &Pool,
    candidates: &[Arc<Replica>],
    deadline: &mut Option<tokio::time::Instant>,
) -> Result<(), ForwardError> {
    let timeout = pool
        .admission
        .as_ref()
        .map_or(pool.timeouts.first_byte, |a| a.timeout);
    let until = *deadline.get_or_insert_with(|| tokio::time::Instant::now() + timeout);
    let mut freed: Vec<_> = candidates
        .iter()
        .map(|r| Box::pin(r.slot_freed()))
        .collect();
    for f in &mut freed {
        f.as_mut().enable();
    }
    // A slot freed between the caller's check and `enable` is seen here.
    if candidates.iter().any(|r| r.has_free_slot()) {
        return Ok(());
    }
    // Counted as demand for these replicas while it waits (a fleet store
    // grows this instance's share of them from it).
    let _waiting: Vec<_> = candidates.iter().map(|r| r.wait_here()).collect();
    crate::fleet::nudge();
    let any = futures_util::future::select_all(freed);
    match tokio::time::timeout_at(until, any).await {
        Ok(_) => Ok(()),
        Err(_) => Err(ForwardError::SlotTimeout {
            retry_after: pool
                .admission
                .as_ref()
                .map_or(Duration::from_secs(1), |a| a.queue.backlog_drain_time()),
        }),
    }
}

fn prepare_upstream_headers(headers: &mut HeaderMap, request_id: &HeaderValue, ip: IpAddr) {
    // Each attempt sets the replica's Host (replacing the client's); hyper
    // sets Content-Length from the body.
    headers.remove(header::CONTENT_LENGTH);
    headers.insert(REQUEST_ID, request_id.clone());
    // One lookup of the name for the client's value and the new one.
    match headers.entry(FORWARDED_FOR) {
        Entry::Occupied(mut e) => {
            let prev = Some(e.get()).filter(|v| !v.is_empty() && v.to_str().is_ok());
            let value = match prev {
                Some(prev) => forwarded_for(prev.as_bytes(), ip),
                None => client_address(ip),
            };
            if let Some(v) = value {
                e.insert(v);
            }
        }
        Entry::Vacant(e) => {
            if let Some(v) = client_address(ip) {
                e.insert(v);
            }
        }
    }
}

/// `ip` after `prev` and `, ` (when `prev` is not empty), as a header value.
fn forwarded_for(prev: &[u8], ip: IpAddr) -> Option<HeaderValue> {
    let mut value = Vec::with_capacity(64);
    if !prev.is_empty() {
        value.extend_from_slice(prev);
        value.extend_from_slice(b", ");
    }
    write_ip(ip, &mut value);
    // The buffer becomes the value's, without a second copy.
    HeaderValue::from_maybe_shared(Bytes::from(value)).ok()
}

thread_local! {
    /// The last client address this thread wrote as `X-Forwarded-For`.
    static LAST_CLIENT: std::cell::RefCell<Option<(IpAddr, HeaderValue)>> =
        const { std::cell::RefCell::new(None) };
}

/// `ip` alone as a header value. The last one made on this thread is kept:
/// a connection's requests (and often its client's next connections) come
/// from one address, so most requests share its bytes (a count) instead of
/// writing the address into a new allocation.
fn client_address(ip: IpAddr) -> Option<HeaderValue> {
    LAST_CLIENT.with(|last| {
        let Ok(mut last) = last.try_borrow_mut() else {
            return forwarded_for(b"", ip);
        };
        if let Some((at, value)) = last.as_ref()
            && *at == ip
        {
            return Some(value.clone());
        }
        let value = forwarded_for(b"", ip)?;
        *last = Some((ip, value.clone()));
        Some(value)
    })
}

/// The headers every attempt sends. A hyper request owns its map, so a
/// send that another may follow gets a copy; the last one takes the map.
struct Upstream(Option<HeaderMap>);

impl Upstream {
    /// The map for one send: a copy when `again` (another send may follow),
    /// else the map itself.
    fn for_send(&mut self, again: bool) -> HeaderMap {
        let map = match again {
            true => self.0.clone(),
            false => self.0.take(),
        };
        map.expect("no send follows the last one")
    }
}

/// What one send gives back: the head, or why there is none (a timeout is
/// [`UpstreamError::HeadTimeout`]).
type Sent = Result<Response<UpstreamBody>, UpstreamError>;

/// Sends `body` to `replica` as attempt number `n` (its own trace span,
/// whose context goes with the request), waiting at most the pool's
/// first-byte timeout for the response head.
async fn send_once(
    req: &ForwardRequest<'_>,
    replica: &Replica,
    headers: HeaderMap,
    body: &Bytes,
    n: usize,
) -> Result<(Option<StageSpan>, Sent), ForwardError> {
    let mut upstream = build_request(&req.method, replica, &req.path_and_query, headers, body)?;
    let attempt = (req.origin.trace).map(|t| t.attempt(&replica.name, n, upstream.headers_mut()));
    let pool = req.pool;
    let sent = pool
        .client
        .request_within(&replica.conns, upstream, Some(pool.timeouts.first_byte))
        .await;
    Ok((attempt, sent))
}

/// The request for `replica`: the client's method, path and (prepared)
/// headers, the replica's URL and `Host`.
pub(super) fn build_request(
    method: &Method,
    replica: &Replica,
    path_and_query: &PathAndQuery,
    headers: HeaderMap,
    body: &Bytes,
) -> Result<Request<Full<Bytes>>, ForwardError> {
    let uri = replica
        .uri(path_and_query.clone())
        .map_err(|e| ForwardError::InvalidPath(e.to_string()))?;
    let mut req = Request::new(Full::new(body.clone()));
    *req.method_mut() = method.clone();
    *req.uri_mut() = uri;
    *req.headers_mut() = headers;
    req.headers_mut().insert(header::HOST, replica.host.clone());
    Ok(req)
}

fn stream_back(
    resp: Response<UpstreamBody>,
    req: &ForwardRequest<'_>,
    replica: &Arc<Replica>,
    guard: crate::replica::InFlightGuard,
    expected: Option<Expected>,
    strip_usage: bool,
) -> Response<Box<ProxyBody>> {
    let (mut parts, incoming) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    parts
        .headers
        .entry(REQUEST_ID)
        .or_insert_with(|| req.origin.request_id.clone());
    if req.expose_replica
        && let Ok(v) = HeaderValue::from_str(&replica.name)
    {
        parts.headers.insert(REPLICA_HEADER, v);
    }
    let sse = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let report = BreakReport {
        metrics: Arc::clone(req.origin.metrics),
        owner: Arc::clone(req.pool),
        replica: Arc::clone(replica),
        broken: StreamBroken::default(),
        request_id: req.origin.request_id.clone(),
    };
    let mut body =
        ProxyBody::new(incoming, req.pool.timeouts.idle, guard, report, sse).carrying(expected);
    if strip_usage && sse {
        // Bytes may be taken out of the stream: its length is no longer known.
        parts.headers.remove(header::CONTENT_LENGTH);
        body = body.strip_usage();
    }
    // On the heap: the body is over half a kilobyte, and the response is
    // moved by value at each step up to hyper's connection (`memcpy`).
    Response::from_parts(parts, Box::new(body))
}

fn count_upstream_error(metrics: &Metrics, pool: &Pool, replica: &Replica, kind: &str) {
    metrics
        .upstream_errors
        .with_label_values(&[&pool.name, &replica.name, kind])
        .inc();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Past the few on the stack the ids go on in a `Vec`, in order.
    #[test]
    fn tried_keeps_every_replica_in_order() {
        let mut tried = Tried::default();
        assert!(tried.as_slice().is_empty());
        for id in 0..9 {
            tried.push(id * 10);
            let want: Vec<ReplicaId> = (0..=id).map(|i| i * 10).collect();
            assert_eq!(tried.as_slice(), want.as_slice());
            assert_eq!(tried.len(), want.len());
        }
    }

    #[test]
    fn the_client_address_is_forwarded_after_what_the_client_sent() {
        let id = HeaderValue::from_static("r1");
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "::1".parse().unwrap());
        let cases = [
            (a, None),
            (a, None),
            (b, None),
            (a, Some("1.2.3.4")),
            (a, None),
            (b, Some("")),
            (b, None),
            (a, Some("\u{e9}")),
        ];
        for (ip, sent) in cases {
            let mut headers = HeaderMap::new();
            if let Some(s) = sent {
                headers.insert(
                    FORWARDED_FOR,
                    HeaderValue::from_bytes(s.as_bytes()).unwrap(),
                );
            }
            prepare_upstream_headers(&mut headers, &id, ip);
            let want = match sent {
                Some(s) if !s.is_empty() && s.is_ascii() => format!("{s}, {ip}"),
                _ => ip.to_string(),
            };
            assert_eq!(headers[FORWARDED_FOR], want.as_str());
            assert_eq!(headers.get_all(FORWARDED_FOR).iter().count(), 1);
            assert_eq!(headers[REQUEST_ID], "r1");
        }
    }
}

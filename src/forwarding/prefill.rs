//! The prefill step of a disaggregated request: a prefill replica computes
//! the prompt's KV cache (one output token, not streamed), and its answer
//! becomes the body the decode replica gets ([`crate::kv_transfer`]).
//!
//! A prefill is invisible to the client, so any failure may move it to
//! another prefill replica: a connection refused or reset, a timeout, an
//! error status or an answer the protocol cannot read. After
//! `prefill_attempts` replicas, or once `prefill_timeout` has passed since
//! the first attempt, the caller falls back (the decode replica prefills
//! itself) or gives up. Dropping the future (the client left) drops the
//! connection to the prefill replica, which aborts the request there.
//!
//! Each attempt holds the prefill replica's in-flight guard until its
//! answer is read, and counts in `llmlb_prefill_attempts_total`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Limited};

use super::headers::REQUEST_ID;
use super::{Origin, Outbound};
use crate::balancing::RequestInfo;
use crate::kv_transfer::{Pairing, Protocol};
use crate::pool::{Choice, Failure, Pool, choose};
use crate::replica::{Replica, ReplicaId};
use crate::routing::Decision;
use crate::telemetry::clock::now_millis;
use crate::telemetry::trace::StageSpan;

/// Largest prefill answer read (a one-token answer and its transfer
/// parameters are a few KiB).
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// One request's prefill, as the forwarder sends it.
pub struct PrefillRequest<'a> {
    /// The prefill pool.
    pub pool: &'a Arc<Pool>,
    /// The routing decision within the prefill pool.
    pub route: &'a Decision,
    pub method: &'a Method,
    pub path_and_query: &'a str,
    /// Upstream headers (hop-by-hop and llmlb's own removed, the prefill
    /// pool's key set).
    pub headers: HeaderMap,
    /// The client's body (the model name as served), and the same asking
    /// a stream for its usage.
    pub body: &'a Outbound,
    pub protocol: &'static dyn Protocol,
    /// `sglang`: the prefill servers' bootstrap port.
    pub bootstrap_port: u16,
    pub info: RequestInfo<'a>,
    pub timeout: Duration,
    pub attempts: u32,
    /// Whom it is for; where its attempts are counted and traced.
    pub origin: &'a Origin<'a>,
    pub disaggregation: &'a super::DisaggregationMetrics,
}

/// A prefill that succeeded.
#[derive(Debug)]
pub struct Prefilled {
    /// The prefill replica that answered.
    pub replica: Arc<Replica>,
    /// What the decode replica gets.
    pub decode_body: Outbound,
    /// Prefill replicas tried, this one included.
    pub attempts: u32,
    /// From the first attempt to the answer read.
    pub elapsed: Duration,
}

/// Why no prefill replica did the work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrefillError {
    #[error("no prefill replica of pool `{pool}` is available")]
    NoReplica { pool: String },
    #[error("the prefill failed on {attempts} replica(s) of pool `{pool}`: {last}")]
    Failed {
        pool: String,
        attempts: u32,
        last: &'static str,
    },
}

/// Runs the prefill step; see the module docs.
pub async fn prefill(req: PrefillRequest<'_>) -> Result<Prefilled, PrefillError> {
    let pool = req.pool;
    let start = Instant::now();
    let deadline = tokio::time::Instant::now() + req.timeout;
    let mut tried: Vec<ReplicaId> = Vec::new();
    let failed = |tried: &[ReplicaId], last| PrefillError::Failed {
        pool: pool.name.clone(),
        attempts: tried.len() as u32,
        last,
    };
    let headers = prefill_headers(&req);
    loop {
        if tried.len() as u32 >= req.attempts {
            return Err(failed(&tried, "attempts used up"));
        }
        let (replica, pick) = match choose(pool, req.route, &tried, &req.info, now_millis()) {
            Choice::Pick(replica, pick) => (replica, pick),
            Choice::Wait(full) => {
                if !wait_for_slot(&full, deadline).await {
                    return Err(failed(&tried, "timeout"));
                }
                continue;
            }
            Choice::NoReplica(_) if tried.is_empty() => {
                return Err(PrefillError::NoReplica {
                    pool: pool.name.clone(),
                });
            }
            Choice::NoReplica(_) => return Err(failed(&tried, "no replica left")),
        };
        let Some(mut guard) = replica.try_acquire_tokens(u64::from(req.info.prompt_tokens), 1)
        else {
            continue;
        };
        pool.record_branch(pick.branch, req.origin.metrics);
        tried.push(replica.id);
        // In `exact` mode the prompt counts as sent to this replica until
        // its answer is in (the end of this attempt).
        let _dispatched = req.route.dispatched_with(&mut guard);
        if let Some(a) = &req.route.adapter {
            guard.run_adapter(a);
        }
        let pairing = Pairing {
            prefill_host: replica.authority.host(),
            bootstrap_port: req.bootstrap_port,
            room: rand::random(),
        };
        let Ok(body) = req.protocol.prefill_body(&req.body.body, &pairing) else {
            // The body is the same for every replica: no use trying others.
            return Err(failed(&tried, "body"));
        };
        let (sent, span) = attempt(&req, &replica, tried.len(), &headers, body, deadline).await;
        drop(guard);
        let outcome = match judge(&req, &replica, sent, &pairing) {
            Ok(decode_body) => {
                count(req.disaggregation, pool, &replica, "ok");
                return Ok(Prefilled {
                    replica,
                    decode_body,
                    attempts: tried.len() as u32,
                    elapsed: start.elapsed(),
                });
            }
            Err(outcome) => outcome,
        };
        count(req.disaggregation, pool, &replica, outcome);
        if let Some(s) = &span {
            s.fail(outcome);
        }
        if outcome == "timeout" {
            return Err(failed(&tried, "timeout"));
        }
        tracing::info!(pool = %pool.name, replica = %replica.name, outcome, "prefill attempt failed");
    }
}

/// Sends attempt number `n` to `replica` before `deadline`, traced as an
/// upstream attempt of the `prefill` phase (the span is the caller's to
/// close).
async fn attempt(
    req: &PrefillRequest<'_>,
    replica: &Replica,
    n: usize,
    headers: &HeaderMap,
    body: Bytes,
    deadline: tokio::time::Instant,
) -> (Attempted, Option<StageSpan>) {
    let mut headers = headers.clone();
    let span = req
        .origin
        .trace
        .map(|t| t.attempt(&replica.name, n, &mut headers));
    if let Some(s) = &span {
        s.set("llmlb.phase", "prefill");
    }
    let to = send(
        req.pool,
        replica,
        req.method,
        req.path_and_query,
        headers,
        body,
    );
    (tokio::time::timeout_at(deadline, to).await, span)
}

/// The client's headers as every prefill attempt sends them: llmlb's
/// request id, a JSON body of its own length, the replica's `Host` set
/// per attempt.
fn prefill_headers(req: &PrefillRequest<'_>) -> HeaderMap {
    let mut headers = req.headers.clone();
    headers.remove(header::HOST);
    headers.remove(header::CONTENT_LENGTH);
    headers.insert(REQUEST_ID, req.origin.request_id.clone());
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers
}

/// What one attempt came to: the body the decode replica gets, or the
/// outcome label of a failure (`timeout` ends the step). A replica that
/// failed in a way outlier ejection counts is recorded so.
fn judge(
    req: &PrefillRequest<'_>,
    replica: &Arc<Replica>,
    sent: Attempted,
    pairing: &Pairing<'_>,
) -> Result<Outbound, &'static str> {
    let pool = req.pool;
    match sent {
        Err(_elapsed) => {
            pool.record_failure(replica, Failure::Timeout, req.origin.metrics);
            Err("timeout")
        }
        Ok(Err(Sent::Connect)) => {
            pool.record_failure(replica, Failure::Connect, req.origin.metrics);
            Err("connect")
        }
        Ok(Err(Sent::Reset)) => {
            pool.record_failure(replica, Failure::Reset, req.origin.metrics);
            Err("reset")
        }
        Ok(Ok((status, answer))) if status.is_success() => {
            pool.record_success(replica);
            decode_bodies(req.protocol, req.body, &answer, pairing).map_err(|_| "bad_answer")
        }
        Ok(Ok((status, _))) => {
            if status.is_server_error() && status != StatusCode::SERVICE_UNAVAILABLE {
                pool.record_failure(replica, Failure::ServerError, req.origin.metrics);
            }
            Err("status")
        }
    }
}

/// One attempt's answer (status and body), or how it failed: before an
/// answer, or at the deadline.
type Attempted = Result<Result<(StatusCode, Bytes), Sent>, tokio::time::error::Elapsed>;

/// How a prefill send failed before an answer.
enum Sent {
    /// The connection was never made: nothing reached the replica.
    Connect,
    /// The connection broke, or the answer could not be read.
    Reset,
}

async fn send(
    pool: &Pool,
    replica: &Replica,
    method: &Method,
    path_and_query: &str,
    headers: HeaderMap,
    body: Bytes,
) -> Result<(StatusCode, Bytes), Sent> {
    let path_and_query =
        http::uri::PathAndQuery::try_from(path_and_query).map_err(|_| Sent::Connect)?;
    let upstream = super::forward::build_request(method, replica, &path_and_query, headers, &body)
        .map_err(|_| Sent::Connect)?;
    let resp = pool
        .client
        .request(&replica.conns, upstream)
        .await
        .map_err(|e| {
            if e.is_connect() {
                Sent::Connect
            } else {
                Sent::Reset
            }
        })?;
    let status = resp.status();
    let body = Limited::new(resp.into_body(), MAX_ANSWER_BYTES)
        .collect()
        .await
        .map_err(|_| Sent::Reset)?
        .to_bytes();
    Ok((status, body))
}

/// Waits until one of `full` frees a slot; false at the deadline.
async fn wait_for_slot(full: &[Arc<Replica>], deadline: tokio::time::Instant) -> bool {
    let mut freed: Vec<_> = full.iter().map(|r| Box::pin(r.slot_freed())).collect();
    for f in &mut freed {
        f.as_mut().enable();
    }
    if full.iter().any(|r| r.has_free_slot()) {
        return true;
    }
    tokio::time::timeout_at(deadline, futures_util::future::select_all(freed))
        .await
        .is_ok()
}

fn count(metrics: &super::DisaggregationMetrics, pool: &Pool, replica: &Replica, outcome: &str) {
    metrics
        .prefill_attempts
        .with_label_values(&[&pool.name, &replica.name, outcome])
        .inc();
}

/// The decode request's bodies: the prefill's answer put into each of the
/// client's (the one asking a stream for its usage too).
fn decode_bodies(
    protocol: &dyn Protocol,
    sent: &Outbound,
    answer: &[u8],
    pairing: &Pairing<'_>,
) -> Result<Outbound, crate::kv_transfer::TransferError> {
    let body = protocol.decode_body(&sent.body, Some(answer), pairing)?;
    let with_usage = match &sent.with_usage {
        Some(b) => Some(protocol.decode_body(b, Some(answer), pairing)?),
        None => None,
    };
    Ok(Outbound { body, with_usage })
}

//! The client-facing request handler: route by path, read and inspect the
//! body, find the pool, forward. Errors become OpenAI-style JSON here.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderValue};
use http::{Request, Response};
use http_body_util::Either;
use hyper::body::Incoming;

use super::record::{Refusal, RouteFields, Unanswered};
use super::scope::{self, AnswerBody, Scope, ScopedBody};
use super::send::{self, Admitted, RequestCtx};
use super::{ApiError, AppState};
use super::{access_log, disaggregate, stages, surface};
use crate::admission::{Permit, Settlement};
use crate::balancing::RequestInfo;
use crate::forwarding::{Origin, ProxyBody, REQUEST_ID};
use crate::gateway::RateHeaders;
use crate::pool::Pool;
use crate::routing::Decision;
use crate::telemetry::trace::StageSpan;

/// Handles one request. Its record is made when hyper hands the request
/// over, before the future first runs: hyper may drop a future it never
/// polled when the connection closes at once, and the record still
/// finishes (as `client_closed`).
pub fn handle(
    state: Arc<AppState>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> impl Future<Output = Response<ScopedBody>> + Send {
    let start = Instant::now();
    let (request_id, made) = request_id(req.headers());
    let mut access =
        access_log::AccessStart::new(&req, peer, &request_id, start, state.traces.as_ref());
    access.id_plain = made;
    let unanswered = Unanswered::new(&state, access);
    handle_counted(state, peer, req, request_id, unanswered)
}

#[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice
fn handle_counted(
    state: Arc<AppState>,
    peer: SocketAddr,
    req: Request<Incoming>,
    request_id: HeaderValue,
    mut unanswered: Unanswered,
) -> impl Future<Output = Response<ScopedBody>> {
    // A function returning an `async` block, not an `async fn`: an
    // `async fn`'s future holds each argument taken by value twice (as
    // passed and as moved into its body), and this future is copied to the
    // heap on every request. The same for the steps below.
    async move {
        let origin = req.headers().get(header::ORIGIN).cloned();
        let mut rate = RateHeaders::default();
        let access = unanswered.start.as_ref().expect("not answered yet");
        let ctx = RequestCtx {
            state: &state,
            origin: Origin {
                request_id: &request_id,
                client_ip: peer.ip(),
                trace: access.trace(),
                metrics: &state.metrics,
                recent: &state.recent_dispatches,
            },
        };
        let notes = Notes {
            rate: &mut rate,
            fields: &mut unanswered.fields,
        };
        let routed = route(&ctx, req, notes).await;
        let (mut resp, scope, refusal) = match routed {
            Ok((resp, scope)) => (resp, scope, None),
            Err(err) => {
                tracing::debug!(
                    request_id = request_id.to_str().unwrap_or(""),
                    code = err.code(),
                    error = %err.log_message(),
                    "request refused"
                );
                let refusal = Refusal::of(&err);
                (
                    err.into_response().map(Either::Right),
                    Scope::default(),
                    Some(refusal),
                )
            }
        };
        let (access, fields) = unanswered.answered();
        super::limit_headers::apply(&rate, resp.headers_mut());
        // A replica's answer has it already (`forwarding::stream_back`).
        if !matches!(resp.body(), Either::Left(_)) {
            resp.headers_mut().entry(REQUEST_ID).or_insert(request_id);
        }
        surface::apply_cors(&state, origin.as_ref(), resp.headers_mut());
        scope::respond(&state, access, fields, refusal, scope, resp)
    }
}

/// What the request path writes down for the answer and the record as it
/// goes, whether it ends in an answer or an error.
struct Notes<'a> {
    rate: &'a mut RateHeaders,
    fields: &'a mut RouteFields,
}

/// The request path, one step after another (each in [`super::stages`] or
/// [`super::send`]); the rate-limit charge refunds itself on any early
/// return. What the request holds until its answer ends comes back as its
/// [`Scope`].
#[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice
fn route(
    ctx: &RequestCtx<'_>,
    req: Request<Incoming>,
    notes: Notes<'_>,
) -> impl Future<Output = Result<(Response<AnswerBody>, Scope), ApiError>> {
    // Not an `async fn`: its arguments are kept once (see `handle_counted`).
    async move {
        let state = ctx.state;
        if let Some(answer) = stages::answer_locally(state, &req).await {
            return answer.map(|resp| (resp.map(Either::Right), Scope::default()));
        }
        // One generation for the whole request: its gateway, config and
        // topology always belong together, whatever reloads meanwhile.
        let generation = state.generation();
        let (config, topology) = (&generation.config, &generation.topology);
        // Authenticate, and shed what cannot be served, before reading the body.
        let caller = generation.gateway.authenticate(req.headers())?;
        let tier = topology.tier(caller.tier.as_deref());
        notes.fields.tier = topology.tier_shared(caller.tier.as_ref());
        // The tenant orders a pool's queue; without one neither its header
        // nor the body's `user` is read.
        let queues = topology.has_queue();
        let tenant = match queues {
            true => generation.gateway.tenant_of(&caller, req.headers(), None),
            false => generation.gateway.no_tenant(),
        };
        let early_pending = stages::shed_before_body(state, topology, tier, &caller, &tenant)?;
        let (parts, body) = req.into_parts();
        let (bytes, _held) = stages::read_within_budget(state, &config.server, body).await?;
        let meta = surface::extract_meta(&parts.headers, &bytes)?.for_endpoint(parts.uri.path());
        notes.fields.model = Some(meta.model.clone());
        notes.fields.stream = Some(meta.stream);
        let first = stages::resolve_pool(topology, &meta.model, tier).await?;
        notes.fields.pool = Some(Arc::clone(&first.pool.shared_name));
        notes.fields.pool_plain = first.pool.name_plain;
        let pending = stages::enter_pending(state, first.pool, early_pending)?;
        let mut estimate = stages::Estimate::of(first.pool, &meta).await;
        let charge = stages::charge(state, &caller, estimate.total, notes.rate).await?;
        let tenant = match &*tenant {
            "" if queues => (generation.gateway).tenant_of_user(&caller, meta.user.as_deref()),
            _ => tenant,
        };
        let queued = first.pool.admission.is_some().then(Instant::now);
        let trace = ctx.origin.trace;
        let mut permit =
            stages::admit(&first, &caller, tenant, &mut estimate, &meta, trace).await?;
        notes.fields.queued = queued.filter(|_| permit.is_some()).map(|t| t.elapsed());
        let current = state.topology();
        let resolved = stages::after_queue(&current, first, permit.is_some());
        let info = RequestInfo {
            model: resolved.rewrite.unwrap_or(&meta.model),
            prompt_tokens: estimate.prompt_tokens,
            max_tokens: estimate.max_tokens,
            user: meta.user.as_deref(),
        };
        let admitted = Admitted {
            topology: &current,
            resolved,
            meta: &meta,
            parts,
            bytes: &bytes,
            tier,
            level: caller.level,
            strip_key: config.gateway.auth || caller.key.is_some(),
            expose_replica: config.server.replica_header,
            info,
        };
        let resp = dispatch(ctx, admitted, &mut estimate, permit.as_mut(), notes.fields).await?;
        charge.commit();
        let settlement = Settlement {
            caller,
            estimated: estimate.total,
            metrics: Arc::clone(&state.admission_metrics),
        };
        Ok((
            resp.map(Either::Left),
            Scope::routed(pending, permit, settlement),
        ))
    }
}

/// Routes an admitted request within its pool, runs a disaggregated
/// pool's prefill step and forwards it, noting the route in `fields`.
#[allow(clippy::manual_async_fn)] // an `async fn` would hold its arguments twice
fn dispatch(
    ctx: &RequestCtx<'_>,
    a: Admitted<'_>,
    estimate: &mut stages::Estimate,
    permit: Option<&mut Permit>,
    fields: &mut RouteFields,
) -> impl Future<Output = Result<Response<Box<ProxyBody>>, ApiError>> {
    // Not an `async fn`: its arguments are kept once (see `handle_counted`).
    async move {
        let pool = a.resolved.pool;
        let tokens = estimate.tokens_for(pool, a.meta).await;
        let routing = ctx.origin.trace.map(|t| t.stage("llmlb.route"));
        let (decision, body) = send::route_within(ctx.state, &a, tokens)?;
        note_decision(fields, pool, &decision, routing);
        // A disaggregated pool's step is a future of kilobytes: on the heap,
        // and only for such a pool, so that the others' stays small.
        let (split, body) = match pool.disaggregation {
            Some(_) => {
                Box::pin(disaggregate::prefill_step(ctx, &a, &decision, tokens, body)).await?
            }
            None => (None, body),
        };
        if let Some(s) = &split {
            note_split(fields, s);
        }
        // A split request's decode hop is timed from here.
        let decoding = split.map(|s| (s, Instant::now()));
        // On the heap: the send's future is kilobytes, and held inline it
        // would grow every future above it (this one, `route`'s and the
        // request's own, which hyper's service boxes), each moved by value
        // on every request (0.55 k instructions a request saved).
        let sending = send::send(ctx, a, &decision, body, permit, &mut fields.progress);
        let resp = Box::pin(sending).await?;
        if let Some((s, sent)) = decoding {
            s.decoded(ctx, pool, sent);
        }
        Ok(resp)
    }
}

/// The routing decision within `pool`, in the request's record and on its
/// `llmlb.route` span.
fn note_decision(
    fields: &mut RouteFields,
    pool: &Pool,
    decision: &Decision,
    span: Option<StageSpan>,
) {
    if fields.pool.as_deref() != Some(pool.name.as_str()) {
        fields.pool = Some(Arc::clone(&pool.shared_name));
        fields.pool_plain = pool.name_plain;
    }
    fields.route = Some(decision.route_label()).filter(|l| !l.is_empty());
    fields.version = decision.version.clone();
    if let Some(span) = span {
        span.set("llmlb.pool", pool.name.clone());
        if let Some(label) = &fields.route {
            span.set("llmlb.route", label.clone());
        }
    }
}

/// A disaggregated request's split, appended to the record's `route`: it
/// names the prefill replica; `replica` stays the decode replica that
/// answered.
fn note_split(fields: &mut RouteFields, split: &disaggregate::Split) {
    let label = match &split.prefilled {
        Some(p) => format!("split_{}@{}", split.branch.as_str(), p.replica.name),
        None => format!("split_{}", split.branch.as_str()),
    };
    fields.route = Some(match fields.route.take() {
        Some(route) => format!("{route}+{label}"),
        None => label,
    });
}

/// The client's `x-request-id` when it is sane, else a fresh version-4
/// UUID drawn from the thread's RNG (no system call per request) and
/// formatted on the stack; `true` when llmlb made it.
fn request_id(headers: &http::HeaderMap) -> (HeaderValue, bool) {
    if let Some(sent) = headers
        .get(REQUEST_ID)
        .filter(|v| !v.is_empty() && v.len() <= 200)
    {
        return (sent.clone(), false);
    }
    let bits: u128 = super::random::random();
    let id = uuid::Builder::from_random_bytes(bits.to_le_bytes()).into_uuid();
    let mut buf = uuid::Uuid::encode_buffer();
    let made = HeaderValue::from_str(id.hyphenated().encode_lower(&mut buf));
    (made.expect("uuid is a valid header"), true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_fresh_version_4_uuids_unless_the_client_sent_one() {
        let empty = http::HeaderMap::new();
        let (a, made) = request_id(&empty);
        assert!(made);
        let (b, _) = request_id(&empty);
        assert_ne!(a, b);
        let parsed = uuid::Uuid::parse_str(a.to_str().unwrap()).unwrap();
        assert_eq!(parsed.get_version_num(), 4);
        let mut sent = http::HeaderMap::new();
        sent.insert(REQUEST_ID, HeaderValue::from_static("abc-1"));
        assert_eq!(
            request_id(&sent),
            (HeaderValue::from_static("abc-1"), false)
        );
    }
}

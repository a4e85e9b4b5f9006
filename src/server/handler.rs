//! The client-facing request handler: route by path, read and inspect the
//! body, find the pool, forward. Errors become OpenAI-style JSON here.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderValue};
use http::{Request, Response};
use hyper::body::Incoming;

use super::closed::ClientClosed;
use super::prompt_tokens::prompt;
use super::request::RequestMeta;
use super::scope::{self, Scope};
use super::{ApiError, AppState};
use super::{access_log, stages, surface};
use crate::admission::Settlement;
use crate::balancing::RequestInfo;
use crate::forwarding::{ForwardRequest, REQUEST_ID, forward, strip_hop_by_hop, strip_private};
use crate::gateway::RateHeaders;
use crate::net::ResponseBody;
use crate::routing::model_map::rewrite_model;
use crate::routing::{Decision, Pool, Resolution, RouteInput, VersionRecord};
use crate::telemetry::clock::now_millis;
use crate::telemetry::trace::RequestTrace;

/// Handles one request. The client-closed record is made when hyper hands
/// the request over, before the future first runs: hyper may drop a future
/// it never polled when the connection closes at once.
pub fn handle(
    state: Arc<AppState>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> impl Future<Output = Response<ResponseBody>> + Send {
    let closed = ClientClosed::new(&state.metrics);
    handle_counted(state, peer, req, closed)
}

async fn handle_counted(
    state: Arc<AppState>,
    peer: SocketAddr,
    req: Request<Incoming>,
    mut closed: ClientClosed,
) -> Response<ResponseBody> {
    let start = Instant::now();
    let request_id = request_id(req.headers());
    let origin = req.headers().get(header::ORIGIN).cloned();
    let access =
        access_log::AccessStart::new(&req, peer, &request_id, start, state.traces.as_ref());
    let mut fields = access_log::RouteFields::default();
    let mut rate = RateHeaders::default();
    let routed = route(
        &state,
        peer,
        req,
        &request_id,
        start,
        &mut rate,
        &mut fields,
        &mut closed.pool,
        access.trace(),
    )
    .await;
    closed.disarm();
    let (mut resp, scope) = match routed {
        Ok(routed) => routed,
        Err(err) => {
            state
                .metrics
                .rejections
                .with_label_values(&[err.reason()])
                .inc();
            tracing::info!(code = err.code(), error = %err.log_message(), request_id = ?request_id, "request rejected");
            (err.into_response(), Scope::default())
        }
    };
    super::limit_headers::apply(&rate, resp.headers_mut());
    resp.headers_mut().entry(REQUEST_ID).or_insert(request_id);
    surface::apply_cors(&state, origin.as_ref(), &mut resp);
    scope::respond(&state, access, fields, scope, resp)
}

/// The request path, one step after another (each in [`super::stages`]);
/// the rate-limit charge refunds itself on any early return. What the
/// request holds until its answer ends comes back as its [`Scope`].
#[allow(clippy::too_many_arguments)]
async fn route(
    state: &AppState,
    peer: SocketAddr,
    req: Request<Incoming>,
    request_id: &HeaderValue,
    start: Instant,
    rate: &mut RateHeaders,
    fields: &mut access_log::RouteFields,
    pool_label: &mut Option<String>,
    trace: Option<&RequestTrace>,
) -> Result<(Response<ResponseBody>, Scope), ApiError> {
    if let Some(answer) = stages::answer_locally(state, &req).await {
        return answer.map(|resp| (resp, Scope::default()));
    }
    // One generation for the whole request: its gateway, config and
    // topology always belong together, whatever reloads meanwhile.
    let generation = state.generation();
    let (config, topology) = (&generation.config, &generation.topology);
    // Authenticate, and shed what cannot be served, before reading the body.
    let caller = generation.gateway.authenticate(req.headers())?;
    let tier = topology.tier(caller.tier.as_deref());
    let early_pending = stages::shed_before_body(state, topology, tier, &caller)?;
    let (parts, body) = req.into_parts();
    let (bytes, _held) =
        stages::read_within_budget(state, &config.server, &parts.headers, body).await?;
    let meta = surface::extract_meta(&parts.headers, &bytes)?;
    fields.model = Some(meta.model.clone());
    fields.stream = Some(meta.stream);
    let first = stages::resolve_pool(topology, &meta.model, tier).await?;
    *pool_label = Some(first.pool.name.clone());
    let pending = stages::enter_pending(state, first.pool, early_pending)?;
    let mut estimate = stages::Estimate::of(first.pool, &meta).await;
    let charge = stages::charge(state, &caller, estimate.total, rate).await?;
    let mut permit = stages::admit(first.pool, &caller, estimate.prompt_tokens, trace).await?;
    let current = state.topology();
    let resolved = stages::after_queue(&current, first, permit.is_some());
    let pool = resolved.pool;
    let tokens = estimate.tokens_for(pool, &meta).await;
    fields.pool = Some(pool.name.clone());
    let routing = trace.map(|t| t.stage("llmlb.route"));
    let (decision, body) = route_within(
        state,
        &resolved,
        &meta,
        tokens,
        &parts.headers,
        tier,
        &bytes,
    )?;
    fields.route = Some(decision.route_label()).filter(|l| !l.is_empty());
    if let Some(span) = routing {
        span.set("llmlb.pool", pool.name.clone());
        if let Some(label) = &fields.route {
            span.set("llmlb.route", label.clone());
        }
    }
    // The client's key is llmlb's business, not the replica's.
    let strip_key = config.gateway.auth || caller.key.is_some();
    let headers = upstream_headers(parts.headers, strip_key, pool);
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or("/");
    let forwarded = forward(ForwardRequest {
        pool,
        method: parts.method.clone(),
        path_and_query,
        headers,
        body,
        info: RequestInfo {
            model: resolved.rewrite.unwrap_or(&meta.model),
            prompt_tokens: estimate.prompt_tokens,
            max_tokens: estimate.max_tokens,
            user: meta.user.as_deref(),
        },
        route: &decision,
        request_id,
        client_ip: Some(peer.ip()),
        start,
        metrics: &state.metrics,
        expose_replica: config.server.replica_header,
        recent: &state.recent_dispatches,
        trace,
    })
    .await;
    let resp = match forwarded {
        Ok(resp) => resp,
        Err(err) => {
            let err = ApiError::from(err);
            if let Some(v) = &decision.version {
                state
                    .routing_metrics
                    .record_version(&pool.name, v, err.status().as_u16(), start);
            }
            return Err(err);
        }
    };
    // A replica answered: the time this request holds its queue slot
    // teaches the queue its drain rate (failures and refusals do not).
    if let Some(p) = permit.as_mut().filter(|_| resp.status().is_success()) {
        p.served();
    }
    let (resp, version) = match &decision.version {
        Some(v) => tag_version(resp, state, &pool.name, v, start),
        None => (resp, None),
    };
    charge.commit();
    let settlement = Settlement {
        caller,
        estimated: estimate.total,
        metrics: state.admission_metrics.clone(),
    };
    Ok((resp, Scope::routed(version, pending, permit, settlement)))
}

/// The client's headers as the replica gets them: hop-by-hop headers and
/// llmlb's own removed, the client's key removed when llmlb checked it, the
/// pool's own key set.
fn upstream_headers(mut headers: http::HeaderMap, strip_key: bool, pool: &Pool) -> http::HeaderMap {
    strip_hop_by_hop(&mut headers);
    strip_private(&mut headers, strip_key, pool.upstream_auth.as_ref());
    headers
}

/// The routing stage within the chosen pool: the request's decision, and
/// the body to send (with the served model name when an alias was used).
fn route_within(
    state: &AppState,
    resolved: &Resolution<'_>,
    meta: &RequestMeta,
    tokens: Option<&[u32]>,
    headers: &http::HeaderMap,
    tier: Option<&str>,
    bytes: &bytes::Bytes,
) -> Result<(Decision, bytes::Bytes), ApiError> {
    let pool = resolved.pool;
    let body = match resolved.rewrite {
        Some(model) => rewrite_model(bytes, model)?,
        None => bytes.clone(),
    };
    let input = RouteInput {
        model: resolved.rewrite.unwrap_or(&meta.model),
        user: meta.user.as_deref(),
        api_key: crate::gateway::keys::presented_key(headers),
        headers,
        tier,
        prompt: prompt(meta),
        tokens,
    };
    let decision = pool
        .router
        .route(&pool.replicas, &input, rand::random(), now_millis())?;
    state
        .routing_metrics
        .record_branches(&pool.name, &resolved.branches);
    state
        .routing_metrics
        .record_branches(&pool.name, &decision.branches);
    Ok((decision, body))
}

/// Tags the response with its canary version; the record it returns notes
/// the version's outcome when the answer ends.
fn tag_version(
    mut resp: Response<ResponseBody>,
    state: &AppState,
    pool: &str,
    version: &Arc<str>,
    start: Instant,
) -> (Response<ResponseBody>, Option<VersionRecord>) {
    let record = VersionRecord {
        metrics: state.routing_metrics.clone(),
        pool: pool.to_string(),
        version: Arc::clone(version),
        status: resp.status().as_u16(),
        start,
        broken: resp
            .extensions()
            .get::<crate::routing::StreamBroken>()
            .cloned(),
    };
    if let Ok(v) = HeaderValue::from_str(version) {
        resp.headers_mut().insert("x-llmlb-version", v);
    }
    (resp, Some(record))
}

/// The client's `x-request-id` when it is sane, else a fresh version-4
/// UUID drawn from the thread's RNG (no system call per request) and
/// formatted on the stack.
fn request_id(headers: &http::HeaderMap) -> HeaderValue {
    headers
        .get(REQUEST_ID)
        .filter(|v| !v.is_empty() && v.len() <= 200)
        .cloned()
        .unwrap_or_else(|| {
            let id = uuid::Builder::from_random_bytes(rand::random()).into_uuid();
            let mut buf = uuid::Uuid::encode_buffer();
            HeaderValue::from_str(id.hyphenated().encode_lower(&mut buf))
                .expect("uuid is a valid header")
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_fresh_version_4_uuids_unless_the_client_sent_one() {
        let empty = http::HeaderMap::new();
        let a = request_id(&empty);
        let b = request_id(&empty);
        assert_ne!(a, b);
        let parsed = uuid::Uuid::parse_str(a.to_str().unwrap()).unwrap();
        assert_eq!(parsed.get_version_num(), 4);
        let mut sent = http::HeaderMap::new();
        sent.insert(REQUEST_ID, HeaderValue::from_static("abc-1"));
        assert_eq!(request_id(&sent), "abc-1");
    }
}

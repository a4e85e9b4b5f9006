//! The client-facing request handler: route by path, read and inspect the
//! body, find the pool, forward. Errors become OpenAI-style JSON here.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response};
use hyper::body::Incoming;

use http_body_util::BodyExt;

use super::closed::ClientClosed;
use super::prompt_tokens::{PromptTokens, prompt};
use super::request::{RequestMeta, content_length};
use super::{ApiError, AppState};
use super::{access_log, surface};
use crate::admission::{AdmittedBody, Settlement};
use crate::balancing::RequestInfo;
use crate::forwarding::{ForwardRequest, REQUEST_ID, forward, strip_hop_by_hop, strip_private};
use crate::gateway::{Charge, RateHeaders};
use crate::net::{ResponseBody, read_body};
use crate::routing::model_map::rewrite_model;
use crate::routing::{Decision, Resolution, RouteInput, VersionRecord};
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
    let mut resp = match routed {
        Ok(resp) => resp,
        Err(err) => {
            state
                .metrics
                .rejections
                .with_label_values(&[err.reason()])
                .inc();
            tracing::info!(code = err.code(), error = %err.log_message(), request_id = ?request_id, "request rejected");
            err.into_response()
        }
    };
    super::limit_headers::apply(&rate, resp.headers_mut());
    resp.headers_mut().entry(REQUEST_ID).or_insert(request_id);
    surface::apply_cors(&state, origin.as_ref(), &mut resp);
    access_log::wrap(&state, access, fields, resp)
}

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
) -> Result<Response<ResponseBody>, ApiError> {
    if req.uri().path().starts_with("/v1/models/")
        && matches!(*req.method(), Method::GET | Method::HEAD)
    {
        // Same auth as the model list; the id may name a model only the
        // replicas report.
        state.gateway.load().authenticate(req.headers())?;
        state.topology.load_full().refresh_reported().await;
    }
    if let Some(answer) = surface::local_answer(state, &req) {
        return answer;
    }
    let path = req.uri().path();
    if path == "/v1/models" {
        // The model list follows the same auth as inference.
        state.gateway.load().authenticate(req.headers())?;
        return match *req.method() {
            Method::GET => Ok(models(state).await),
            ref m => Err(ApiError::MethodNotAllowed(m.to_string())),
        };
    }
    if !surface::is_model_routed(path) {
        return Err(ApiError::RouteNotFound {
            method: req.method().to_string(),
            path: path.to_string(),
        });
    }
    if req.method() != Method::POST {
        return Err(ApiError::MethodNotAllowed(req.method().to_string()));
    }
    if state.closing.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(ApiError::ShuttingDown);
    }
    // Authenticate before reading the body.
    let caller = state.gateway.load().authenticate(req.headers())?;
    let config = state.config.load();
    let topology = state.topology.load();
    let tier = topology.tier(caller.tier.as_deref());
    // Shed load before reading the body when the pool is already known.
    let mut early_pending = None;
    if let Some(pool) = topology.pool_before_body(tier) {
        if let Some(gate) = state.pending.get(&pool.name) {
            let guard = gate.try_enter().map_err(|limit| ApiError::PoolOverloaded {
                pool: pool.name.clone(),
                limit,
            })?;
            early_pending = Some((pool.name.clone(), guard));
        }
        if let Some(admission) = &pool.admission {
            admission.check(caller.level)?;
        }
    }
    let (parts, body) = req.into_parts();
    let server = &config.server;
    let mut held = state.body_budget.empty();
    let declared = content_length(&parts.headers).map_or(0, |n| n.min(server.max_body_bytes));
    if !held.grow(declared, server.max_buffered_bytes) {
        return Err(ApiError::ServerBusy);
    }
    let read = read_body(&parts.headers, body, server.max_body_bytes);
    let bytes = tokio::time::timeout(server.body_timeout, read)
        .await
        .map_err(|_| {
            ApiError::BodyTimeout(crate::config::format_duration(server.body_timeout))
        })??;
    // A body without a declared length is counted once it is in.
    if bytes.len() > held.bytes()
        && !held.grow(bytes.len() - held.bytes(), server.max_buffered_bytes)
    {
        return Err(ApiError::ServerBusy);
    }
    let meta = surface::extract_meta(&parts.headers, &bytes)?;
    fields.model = Some(meta.model.clone());
    fields.stream = Some(meta.stream);
    // The pool is resolved once: the queue that admits the request is the
    // queue of the pool that serves it.
    let first = match topology.resolve(&meta.model, tier) {
        Some(first) if !first.by_default() || !topology.has_reported() => first,
        by_default => {
            // Not named in the config: maybe a name a pool's replicas
            // report, which goes before the default pool.
            topology.refresh_reported().await;
            topology
                .resolve_reported(&meta.model, tier)
                .or(by_default)
                .ok_or_else(|| ApiError::ModelNotFound(meta.model.clone()))?
        }
    };
    let pool = first.pool;
    let admitted_pool = pool.name.clone();
    *pool_label = Some(admitted_pool.clone());
    let pending = match (early_pending, state.pending.get(&pool.name)) {
        (Some((name, guard)), _) if name == pool.name => Some(guard),
        (_, Some(gate)) => Some(gate.try_enter().map_err(|limit| ApiError::PoolOverloaded {
            pool: pool.name.clone(),
            limit,
        })?),
        (_, None) => None,
    };

    // With a model tokenizer, the real prompt token count feeds rate limits,
    // routing and balancing; else the cheap estimate.
    let mut counted = PromptTokens::count(pool, &meta).await;
    let count_of = |c: &Option<PromptTokens>| {
        c.as_ref()
            .map_or(meta.estimated_prompt_tokens(), PromptTokens::count_u32)
    };
    // The output allowance the replica can actually grant: an absurd
    // `max_tokens` is charged and balanced as the context left.
    let prompt_tokens = count_of(&counted);
    let room = pool
        .balancing
        .max_model_len
        .saturating_sub(prompt_tokens)
        .max(1);
    let max_tokens = meta.max_tokens.map(|m| m.min(room));
    let estimated = u64::from(prompt_tokens)
        + u64::from(max_tokens.unwrap_or(pool.balancing.default_max_tokens.min(room)));
    match caller.charge(estimated, Instant::now()).await {
        Ok(headers) => *rate = headers,
        Err(limited) => {
            *rate = limited.headers.clone();
            return Err(limited.into());
        }
    }
    // Refunded on every early return, and when the client goes away.
    let charge = Charge::new(&caller, estimated);
    if let Some(tenant) = &caller.tenant {
        state
            .admission_metrics
            .tenant_requests
            .with_label_values(&[tenant])
            .inc();
    }
    let permit = match &pool.admission {
        Some(admission) => {
            let _queued = trace.map(|t| t.stage("llmlb.queue"));
            Some(admission.acquire(caller.level).await?)
        }
        None => None,
    };
    // A reload may have happened while the request waited: the same pool,
    // with the replicas in force now (the old one if the pool is gone).
    let current = state.topology.load();
    let reloaded = permit
        .as_ref()
        .and_then(|_| current.pools.iter().find(|p| p.name == admitted_pool));
    let resolved = Resolution {
        pool: reloaded.unwrap_or(first.pool),
        rewrite: first.rewrite,
        branches: first.branches,
    };
    let pool = resolved.pool;
    if counted.as_ref().is_some_and(|c| c.for_pool(pool).is_none())
        || (counted.is_none() && !pool.router.tokenizer().is_stand_in())
    {
        // The request ended up in a pool with another tokenizer.
        counted = PromptTokens::count(pool, &meta).await;
    }
    let tokens = counted.as_ref().and_then(|c| c.for_pool(pool));
    fields.pool = Some(pool.name.clone());
    let routing = trace.map(|t| t.stage("llmlb.route"));
    let routed = route_within(
        state,
        &resolved,
        &meta,
        tokens,
        &parts.headers,
        tier,
        &bytes,
    );
    let (decision, body) = routed?;
    fields.route = Some(decision.route_label()).filter(|l| !l.is_empty());
    if let Some(span) = routing {
        span.set("llmlb.pool", pool.name.clone());
        let label = decision.route_label();
        if !label.is_empty() {
            span.set("llmlb.route", label.to_string());
        }
    }

    let mut headers = parts.headers;
    strip_hop_by_hop(&mut headers);
    // The client's key is llmlb's business, not the replica's.
    let strip_key = config.gateway.auth || caller.key.is_some();
    strip_private(&mut headers, strip_key, pool.upstream_auth.as_ref());
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
            prompt_tokens,
            max_tokens,
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
    let resp = match &decision.version {
        Some(v) => with_version(resp, state, &pool.name, v, start),
        None => resp,
    };
    let resp = match pending {
        Some(guard) => resp.map(|body| crate::net::Guarded::wrap(body, guard)),
        None => resp,
    };
    charge.commit();
    if permit.is_none() && caller.key.is_none() {
        return Ok(resp);
    }
    let settlement = Settlement {
        caller,
        estimated,
        metrics: state.admission_metrics.clone(),
    };
    Ok(AdmittedBody::respond(resp, permit, Some(settlement)))
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

/// Tags the response with its canary version and records the version's
/// outcome when the body ends or is dropped.
fn with_version(
    resp: Response<ResponseBody>,
    state: &AppState,
    pool: &str,
    version: &Arc<str>,
    start: Instant,
) -> Response<ResponseBody> {
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
    let (mut parts, body) = resp.into_parts();
    if let Ok(v) = HeaderValue::from_str(version) {
        parts.headers.insert("x-llmlb-version", v);
    }
    let body = body
        .map_frame(move |frame| {
            let _record = &record;
            frame
        })
        .boxed_unsync();
    Response::from_parts(parts, body)
}

/// `GET /v1/models`: the config's models and aliases, then the names the
/// replicas of `models_from_replicas` pools report.
async fn models(state: &AppState) -> Response<ResponseBody> {
    let topology = state.topology.load_full();
    topology.refresh_reported().await;
    let reported = topology.reported_models();
    let data: Vec<serde_json::Value> = topology
        .models()
        .chain(topology.aliases())
        .chain(reported.iter().map(|(m, p)| (m.as_str(), *p)))
        .map(|(model, pool)| surface::model_object(model, &pool.name))
        .collect();
    surface::json(&serde_json::json!({"object": "list", "data": data}))
}

/// The client's `x-request-id` when it is sane, else a fresh UUID.
fn request_id(headers: &http::HeaderMap) -> HeaderValue {
    headers
        .get(REQUEST_ID)
        .filter(|v| !v.is_empty() && v.len() <= 200)
        .cloned()
        .unwrap_or_else(|| {
            HeaderValue::from_str(&uuid::Uuid::new_v4().to_string())
                .expect("uuid is a valid header")
        })
}

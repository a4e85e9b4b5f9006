//! The client-facing request handler: route by path, read and inspect the
//! body, find the pool, forward. Errors become OpenAI-style JSON here.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response};
use hyper::body::Incoming;

use http_body_util::BodyExt;

use super::request::{extract, read_body};
use super::{ApiError, AppState};
use crate::admission::{AdmittedBody, Settlement};
use crate::balancing::RequestInfo;
use crate::forwarding::{
    ForwardRequest, REQUEST_ID, ResponseBody, forward, full_body, strip_hop_by_hop,
};
use crate::gateway::{DEFAULT_OUTPUT_TOKENS, RateHeaders};

/// Inference endpoints llmlb routes by `model`.
const INFERENCE_PATHS: &[&str] = &["/v1/chat/completions", "/v1/completions", "/v1/embeddings"];

pub async fn handle(
    state: Arc<AppState>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Response<ResponseBody> {
    let start = Instant::now();
    let request_id = request_id(req.headers());
    let mut rate = RateHeaders::default();
    let mut resp = match route(&state, peer, req, &request_id, start, &mut rate).await {
        Ok(resp) => resp,
        Err(err) => {
            state
                .metrics
                .rejections
                .with_label_values(&[err.reason()])
                .inc();
            tracing::info!(code = err.code(), error = %err, request_id = ?request_id, "request rejected");
            err.into_response()
        }
    };
    rate.apply(resp.headers_mut());
    resp.headers_mut().entry(REQUEST_ID).or_insert(request_id);
    resp
}

async fn route(
    state: &AppState,
    peer: SocketAddr,
    req: Request<Incoming>,
    request_id: &HeaderValue,
    start: Instant,
    rate: &mut RateHeaders,
) -> Result<Response<ResponseBody>, ApiError> {
    let path = req.uri().path();
    if path == "/v1/models" {
        return match *req.method() {
            Method::GET => Ok(models(state)),
            ref m => Err(ApiError::MethodNotAllowed(m.to_string())),
        };
    }
    if !INFERENCE_PATHS.contains(&path) {
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
    let (parts, body) = req.into_parts();
    let bytes = read_body(&parts.headers, body, config.server.max_body_bytes).await?;
    let meta = extract(&bytes)?;
    let topology = state.topology.load();
    let pool = topology
        .pool_for(&meta.model)
        .ok_or_else(|| ApiError::ModelNotFound(meta.model.clone()))?;
    let pending = match state.pending.get(&pool.name) {
        Some(gate) => Some(gate.try_enter().map_err(|limit| ApiError::PoolOverloaded {
            pool: pool.name.clone(),
            limit,
        })?),
        None => None,
    };

    let estimated = u64::from(meta.estimated_prompt_tokens())
        + u64::from(meta.max_tokens.unwrap_or(DEFAULT_OUTPUT_TOKENS));
    match caller.charge(estimated, Instant::now()).await {
        Ok(headers) => *rate = headers,
        Err((err, headers)) => {
            *rate = headers;
            return Err(err);
        }
    }
    if let Some(tenant) = &caller.tenant {
        state
            .admission_metrics
            .tenant_requests
            .with_label_values(&[tenant])
            .inc();
    }
    let permit = match &pool.admission {
        Some(admission) => match admission.acquire(caller.level).await {
            Ok(permit) => Some(permit),
            Err(err) => {
                caller.refund(estimated, Instant::now());
                return Err(err);
            }
        },
        None => None,
    };
    // A reload may have happened while the request waited: place it with the
    // replicas in force now.
    let topology = if permit.is_some() {
        state.topology.load()
    } else {
        topology
    };
    let Some(pool) = topology.pool_for(&meta.model) else {
        caller.refund(estimated, Instant::now());
        return Err(ApiError::ModelNotFound(meta.model.clone()));
    };

    let mut headers = parts.headers;
    strip_hop_by_hop(&mut headers);
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
        body: bytes.clone(),
        info: RequestInfo {
            model: &meta.model,
            prompt_tokens: meta.estimated_prompt_tokens(),
            max_tokens: meta.max_tokens,
            user: meta.user.as_deref(),
        },
        request_id,
        client_ip: Some(peer.ip()),
        start,
        metrics: &state.metrics,
        expose_replica: config.server.replica_header,
    })
    .await;
    let resp = match forwarded {
        Ok(resp) => resp,
        Err(err) => {
            caller.refund(estimated, Instant::now());
            return Err(err);
        }
    };
    let resp = match pending {
        Some(guard) => resp.map(|body| super::guarded::Guarded::wrap(body, guard)),
        None => resp,
    };
    if permit.is_none() && caller.key.is_none() {
        return Ok(resp);
    }
    let settlement = Settlement {
        caller,
        estimated,
        metrics: state.admission_metrics.clone(),
    };
    Ok(resp.map(|body| AdmittedBody::new(body, permit, Some(settlement)).boxed_unsync()))
}

/// `GET /v1/models`, answered from the config.
fn models(state: &AppState) -> Response<ResponseBody> {
    let topology = state.topology.load();
    let data: Vec<serde_json::Value> = topology
        .models()
        .map(|(model, pool)| {
            serde_json::json!({"id": model, "object": "model", "created": 0, "owned_by": pool.name})
        })
        .collect();
    let body = serde_json::json!({"object": "list", "data": data});
    let mut resp = Response::new(full_body(body.to_string()));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
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

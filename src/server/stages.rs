//! The steps of [`super::handler`]'s request path, one function each, in
//! the order the handler calls them: answers llmlb gives itself, load shed
//! before the body, the body read under its deadline and budget, the pool,
//! what the request is charged and balanced as, and the queue.
//!
//! Each step returns what the next one needs or the error the client gets;
//! none of them writes the response.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{Method, Request, Response};
use hyper::body::Incoming;

use super::budget::Reservation;
use super::pending::PendingGuard;
use super::prompt_tokens::{PromptTokens, prompt};
use super::request::RequestMeta;
use super::{ApiError, AppState, surface};
use crate::admission::estimate::Placement;
use crate::admission::{Affinity, Claim, Permit};
use crate::config::ServerConfig;
use crate::gateway::{Caller, Charge, RateHeaders};
use crate::net::{ResponseBody, read_body};
use crate::pool::{Pool, Resolution, Topology, placement_ttft};
use crate::routing::prefix::blocks::prompt_ids;
use crate::telemetry::clock::now_millis;
use crate::telemetry::trace::RequestTrace;

/// Requests llmlb answers itself (health, CORS preflights, the model list,
/// unknown paths and methods), or `None` for an inference request to route.
pub async fn answer_locally(
    state: &AppState,
    req: &Request<Incoming>,
) -> Option<Result<Response<ResponseBody>, ApiError>> {
    if req.uri().path().starts_with("/v1/models/")
        && matches!(*req.method(), Method::GET | Method::HEAD)
    {
        // Same auth as the model list; the id may name a model only the
        // replicas report.
        let generation = state.generation();
        if let Err(e) = generation.gateway.authenticate(req.headers()) {
            return Some(Err(e.into()));
        }
        generation.topology.refresh_reported().await;
    }
    if let Some(answer) = surface::local_answer(state, req) {
        return Some(answer);
    }
    let path = req.uri().path();
    if path == "/v1/models" {
        // The model list follows the same auth as inference.
        if let Err(e) = state.generation().gateway.authenticate(req.headers()) {
            return Some(Err(e.into()));
        }
        return Some(match *req.method() {
            Method::GET => Ok(models(state).await),
            ref m => Err(ApiError::MethodNotAllowed {
                method: m.to_string(),
                allow: "GET",
            }),
        });
    }
    if !surface::is_model_routed(path) {
        return Some(Err(ApiError::RouteNotFound {
            method: req.method().to_string(),
            path: path.to_string(),
        }));
    }
    if req.method() != Method::POST {
        return Some(Err(ApiError::MethodNotAllowed {
            method: req.method().to_string(),
            allow: "POST",
        }));
    }
    if state.closing.load(std::sync::atomic::Ordering::Relaxed) {
        return Some(Err(ApiError::ShuttingDown));
    }
    None
}

/// `GET /v1/models`: the config's models and aliases, then the names the
/// replicas of `models_from_replicas` pools report.
async fn models(state: &AppState) -> Response<ResponseBody> {
    let topology = state.topology();
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

/// Sheds load before the body is read when the pool is already known from
/// the path or the caller's tier: the pool's `max_pending` gate (its guard,
/// with its pool, is returned) and its queue's quick check.
pub fn shed_before_body<'t>(
    state: &AppState,
    topology: &'t Topology,
    tier: Option<&str>,
    caller: &Caller,
    tenant: &str,
) -> Result<Option<(&'t Pool, PendingGuard)>, ApiError> {
    let Some(pool) = topology.pool_before_body(tier) else {
        return Ok(None);
    };
    let mut early = None;
    if let Some(gate) = state.pending.get(&pool.name) {
        let guard = gate.try_enter().map_err(|limit| ApiError::PoolOverloaded {
            pool: pool.name.clone(),
            limit,
        })?;
        early = Some((&**pool, guard));
    }
    if let Some(admission) = &pool.admission {
        admission.check(caller.level, tenant)?;
    }
    Ok(early)
}

/// Reads the whole body within `body_timeout` (408) and `max_body_bytes`
/// (413), its bytes reserved in the process-wide budget (503 beyond
/// `max_buffered_bytes`). The reservation lasts as long as the caller keeps it.
pub async fn read_within_budget<'s>(
    state: &'s AppState,
    server: &ServerConfig,
    body: Incoming,
) -> Result<(Bytes, Reservation<'s>), ApiError> {
    let mut held = state.body_budget.empty();
    // The declared length is reserved before the read (`read_body` reads
    // it the same way: the body's exact size hint).
    let declared = http_body::Body::size_hint(&body).exact();
    let max = server.max_body_bytes;
    let reserve = declared.map_or(0, |n| usize::try_from(n).map_or(max, |n| n.min(max)));
    if !held.grow(reserve, server.max_buffered_bytes) {
        return Err(ApiError::ServerBusy);
    }
    let read = read_body(body, max);
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
    Ok((bytes, held))
}

/// The request's pool, resolved once: the queue that admits the request is
/// the queue of the pool that serves it. A model the config does not name
/// may be one a pool's replicas report, which goes before the default pool.
pub async fn resolve_pool<'t>(
    topology: &'t Topology,
    model: &str,
    tier: Option<&str>,
) -> Result<Resolution<'t>, ApiError> {
    match topology.resolve(model, tier) {
        Some(first) if !first.by_default() || !topology.has_reported() => Ok(first),
        by_default => {
            topology.refresh_reported().await;
            topology
                .resolve_reported(model, tier)
                .or(by_default)
                .ok_or_else(|| ApiError::ModelNotFound(model.to_string()))
        }
    }
}

/// Enters the pool's `max_pending` gate, unless the early shed already did
/// (the same pool of the same topology: the gate is not looked up again).
pub fn enter_pending(
    state: &AppState,
    pool: &Pool,
    early: Option<(&Pool, PendingGuard)>,
) -> Result<Option<PendingGuard>, ApiError> {
    if let Some((entered, guard)) = early
        && std::ptr::eq(entered, pool)
    {
        return Ok(Some(guard));
    }
    let Some(gate) = state.pending.get(&pool.name) else {
        return Ok(None);
    };
    let guard = gate.try_enter().map_err(|limit| ApiError::PoolOverloaded {
        pool: pool.name.clone(),
        limit,
    })?;
    Ok(Some(guard))
}

/// What a request is charged and balanced as.
pub struct Estimate {
    /// The prompt's tokens from the pool's tokenizer, when it has one.
    pub counted: Option<PromptTokens>,
    pub prompt_tokens: u32,
    /// The client's `max_tokens`, capped at the context the prompt leaves.
    pub max_tokens: Option<u32>,
    /// Prompt plus output allowance: the rate-limit charge.
    pub total: u64,
}

impl Estimate {
    /// With a model tokenizer, the real prompt token count feeds rate
    /// limits, routing and balancing; else the cheap estimate. An absurd
    /// `max_tokens` is charged and balanced as the context left.
    pub async fn of(pool: &Pool, meta: &RequestMeta) -> Estimate {
        let counted = PromptTokens::count(pool, meta).await;
        let prompt_tokens = counted
            .as_ref()
            .map_or(meta.estimated_prompt_tokens(), PromptTokens::count_u32);
        let room = pool
            .balancing
            .max_model_len
            .saturating_sub(prompt_tokens)
            .max(1);
        let max_tokens = meta.max_tokens.map(|m| m.min(room));
        let total = u64::from(prompt_tokens)
            + u64::from(max_tokens.unwrap_or(pool.balancing.default_max_tokens.min(room)));
        Estimate {
            counted,
            prompt_tokens,
            max_tokens,
            total,
        }
    }

    /// The prompt's tokens for `pool`, counted again when the request ended
    /// up in a pool with another tokenizer.
    pub async fn tokens_for<'e>(
        &'e mut self,
        pool: &Pool,
        meta: &RequestMeta,
    ) -> Option<(&'e [u32], Option<crate::tokenize::Unpredictable>)> {
        if self
            .counted
            .as_ref()
            .is_some_and(|c| c.for_pool(pool).is_none())
            || (self.counted.is_none() && !pool.router.tokenizer().is_stand_in())
        {
            self.counted = PromptTokens::count(pool, meta).await;
        }
        self.counted.as_ref().and_then(|c| c.for_pool(pool))
    }
}

/// Charges the caller's rate limits with the estimate (429 beyond them),
/// writing the `x-ratelimit-*` values into `rate` either way, and counts the
/// tenant's request. The charge refunds itself unless committed.
pub async fn charge<'c>(
    state: &AppState,
    caller: &'c Caller,
    tokens: u64,
    rate: &mut RateHeaders,
) -> Result<Charge<'c>, ApiError> {
    match caller.charge(tokens, Instant::now()).await {
        Ok(headers) => *rate = headers,
        Err(limited) => {
            *rate = limited.headers.clone();
            return Err(limited.into());
        }
    }
    if let Some(tenant) = &caller.tenant {
        state
            .admission_metrics
            .tenant_requests
            .with_label_values(&[tenant])
            .inc();
    }
    Ok(Charge::new(caller, tokens))
}

/// Waits in the pool's queue, when it has one (a `llmlb.queue` span), as
/// `tenant`'s request of `estimate`'s size. A level with a
/// `ttft_objective` is given the request's predicted time to first token
/// on its best replica (`routing::placement_ttft`); under the prefix
/// handoff the request waits with its prompt's tokens (see [`affinity`]).
pub async fn admit(
    first: &Resolution<'_>,
    caller: &Caller,
    tenant: Arc<str>,
    estimate: &mut Estimate,
    meta: &RequestMeta,
    trace: Option<&RequestTrace>,
) -> Result<Option<Permit>, ApiError> {
    let pool = first.pool;
    let model = first.rewrite.unwrap_or(&meta.model);
    let Some(admission) = &pool.admission else {
        return Ok(None);
    };
    let prompt_tokens = u64::from(estimate.prompt_tokens);
    let placement = if admission.has_deadline(caller.level) {
        placement_ttft(pool, prompt_tokens, now_millis())
    } else {
        Placement::default()
    };
    let affinity = match admission.queue.prefix_handoff().is_zero() {
        false => affinity(pool, estimate, meta, model).await,
        true => None,
    };
    let claim = Claim {
        level: caller.level,
        tenant,
        prompt_tokens,
        output_tokens: estimate.total.saturating_sub(prompt_tokens),
        affinity,
    };
    let _queued = trace.map(|t| t.stage("llmlb.queue"));
    Ok(Some(admission.acquire(claim, placement).await?))
}

/// For the queue's prefix handoff: how much of the request's prompt the
/// pool's replicas with a free slot cache, read when a slot frees. `None`
/// for a prompt whose tokens cannot be predicted.
async fn affinity(
    pool: &Arc<Pool>,
    estimate: &mut Estimate,
    meta: &RequestMeta,
    model: &str,
) -> Option<Affinity> {
    if meta.unpredictable.is_some() {
        return None;
    }
    let router = &pool.router;
    let tokens = match estimate.tokens_for(pool, meta).await {
        Some((ids, None)) => ids.to_vec(),
        Some((_, Some(_))) => return None,
        None => match prompt_ids(router.tokenizer(), prompt(meta)) {
            (ids, None) => ids,
            (_, Some(_)) => return None,
        },
    };
    let key = router.key_of(model, meta.cache_salt.as_deref());
    let (pool, model) = (Arc::clone(pool), model.to_string());
    let cached = move || {
        let now_ms = now_millis();
        (pool.router).cached_where_free(&pool.replicas, &model, &tokens, &key, now_ms)
    };
    Some(Affinity(Arc::new(cached)))
}

/// After a queue wait, the same pool with the replicas in force now (a
/// reload may have happened meanwhile); the old one when the pool is gone.
pub fn after_queue<'a>(
    current: &'a Topology,
    first: Resolution<'a>,
    waited: bool,
) -> Resolution<'a> {
    let reloaded = waited
        .then(|| current.pools().iter().find(|p| p.name == first.pool.name))
        .flatten();
    Resolution {
        pool: reloaded.unwrap_or(first.pool),
        rewrite: first.rewrite,
        branches: first.branches,
    }
}

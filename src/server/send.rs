//! The last two steps of [`super::handler`]'s request path: the routing
//! decision within the chosen pool, then forwarding under it, with what the
//! answer carries back (the canary version's header and outcome record, the
//! queue's lesson in drain rate).

use bytes::Bytes;
use http::header::HeaderValue;
use http::uri::PathAndQuery;
use http::{HeaderMap, Response, request};

use super::prompt_tokens::prompt;
use super::request::RequestMeta;
use super::{ApiError, AppState};
use crate::admission::Permit;
use crate::balancing::RequestInfo;
use crate::forwarding::{
    ForwardRequest, Origin, Outbound, Progress, ProxyBody, forward, strip_hop_by_hop, strip_private,
};
use crate::pool::{Pool, Resolution, Topology};
use crate::routing::{Decision, RouteInput, Router};
use crate::telemetry::clock::now_millis;
use crate::tokenize::Unpredictable;

/// What every step of one request shares: the process, and whom the
/// request is for (its id, trace and client), which forwarding borrows.
pub struct RequestCtx<'a> {
    pub state: &'a AppState,
    pub origin: Origin<'a>,
}

/// What `router` reads of one request: `model` is the name the pool
/// serves (after an alias), `tokens` the prompt's ids from the pool's
/// tokenizer with the reason its cached prefix cannot be predicted, if any.
/// The client's key is looked up only for a pool with a canary (a sticky
/// key), the one step that reads it.
pub fn route_input<'a>(
    router: &Router,
    meta: &'a RequestMeta,
    model: &'a str,
    headers: &'a HeaderMap,
    tier: Option<&'a str>,
    tokens: Option<(&'a [u32], Option<Unpredictable>)>,
) -> RouteInput<'a> {
    RouteInput {
        model,
        user: meta.user.as_deref(),
        api_key: router
            .has_canary()
            .then(|| crate::gateway::keys::presented_key(headers))
            .flatten(),
        headers,
        tier,
        prompt: prompt(meta),
        tokens: tokens.map(|t| t.0),
        salt: meta.cache_salt.as_deref(),
        unpredictable: meta.unpredictable.or(tokens.and_then(|t| t.1)),
        kind: meta.kind(),
        max_tokens: meta.max_tokens,
    }
}

/// A request through the gateway and its pool's queue, on its way to a
/// replica of the pool in force after the wait: the one record the routing
/// within the pool, a disaggregated pool's prefill step and the send
/// borrow, built once; the send takes it apart into what leaves.
pub(super) struct Admitted<'a> {
    pub(super) topology: &'a Topology,
    pub(super) resolved: Resolution<'a>,
    pub(super) meta: &'a RequestMeta,
    pub(super) parts: request::Parts,
    pub(super) bytes: &'a Bytes,
    pub(super) tier: Option<&'a str>,
    /// The caller's priority level (0 = highest).
    pub(super) level: usize,
    /// Remove the client's key before it leaves.
    pub(super) strip_key: bool,
    /// `[server] replica_header`.
    pub(super) expose_replica: bool,
    /// What balancing reads: the model name as the pool's replicas serve
    /// it (after an alias), the prompt's tokens, the output allowance, the
    /// client's `user`.
    pub(super) info: RequestInfo<'a>,
}

/// The routing stage within the chosen pool: the request's decision, and
/// the body to send with the request's edits ([`Outbound`]: the served model
/// name when an alias was used, the request's `level` as `priority` when the
/// pool sends it, `stream_options` for a stream the pool asks for its usage).
pub(super) fn route_within(
    state: &AppState,
    a: &Admitted<'_>,
    tokens: Option<(&[u32], Option<Unpredictable>)>,
) -> Result<(Decision, Outbound), ApiError> {
    let (resolved, meta, parts) = (&a.resolved, a.meta, &a.parts);
    let pool = resolved.pool;
    let headers = &parts.headers;
    let usage = (meta.stream && pool.stream_usage).then_some(meta.stream_options);
    let priority = pool
        .send_priority
        .then(|| u32::try_from(a.level).unwrap_or(u32::MAX));
    let body = Outbound::edit(a.bytes, parts.uri.path(), resolved.rewrite, usage, priority)?;
    let input = route_input(&pool.router, meta, a.info.model, headers, a.tier, tokens);
    let decision = pool.router.route(
        &pool.replicas,
        &input,
        super::random::random(),
        now_millis(),
    )?;
    for branches in [&resolved.branches, &decision.branches] {
        state.routing_metrics.record_branches(&pool.name, branches);
    }
    if let Some(reason) = decision.unpredictable {
        state
            .routing_metrics
            .record_unpredictable(&pool.name, reason);
    }
    Ok((decision, body))
}

/// Forwards under `decision`, writing its attempts into `progress` (the
/// request's record). A canary version is tagged on the answer; a
/// successful answer marks the queue permit served so the queue learns its
/// drain rate from it.
pub(super) fn send<'a>(
    ctx: &'a RequestCtx<'_>,
    a: Admitted<'a>,
    decision: &'a Decision,
    body: Outbound,
    permit: Option<&'a mut Permit>,
    progress: &'a mut Progress,
) -> impl Future<Output = Result<Response<Box<ProxyBody>>, ApiError>> {
    // Not an `async fn`: the request is taken apart before the future is
    // made, which then holds what leaves once.
    let mut request = forward_request(ctx, a, decision, body, progress);
    async move {
        let mut resp = forward(&mut request).await?;
        // A replica answered: the time this request holds its queue slot
        // teaches the queue its drain rate (failures and refusals do not).
        if let Some(p) = permit.filter(|_| resp.status().is_success()) {
            p.served();
        }
        if let Some(v) = &decision.version
            && let Ok(v) = HeaderValue::from_str(v)
        {
            resp.headers_mut().insert("x-llmlb-version", v);
        }
        Ok(resp)
    }
}

/// What [`forward`] needs of the request as it leaves.
fn forward_request<'a>(
    ctx: &'a RequestCtx<'_>,
    a: Admitted<'a>,
    decision: &'a Decision,
    body: Outbound,
    progress: &'a mut Progress,
) -> ForwardRequest<'a> {
    let (pool, parts) = (a.resolved.pool, a.parts);
    let path_and_query = parts
        .uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    ForwardRequest {
        pool,
        method: parts.method,
        path_and_query,
        headers: upstream_headers(parts.headers, a.strip_key, pool),
        body,
        info: a.info,
        route: decision,
        origin: &ctx.origin,
        expose_replica: a.expose_replica,
        progress,
    }
}

/// The client's headers as the replica gets them: hop-by-hop headers and
/// llmlb's own removed, the client's key removed when llmlb checked it, the
/// pool's own key set.
pub(super) fn upstream_headers(mut headers: HeaderMap, strip_key: bool, pool: &Pool) -> HeaderMap {
    strip_hop_by_hop(&mut headers);
    strip_private(&mut headers, strip_key, pool.upstream_auth.as_ref());
    headers
}

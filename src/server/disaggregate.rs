//! The prefill step of a disaggregated pool's request, between the routing
//! decision within the (decode) pool and forwarding: decide whether the
//! request is prefilled on the prefill pool ([`crate::pool::disaggregate`]),
//! route it within that pool, run the prefill ([`crate::forwarding::prefill`])
//! and hand back the body the decode replica gets. A request that is not
//! disaggregated, or whose prefill failed with `fallback` on, leaves with
//! its body unchanged and is prefilled by its decode replica.
//!
//! Each request is counted once in `llmlb_disaggregation_decisions_total`,
//! under the branch it ended in (`fallback` and `no_prefill_replica` for
//! the ones meant for the prefill pool that came back).

use std::sync::Arc;
use std::time::Instant;

use super::ApiError;
use super::send::{Admitted, RequestCtx, route_input, upstream_headers};
use crate::balancing::RequestInfo;
use crate::forwarding::{ForwardError, Outbound, PrefillError, PrefillRequest, Prefilled, prefill};
use crate::pool::{Disaggregation, Pool, SplitBranch};
use crate::routing::Decision;
use crate::telemetry::clock::now_millis;
use crate::tokenize::Unpredictable;

/// Where one request of a disaggregated pool was prefilled.
#[derive(Debug)]
pub struct Split {
    pub branch: SplitBranch,
    /// The prefill that succeeded, when the request was disaggregated.
    pub prefilled: Option<Prefilled>,
}

impl Split {
    /// After the decode replica answered (its head, `sent` being when the
    /// decode request left): the hop's cost, learned and measured.
    pub fn decoded(&self, ctx: &RequestCtx<'_>, pool: &Pool, sent: Instant) {
        let (Some(p), Some(d)) = (&self.prefilled, &pool.disaggregation) else {
            return;
        };
        let hop = sent.elapsed().as_secs_f64();
        d.observe_hop(hop);
        let m = &ctx.state.disaggregation_metrics;
        m.phase(&pool.name, "prefill", p.elapsed.as_secs_f64());
        m.phase(&pool.name, "decode_first_byte", hop);
    }
}

/// Runs the step for a pool with `[pools.disaggregation]`; `None` (and the
/// body unchanged) for any other pool.
pub(super) async fn prefill_step(
    ctx: &RequestCtx<'_>,
    a: &Admitted<'_>,
    decision: &Decision,
    tokens: Option<(&[u32], Option<Unpredictable>)>,
    body: Outbound,
) -> Result<(Option<Split>, Outbound), ApiError> {
    let pool = a.resolved.pool;
    let Some(d) = &pool.disaggregation else {
        return Ok((None, body));
    };
    let metrics = &ctx.state.disaggregation_metrics;
    let decided = |branch: SplitBranch, prefilled: Option<Prefilled>| {
        metrics.decided(&pool.name, branch);
        Split { branch, prefilled }
    };
    let branch = d.decide(pool, decision, &a.info, now_millis());
    if !branch.disaggregates() {
        return Ok((Some(decided(branch, None)), body));
    }
    let Some((prefill_pool, route)) = route_prefill(a, tokens, d) else {
        let err = ForwardError::NoHealthyReplica {
            pool: d.config.prefill_pool.clone(),
        };
        return fall_back(
            d.config.fallback,
            decided(SplitBranch::NoPrefillReplica, None),
            body,
            err,
        );
    };
    match run_prefill(ctx, a, d, prefill_pool, &route, &body).await {
        Ok(p) => {
            let decode_body = p.decode_body.clone();
            Ok((Some(decided(branch, Some(p))), decode_body))
        }
        Err(e) => {
            tracing::info!(pool = %pool.name, error = %e, fallback = d.config.fallback, "prefill failed");
            let (branch, err) = match e {
                PrefillError::NoReplica { pool } => (
                    SplitBranch::NoPrefillReplica,
                    ForwardError::NoHealthyReplica { pool },
                ),
                PrefillError::Failed { pool, attempts, .. } => (
                    SplitBranch::Fallback,
                    ForwardError::UpstreamUnavailable { pool, attempts },
                ),
            };
            fall_back(d.config.fallback, decided(branch, None), body, err)
        }
    }
}

/// The prefill pool and the routing decision within it, as the request
/// would be routed there on its own; `None` when the pool is gone or
/// routing refuses the request.
fn route_prefill<'t>(
    a: &Admitted<'t>,
    tokens: Option<(&[u32], Option<Unpredictable>)>,
    d: &Disaggregation,
) -> Option<(&'t Arc<Pool>, Decision)> {
    let pp = a.topology.pool_named(&d.config.prefill_pool)?;
    let input = route_input(
        &pp.router,
        a.meta,
        a.info.model,
        &a.parts.headers,
        a.tier,
        tokens,
    );
    let route = pp
        .router
        .route(&pp.replicas, &input, super::random::random(), now_millis())
        .ok()?;
    Some((pp, route))
}

/// Sends the prefill request (one token, the client's headers without
/// hop-by-hop and private ones) within the prefill pool, traced as the
/// `llmlb.prefill` stage.
async fn run_prefill(
    ctx: &RequestCtx<'_>,
    a: &Admitted<'_>,
    d: &Disaggregation,
    prefill_pool: &Arc<Pool>,
    route: &Decision,
    body: &Outbound,
) -> Result<Prefilled, PrefillError> {
    let headers = upstream_headers(a.parts.headers.clone(), a.strip_key, prefill_pool);
    let span = ctx.origin.trace.map(|t| t.stage("llmlb.prefill"));
    let done = prefill(PrefillRequest {
        pool: prefill_pool,
        route,
        method: &a.parts.method,
        path_and_query: a.parts.uri.path_and_query().map_or("/", |pq| pq.as_str()),
        headers,
        body,
        protocol: d.protocol,
        bootstrap_port: d.config.bootstrap_port,
        info: RequestInfo {
            max_tokens: Some(1),
            ..a.info
        },
        timeout: d.config.prefill_timeout,
        attempts: d.config.prefill_attempts,
        origin: &ctx.origin,
        disaggregation: &ctx.state.disaggregation_metrics,
    })
    .await;
    if let Some(s) = &span {
        match &done {
            Ok(p) => {
                s.set("llmlb.pool", prefill_pool.name.clone());
                s.set("llmlb.replica", p.replica.name.clone());
                s.set("llmlb.attempts", i64::from(p.attempts));
            }
            Err(_) => s.fail("prefill_failed"),
        }
    }
    done
}

/// The decode replica prefills itself, or (`fallback = false`) the client
/// gets `err` (503 or 502).
fn fall_back(
    fallback: bool,
    split: Split,
    body: Outbound,
    err: ForwardError,
) -> Result<(Option<Split>, Outbound), ApiError> {
    if fallback {
        Ok((Some(split), body))
    } else {
        Err(ApiError::from(err))
    }
}

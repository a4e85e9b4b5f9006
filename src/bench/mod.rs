//! `llmlb bench`: an OpenAI-compatible load generator that measures what
//! users feel.
//!
//! A run sends streaming requests from a [`workload`] (random, shared-prefix,
//! multi-turn chat, or a replayed trace) on an arrival schedule
//! ([`Arrivals`]: Gamma/Poisson open loop, closed loop, or the trace's own
//! timestamps), times every request ([`client`]: TTFT, each inter-token gap,
//! end-to-end, tokens, status, serving replica), and reports distributions,
//! throughput and goodput ([`stats`]) as a table, JSON ([`report`]) and SVG
//! CDFs ([`plot`]).
//!
//! Prompt lengths are exact in llmlb's own tokenizer ([`crate::tokenize::stand_in`],
//! which the simulated replicas use). A real model's tokenizer splits the
//! pseudo-words differently, so against vLLM the prompt token counts differ
//! from the requested ones; the report counts what the server's `usage` says
//! when it says it. Output lengths stay exact thanks to `ignore_eos` and
//! `max_tokens`.
//!
//! Every run is bounded: a request count and a duration, each with a hard
//! cap, and a per-request timeout. Targets must be on this machine unless
//! [`BenchSpec::allow_remote`] is set.

mod args;
pub mod arrivals;
pub mod cli;
pub mod client;
mod error;
pub mod instant;
pub mod plot;
pub mod progress;
pub mod record;
pub mod report;
mod runner;
pub mod spec;
pub mod sse;
pub mod stats;
pub mod text;
pub mod workload;

use std::sync::Arc;

use tokio::time::Instant;

pub use arrivals::Arrivals;
pub use error::BenchError;
pub use plot::write_svg;
pub use record::{Outcome, RequestRecord};
pub use report::{RunReport, render_table};
pub use spec::{BenchSpec, Limits, Slo};
pub use stats::{Figures, Summary};
pub use workload::WorkloadSpec;

use client::BenchClient;
use progress::{Counters, ProgressBar};
use runner::Shared;
use spec::{DEFAULT_REQUESTS, HARD_MAX_DURATION, HARD_MAX_REQUESTS};

fn validate(spec: &BenchSpec) -> Result<(), BenchError> {
    spec.limits.validate()?;
    let bad = |m: &str| Err(BenchError::InvalidSpec(m.into()));
    match spec.arrivals {
        Arrivals::Open { rate, burstiness } => {
            if !(rate.is_finite() && rate > 0.0) {
                return bad("--rate must be a positive number of requests per second");
            }
            if !(burstiness.is_finite() && burstiness > 0.0) {
                return bad("--burstiness must be a positive number");
            }
        }
        Arrivals::Closed { concurrency } => {
            if concurrency == 0 {
                return bad("--concurrency must be at least 1");
            }
        }
        Arrivals::Timestamps => {
            if !matches!(spec.workload, WorkloadSpec::Trace(_)) {
                return bad("only the trace workload carries its own timestamps");
            }
        }
    }
    if spec.model.is_empty() {
        return bad("--model must not be empty");
    }
    Ok(())
}

/// Runs one benchmark and reports on it.
pub async fn run(spec: &BenchSpec) -> Result<RunReport, BenchError> {
    validate(spec)?;
    let limits = &spec.limits;
    let client = BenchClient::new(
        &spec.target,
        spec.allow_remote,
        &spec.model,
        &spec.headers,
        spec.api_key.as_deref(),
        limits.request_timeout,
    )?;
    let workload = spec.workload.build(spec.seed)?;
    let budget = match (limits.num_requests, limits.duration) {
        (Some(n), _) => n,
        (None, Some(_)) => HARD_MAX_REQUESTS,
        (None, None) => workload.size_hint().unwrap_or(DEFAULT_REQUESTS),
    }
    .min(HARD_MAX_REQUESTS);
    let run_for = limits
        .duration
        .unwrap_or(HARD_MAX_DURATION)
        .min(HARD_MAX_DURATION);

    let counters = Arc::new(Counters::default());
    // The bar's denominator: 0 (unknown) when only a duration bounds an
    // infinite or cycling workload.
    let shown_total = match (limits.num_requests, limits.duration) {
        (None, Some(_)) => 0,
        _ => workload.size_hint().map_or(budget, |n| n.min(budget)),
    };
    let bar = ProgressBar::start(
        spec.progress,
        counters.clone(),
        shown_total,
        limits.duration,
    );
    let start = Instant::now();
    let date = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
    let shared = Arc::new(Shared::new(
        client,
        start,
        start + run_for,
        budget,
        counters,
    ));
    match spec.arrivals {
        Arrivals::Closed { concurrency } => {
            runner::closed_loop(shared.clone(), workload, concurrency).await
        }
        ref open => {
            runner::open_loop(
                shared.clone(),
                workload,
                open,
                limits.max_in_flight,
                spec.seed,
            )
            .await
        }
    }
    let duration_s = start.elapsed().as_secs_f64();
    if let Some(bar) = bar {
        bar.finish().await;
    }
    let records = shared.take_records();
    Ok(RunReport {
        date,
        version: env!("CARGO_PKG_VERSION").into(),
        args: Vec::new(),
        target: spec.target.clone(),
        model: spec.model.clone(),
        workload: spec.workload.name().into(),
        arrivals: spec.arrivals.describe(),
        seed: spec.seed,
        figures: Figures::compute(&records, duration_s, &spec.slo),
        requests: records,
    })
}

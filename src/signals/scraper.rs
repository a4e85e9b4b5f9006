//! The scrape loop of one replica: `GET /metrics` every `scrape.interval`
//! (deadlines computed ahead, `sleep_until`, so a slow scrape does not drift
//! the cadence), each bounded by `scrape.timeout`, until told to stop.
//!
//! A good scrape replaces the replica's [`LoadSnapshot`] whole and restarts
//! its since-scrape counts; a scrape whose prefix-cache counter went down
//! is a replica restart ([`crate::replica::restart`]), logged and counted in
//! `llmlb_replica_restarts_total`. A failed one (timeout, refused, non-2xx, no known
//! metric in the page) is counted in `llmlb_scrape_errors_total` and leaves
//! the old snapshot to age: once older than `scrape.staleness` the balancers
//! stop using it. Logged once when a replica starts failing and once when it
//! recovers, not on every tick.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;

use super::MetricNames;
use crate::config::ScrapeConfig;
use crate::net::{ProbeError, Prober};
use crate::net::{sleep_or_stop, stopped};
use crate::replica::LoadSnapshot;
use crate::replica::Replica;
use crate::telemetry::Metrics;
use crate::telemetry::clock::now_millis;

/// What one scrape loop polls.
#[derive(Debug, Clone)]
pub struct ScrapeTarget {
    pub pool: Arc<str>,
    pub replica: Arc<Replica>,
    pub config: ScrapeConfig,
    pub names: MetricNames,
}

/// Runs until `stop` turns true (or its sender goes away).
pub async fn run(
    target: ScrapeTarget,
    prober: Prober,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let mut next = Instant::now();
    let mut failing = false;
    loop {
        if sleep_or_stop(next, &mut stop).await {
            return;
        }
        next += target.config.interval;
        let now = Instant::now();
        if next < now {
            // Fell behind (a scrape took longer than the interval): skip ahead.
            next = now + target.config.interval;
        }
        let result = tokio::select! {
            r = scrape_once(&target, &prober) => r,
            _ = stopped(&mut stop) => return,
        };
        record(&target, &metrics, result, &mut failing);
    }
}

/// Why a scrape gave no load.
#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    /// The page could not be fetched (timeout, refused, non-2xx, ...).
    #[error("{kind}: {0}", kind = .0.kind())]
    Fetch(ProbeError),
    /// The page names none of the configured metrics.
    #[error("no_metrics: none of the configured metric names is present")]
    NoMetrics,
}

impl ScrapeError {
    /// The `kind` label of `llmlb_scrape_errors_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            ScrapeError::Fetch(e) => e.kind(),
            ScrapeError::NoMetrics => "no_metrics",
        }
    }
}

/// One scrape, parsed.
pub async fn scrape_once(
    target: &ScrapeTarget,
    prober: &Prober,
) -> Result<LoadSnapshot, ScrapeError> {
    let body = prober
        .get_from(
            &target.replica.scheme,
            &target.replica.authority,
            &target.config.path,
            target.config.timeout,
        )
        .await
        .map_err(ScrapeError::Fetch)?;
    let text = String::from_utf8_lossy(&body);
    let snapshot = LoadSnapshot::from_text(&text, &target.names, now_millis());
    target.replica.adapters.observe(super::lora::parse(&text));
    if snapshot.is_empty() {
        return Err(ScrapeError::NoMetrics);
    }
    Ok(snapshot)
}

fn record(
    target: &ScrapeTarget,
    metrics: &Metrics,
    result: Result<LoadSnapshot, ScrapeError>,
    failing: &mut bool,
) {
    let (pool, name) = (&*target.pool, target.replica.name.as_str());
    match result {
        Ok(snapshot) => {
            if *failing {
                tracing::info!(pool, replica = name, "metrics scrape recovered");
                *failing = false;
            }
            let requests = &metrics.signals.scraped_requests;
            for (state, value) in [("running", snapshot.running), ("waiting", snapshot.waiting)] {
                if let Some(v) = value {
                    requests
                        .with_label_values(&[pool, name, state])
                        .set(v as f64);
                }
            }
            if let Some(v) = snapshot.kv_usage {
                metrics
                    .signals
                    .scraped_kv_usage
                    .with_label_values(&[pool, name])
                    .set(v);
            }
            if target.replica.store_load(snapshot) {
                metrics
                    .signals
                    .restarts
                    .with_label_values(&[pool, name])
                    .inc();
                tracing::info!(
                    pool,
                    replica = name,
                    "replica restarted: llmlb forgets what its prefix cache held"
                );
            }
            let learned = target.replica.learned.rates();
            let s = &metrics.signals;
            for (gauge, value) in [
                (&s.learned_prefill_rate, learned.prefill_tokens_per_second),
                (
                    &s.learned_prefill_seconds,
                    learned.prefill_seconds_per_request,
                ),
                (&s.learned_decode_step, learned.decode_step_seconds),
                (&s.learned_output_tokens, learned.output_tokens),
            ] {
                if let Some(v) = value {
                    gauge.with_label_values(&[pool, name]).set(v);
                }
            }
        }
        Err(reason) => {
            let kind = reason.kind();
            metrics
                .signals
                .scrape_errors
                .with_label_values(&[pool, name, kind])
                .inc();
            if !*failing {
                tracing::warn!(pool, replica = name, %reason, "metrics scrape failed; its load will go stale");
                *failing = true;
            }
        }
    }
}

//! `llmlb demo --scenario priority`: what the pool queue does for paid
//! traffic when the fleet is overloaded.
//!
//! Two tiers share two simulated replicas: `paid` at a modest rate and `free`
//! at a rate that alone exceeds the fleet's capacity. The same load runs
//! twice on a fresh fleet each time: once with no queue in llmlb (every
//! request goes straight to a replica, whose own FCFS queue grows), once with
//! `max_inflight` per replica, so llmlb holds the excess in its priority queue
//! and refuses free requests it cannot start within their objective.

use std::time::Duration;

use super::fleet::{Fleet, FleetSpec, SCRAPE_INTERVAL};
use super::{DemoArgs, DemoError};
use crate::bench::workload::{LenRange, RandomOptions};
use crate::bench::{self, Arrivals, BenchSpec, Figures, Limits, WorkloadSpec};
use crate::replica_sim::SimConfig;

/// One variant's outcome per tier.
#[derive(Debug, Clone)]
pub struct PriorityRow {
    pub variant: &'static str,
    pub paid: Figures,
    pub free: Figures,
}

/// The gateway, queue levels and tiers put in front of the pool.
const TIERS: &str = include_str!("tiers.toml");

pub async fn run(args: &DemoArgs) -> Result<Vec<PriorityRow>, DemoError> {
    let mut sim =
        SimConfig::named_or_file(&args.profile).map_err(|e| DemoError::Sim(e.to_string()))?;
    // A replica that batches at most 16 sequences: it queues internally
    // once 16 requests run, which is where the two variants differ.
    let max_seqs = 16;
    sim.engine.max_num_seqs = max_seqs;
    let replicas = 2;
    let seconds = if args.quick { 4.0 } else { 20.0 };
    let (paid_rate, free_rate) = (args.rate * 0.5, args.rate * 2.5);
    println!(
        "llmlb demo --scenario priority: {replicas} simulated replicas ({}, max_num_seqs {max_seqs}),\n\
         random workload (512 prompt tokens, 128 output tokens), {seconds:.0} s of arrivals:\n\
         paid tier {paid_rate} req/s + free tier {free_rate} req/s (Poisson), run twice on a fresh fleet\n",
        args.profile
    );
    let variants: [(&'static str, String); 2] = [
        ("no queue", "balancer = \"least_connections\"\n".to_string()),
        (
            "priority queue",
            format!(
                "balancer = \"least_connections\"\nmax_inflight = {max_seqs}\n\
                 [pools.queue]\nmax_depth = 512\ntimeout = \"30s\"\n"
            ),
        ),
    ];
    let mut rows = Vec::new();
    for (variant, pool) in variants {
        eprintln!("running {variant} ...");
        let fleet = Fleet::start(&FleetSpec {
            sim: sim.clone(),
            replicas,
            seed: args.seed,
            top: TIERS.to_string(),
            pool,
            kv_events: false,
            scrape_interval: SCRAPE_INTERVAL,
        })
        .await?;
        let spec = |tier: &str, rate: f64, seed: u64| {
            let mut spec = BenchSpec::new(
                format!("http://{}", fleet.proxy_addr()),
                fleet.model(),
                WorkloadSpec::Random(RandomOptions {
                    input_len: LenRange::fixed(512),
                    output_len: LenRange::fixed(128),
                }),
            );
            spec.arrivals = Arrivals::Open {
                rate,
                burstiness: 1.0,
            };
            spec.limits = Limits {
                num_requests: Some((rate * seconds).ceil() as u64),
                duration: Some(Duration::from_secs_f64(seconds * 2.0)),
                request_timeout: Duration::from_secs(120),
                max_in_flight: 4096,
            };
            spec.seed = seed;
            spec.headers = vec![("x-llmlb-tier".into(), tier.into())];
            spec
        };
        let paid_spec = spec("paid", paid_rate, args.seed);
        let free_spec = spec("free", free_rate, args.seed + 1);
        let (paid, free) = tokio::join!(bench::run(&paid_spec), bench::run(&free_spec));
        let (paid, free) = (paid?, free?);
        fleet.stop().await;
        rows.push(PriorityRow {
            variant,
            paid: paid.figures,
            free: free.figures,
        });
    }
    println!("{}", render(&rows));
    Ok(rows)
}

fn share(part: u64, whole: u64) -> String {
    if whole == 0 {
        "-".into()
    } else {
        format!("{:.1}%", 100.0 * part as f64 / whole as f64)
    }
}

pub fn render(rows: &[PriorityRow]) -> String {
    let mut out = format!(
        "{:<16} {:>14} {:>14} {:>14} {:>14} {:>12} {:>12}\n",
        "variant",
        "paid TTFT p50",
        "paid TTFT p99",
        "free TTFT p50",
        "free TTFT p99",
        "free 429s",
        "paid 429s"
    );
    out.push_str(&"-".repeat(out.len() - 1));
    for r in rows {
        out.push_str(&format!(
            "\n{:<16} {:>11.0} ms {:>11.0} ms {:>11.0} ms {:>11.0} ms {:>12} {:>12}",
            r.variant,
            r.paid.ttft_ms.p50,
            r.paid.ttft_ms.p99,
            r.free.ttft_ms.p50,
            r.free.ttft_ms.p99,
            share(r.free.rejected_429, r.free.sent),
            share(r.paid.rejected_429, r.paid.sent),
        ));
    }
    out.push_str(
        "\n(TTFT over completed requests; 429s as a share of the requests sent by that tier)",
    );
    out
}

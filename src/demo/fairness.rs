//! `llmlb demo --scenario fairness`: one tenant's flood beside a light
//! tenant on the same priority level, with the pool queue in arrival order
//! (`fairness = "fifo"`) and with fair share among tenants (`tenants`).
//!
//! Two simulated replicas with `max_inflight = 2` each: the light tenant
//! sends one stream at a time (a closed loop of one), the heavy tenant
//! twelve. The light tenant runs alone first (its solo latency), then
//! beside the flood under each order, on a fresh fleet each time. Callers
//! name their tenant with the `x-llmlb-tenant` header.

use std::time::Duration;

use super::fleet::{Fleet, FleetSpec, SCRAPE_INTERVAL};
use super::{DemoArgs, DemoError};
use crate::bench::workload::{LenRange, RandomOptions};
use crate::bench::{self, Arrivals, BenchSpec, Figures, Limits, WorkloadSpec};
use crate::replica_sim::SimConfig;

/// The scenario's shape.
#[derive(Debug, Clone)]
pub struct FairScenario {
    pub profile: SimConfig,
    pub replicas: usize,
    pub max_inflight: usize,
    /// Concurrent streams of the heavy tenant.
    pub heavy_streams: usize,
    pub prompt_tokens: u32,
    /// Answer lengths, drawn uniformly (different lengths keep the slots
    /// from freeing in lockstep).
    pub output_tokens: (u32, u32),
    /// How long the light tenant sends, in each variant.
    pub seconds: f64,
    pub seed: u64,
}

impl FairScenario {
    /// The demo's set-up: two `h100-8b` replicas, `max_inflight = 2`, a
    /// 12-stream flood, 512-token prompts and answers of 16 to 112 tokens.
    pub fn standard(seconds: f64, seed: u64) -> FairScenario {
        FairScenario {
            profile: SimConfig::profile("h100-8b").expect("built-in profile"),
            replicas: 2,
            max_inflight: 2,
            heavy_streams: 12,
            prompt_tokens: 512,
            output_tokens: (16, 112),
            seconds,
            seed,
        }
    }
}

/// One variant's figures per tenant (`heavy` is `None` alone).
#[derive(Debug, Clone)]
pub struct FairRow {
    pub variant: &'static str,
    pub light: Figures,
    pub heavy: Option<Figures>,
}

/// The variants, in order: the light tenant alone, beside the flood in
/// arrival order, beside the flood with fair share.
pub const VARIANTS: [(&str, &str, bool); 3] = [
    ("light alone", "tenants", false),
    ("fifo", "fifo", true),
    ("fair share", "tenants", true),
];

pub async fn run(args: &DemoArgs) -> Result<Vec<FairRow>, DemoError> {
    let mut s = FairScenario::standard(if args.quick { 4.0 } else { 15.0 }, args.seed);
    s.profile =
        SimConfig::named_or_file(&args.profile).map_err(|e| DemoError::Sim(e.to_string()))?;
    println!(
        "llmlb demo --scenario fairness: {} simulated replicas ({}), max_inflight {} each,\n\
         {}-token prompts, {}-{}-token answers; tenant `light` sends one stream at a time,\n\
         tenant `heavy` {} streams at once, both on one priority level; {:.0} s per variant\n",
        s.replicas,
        args.profile,
        s.max_inflight,
        s.prompt_tokens,
        s.output_tokens.0,
        s.output_tokens.1,
        s.heavy_streams,
        s.seconds
    );
    let rows = measure(&s).await?;
    println!("{}", render(&rows));
    Ok(rows)
}

/// Runs every variant of `s` on a fresh fleet.
pub async fn measure(s: &FairScenario) -> Result<Vec<FairRow>, DemoError> {
    let mut rows = Vec::new();
    for (variant, fairness, flood) in VARIANTS {
        eprintln!("running {variant} ...");
        rows.push(variant_row(s, variant, fairness, flood).await?);
    }
    Ok(rows)
}

/// The pool's keys for one variant.
pub fn pool_keys(s: &FairScenario, fairness: &str) -> String {
    format!(
        "balancer = \"least_connections\"\nmax_inflight = {}\n\
         [pools.queue]\nmax_depth = 64\nmax_wait = \"120s\"\ntimeout = \"120s\"\nfairness = \"{fairness}\"\n",
        s.max_inflight
    )
}

async fn variant_row(
    s: &FairScenario,
    variant: &'static str,
    fairness: &str,
    flood: bool,
) -> Result<FairRow, DemoError> {
    let fleet = Fleet::start(&FleetSpec {
        sim: s.profile.clone(),
        replicas: s.replicas,
        seed: s.seed,
        top: String::new(),
        pool: pool_keys(s, fairness),
        kv_events: false,
        scrape_interval: SCRAPE_INTERVAL,
    })
    .await?;
    let spec = |tenant: &str, streams: usize, seconds: f64, seed: u64| {
        let mut spec = BenchSpec::new(
            format!("http://{}", fleet.proxy_addr()),
            fleet.model(),
            WorkloadSpec::Random(RandomOptions {
                input_len: LenRange::fixed(s.prompt_tokens as usize),
                output_len: LenRange {
                    min: s.output_tokens.0 as usize,
                    max: s.output_tokens.1 as usize,
                },
            }),
        );
        spec.arrivals = Arrivals::Closed {
            concurrency: streams,
        };
        spec.limits = Limits {
            num_requests: None,
            duration: Some(Duration::from_secs_f64(seconds)),
            request_timeout: Duration::from_secs(120),
            max_in_flight: 4096,
        };
        spec.seed = seed;
        spec.headers = vec![("x-llmlb-tenant".into(), tenant.into())];
        spec
    };
    // The flood starts first and outlasts the light tenant's run, so every
    // light request meets it.
    let lead = 1.0;
    let light = spec("light", 1, s.seconds, s.seed);
    let heavy = spec("heavy", s.heavy_streams, s.seconds + 2.0 * lead, s.seed + 1);
    let (light, heavy) = if flood {
        let heavy_run = tokio::spawn(async move { bench::run(&heavy).await });
        tokio::time::sleep(Duration::from_secs_f64(lead)).await;
        let light = bench::run(&light).await?;
        let heavy = heavy_run
            .await
            .map_err(|e| DemoError::Sim(format!("the heavy tenant's run failed: {e}")))??;
        (light, Some(heavy))
    } else {
        (bench::run(&light).await?, None)
    };
    fleet.stop().await;
    Ok(FairRow {
        variant,
        light: light.figures,
        heavy: heavy.map(|h| h.figures),
    })
}

pub fn render(rows: &[FairRow]) -> String {
    let mut out = format!(
        "{:<12} {:>15} {:>15} {:>15} {:>16} {:>16}\n",
        "variant",
        "light TTFT p50",
        "light TTFT p99",
        "heavy TTFT p99",
        "light output/s",
        "heavy output/s",
    );
    out.push_str(&"-".repeat(out.len() - 1));
    for r in rows {
        let heavy_p99 = r
            .heavy
            .as_ref()
            .map_or("-".into(), |h| format!("{:.0} ms", h.ttft_ms.p99));
        let heavy_tps = r
            .heavy
            .as_ref()
            .map_or("-".into(), |h| format!("{:.0}", h.output_throughput));
        out.push_str(&format!(
            "\n{:<12} {:>12.0} ms {:>12.0} ms {:>15} {:>16.0} {:>16}",
            r.variant,
            r.light.ttft_ms.p50,
            r.light.ttft_ms.p99,
            heavy_p99,
            r.light.output_throughput,
            heavy_tps,
        ));
    }
    out.push_str("\n(TTFT over completed requests; output tokens per second of each tenant)");
    out
}

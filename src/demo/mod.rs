//! `llmlb demo`: a simulated fleet, the proxy, and the same short
//! shared-prefix workload through each balancer in turn, ending in one
//! comparison table (and an SVG of the latency distributions).
//!
//! Every run gets a fresh fleet (cold caches, empty queues), so the runs are
//! comparable. Everything listens on `127.0.0.1` port 0, runs in this
//! process, and is stopped before the command returns.

mod bound;
pub mod fairness;
pub mod fleet;
pub mod priority;
mod table;

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::bench::workload::SharedPrefixOptions;
use crate::bench::{self, Arrivals, BenchSpec, Limits, WorkloadSpec};
use crate::replica_sim::SimConfig;
use fleet::{Fleet, FleetSpec};
pub use table::{DemoRow, render};

/// The log filter when `RUST_LOG` is unset: the demo's own output is its
/// header, progress lines and table, so the replicas' and the proxy's log
/// lines stay off unless asked for (on a busy machine even the warnings of
/// a slow scrape would interleave with the table); errors still show.
pub const DEFAULT_LOG_FILTER: &str = "error";

/// What the demo compares.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    /// The same shared-prefix workload through each balancer.
    Balancers,
    /// Paid and free tiers overloading the fleet, with and without the queue.
    Priority,
    /// A light tenant beside another tenant's flood on one priority level,
    /// in arrival order and with fair share.
    Fairness,
}

/// Flags of `llmlb demo`.
#[derive(Args, Debug, Clone)]
pub struct DemoArgs {
    /// What to compare.
    #[arg(long, value_enum, default_value = "balancers")]
    pub scenario: Scenario,
    /// Simulated replicas in the fleet.
    #[arg(long, default_value_t = 4)]
    pub replicas: usize,
    /// Engine profile of every simulated replica: a built-in name (fast,
    /// h100-8b, vllm-cpu-tiny) or a profile file.
    #[arg(long, default_value = "h100-8b")]
    pub profile: String,
    /// KV-cache blocks per replica (16 tokens each): small enough that not
    /// every replica can hold every system prompt, so placement matters.
    #[arg(long, default_value_t = 1024)]
    pub kv_blocks: usize,
    /// Requests per balancer run (at most 32 with --quick). 240 takes twice
    /// as long and gives the p99 twice the samples.
    #[arg(long, default_value_t = 120)]
    pub requests: u64,
    /// Arrival rate (requests per second, Poisson).
    #[arg(long, default_value_t = 14.0)]
    pub rate: f64,
    /// Balancers to compare, in order (comma-separated); `hash`, `cache` and
    /// `exact` run prefix-affinity routing (see docs/ROUTING.md); `exact`
    /// has the replicas publish their KV-cache events.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "round_robin,least_connections,jsq,hash,cache"
    )]
    pub balancers: Vec<String>,
    /// A few seconds instead of about a minute: the `fast` profile, at
    /// most 32 requests, a smaller cache, a higher rate.
    #[arg(long)]
    pub quick: bool,
    /// Where to write the latency CDFs as SVG.
    #[arg(long, alias = "plot", default_value = "llmlb-demo.svg")]
    pub svg: PathBuf,
    /// Seed of the workload and of the replicas.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error("simulator: {0}")]
    Sim(String),
    #[error("proxy config: {0}")]
    Config(String),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Bench(#[from] bench::BenchError),
}

/// The workload every balancer sees: SGLang's generated-shared-prefix shape,
/// scaled down to fit a short run.
fn workload(args: &DemoArgs) -> SharedPrefixOptions {
    if args.quick {
        SharedPrefixOptions {
            groups: 4,
            prompts_per_group: 8,
            system_len: 256,
            question_len: 32,
            output_len: 16,
        }
    } else {
        SharedPrefixOptions {
            groups: 16,
            prompts_per_group: 16,
            system_len: 1536,
            question_len: 64,
            output_len: 64,
        }
    }
}

/// Runs the demo and prints the table; returns the rows for callers that
/// want them.
pub async fn run(mut args: DemoArgs) -> Result<Vec<DemoRow>, DemoError> {
    if args.scenario == Scenario::Priority {
        priority::run(&args).await?;
        return Ok(Vec::new());
    }
    if args.scenario == Scenario::Fairness {
        fairness::run(&args).await?;
        return Ok(Vec::new());
    }
    if args.quick {
        args.profile = "fast".into();
        args.requests = args.requests.min(32);
        args.kv_blocks = args.kv_blocks.min(160);
        args.rate = args.rate.max(50.0);
    }
    let options = workload(&args);
    println!(
        "llmlb demo: {} simulated replicas ({}, {} KV blocks each), {} requests per balancer,\n\
         shared-prefix workload ({} groups x {} prompts, {}-token system prompt, {}-token question, {} output tokens), {} req/s\n",
        args.replicas,
        args.profile,
        args.kv_blocks,
        args.requests,
        options.groups,
        options.prompts_per_group,
        options.system_len,
        options.question_len,
        options.output_len,
        args.rate,
    );
    let block_size = SimConfig::named_or_file(&args.profile).map_or(16, |c| c.engine.block_size);
    let bound = bound::hit_rate_upper_bound(
        &WorkloadSpec::SharedPrefix(options.clone()),
        args.seed,
        args.requests,
        block_size,
    )?;
    println!(
        "prefix-cache hit rate upper bound of this workload: {:.1} % (every shared full block cached)\n",
        bound * 100.0
    );
    let mut rows = Vec::new();
    let mut runs = Vec::new();
    for balancer in &args.balancers {
        let fleet = Fleet::start(&FleetSpec::for_balancer(&args, balancer)?).await?;
        let mut spec = BenchSpec::new(
            format!("http://{}", fleet.proxy_addr()),
            fleet.model(),
            WorkloadSpec::SharedPrefix(options.clone()),
        );
        spec.arrivals = Arrivals::Open {
            rate: args.rate,
            burstiness: 1.0,
        };
        spec.limits = Limits {
            num_requests: Some(args.requests),
            duration: Some(Duration::from_secs(120)),
            request_timeout: Duration::from_secs(60),
            ..Limits::default()
        };
        spec.seed = args.seed;
        eprintln!("running {balancer} ...");
        let report = bench::run(&spec).await?;
        let cache = fleet.prefix_cache().await;
        fleet.stop().await;
        rows.push(DemoRow::new(balancer, &report.figures, cache));
        runs.push((balancer.clone(), report));
    }
    println!("{}", render(&rows));
    bench::write_svg(&args.svg, &runs)?;
    println!("latency CDFs written to {}", args.svg.display());
    Ok(rows)
}

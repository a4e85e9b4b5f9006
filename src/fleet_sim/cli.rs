//! The `llmlb fleet-sim` command line: flags → workload, fleet config,
//! policies; run each policy (on up to `--jobs` threads) or search the
//! smallest fleet; print the table (and with `--tiers` one row per policy
//! and tier), write JSON and SVG.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde::Serialize;

use super::decide::{self, Policy};
use super::faults::Fault;
use super::instances::Instances;
use super::report::{self, RunResult};
use super::run::{RunSpec, run};
use super::search::{self, Objective};
use super::tenants::{TenantMix, Tenants};
use super::tiers::{TierMix, Tiers};
use super::{SimWorkload, SimulateError};
use crate::bench::workload::{LenRange, RandomOptions, SharedPrefixOptions, WorkloadSpec};
use crate::config::{Config, DisaggregateWhen};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum BuiltIn {
    Random,
    SharedPrefix,
}

/// Which runs `--instances` adds beside one instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StoreRuns {
    With,
    Without,
    Both,
}

/// Flags of `llmlb fleet-sim`.
#[derive(Args, Debug, Clone)]
pub struct SimulateArgs {
    /// A Mooncake-format JSONL trace (timestamp, input_length, output_length,
    /// hash_ids). [default: none; give --trace or --workload]
    #[arg(long, conflicts_with = "workload")]
    pub trace: Option<PathBuf>,
    /// A built-in `llmlb bench` workload instead of a trace (needs --rate).
    /// [default: none]
    #[arg(long, value_enum)]
    pub workload: Option<BuiltIn>,
    /// Built-in workloads: requests per second (required with --workload).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Built-in workloads: requests to send. [default: shared-prefix's
    /// groups × prompts, random 1000]
    #[arg(long, alias = "num-requests")]
    pub requests: Option<usize>,
    /// random: prompt tokens, `N` or `MIN..MAX`.
    #[arg(long, default_value = "1024")]
    pub input_len: LenRange,
    /// random, shared-prefix: output tokens (`N` or `MIN..MAX`; shared-prefix
    /// takes MIN). [default: random 128, shared-prefix 256]
    #[arg(long)]
    pub output_len: Option<LenRange>,
    /// shared-prefix: groups sharing one system prompt.
    #[arg(long, default_value_t = 64)]
    pub groups: usize,
    /// shared-prefix: prompts per group.
    #[arg(long, default_value_t = 16)]
    pub prompts_per_group: usize,
    /// shared-prefix: system prompt tokens.
    #[arg(long, default_value_t = 2048)]
    pub system_len: usize,
    /// shared-prefix: question tokens.
    #[arg(long, default_value_t = 128)]
    pub question_len: usize,
    /// Trace: replay only the first N requests. [default: all]
    #[arg(long)]
    pub max_requests: Option<usize>,
    /// Trace: multiply block size, prompt and output lengths.
    #[arg(long, default_value_t = 1.0)]
    pub length_scale: f64,
    /// Trace: prompts as the token ids of the text `llmlb bench` sends for
    /// them, so `hash` and `cache` rank replicas as `serve` does behind
    /// `bench` (slower per prompt token).
    #[arg(long, requires = "trace")]
    pub bench_text: bool,
    /// Multiply the arrival rate (2 = the same requests in half the time).
    #[arg(long, default_value_t = 1.0)]
    pub rate_scale: f64,
    /// Replicas in the generated fleet (or the --config pool, resized).
    /// [default: the config pool's, or 4]
    #[arg(long)]
    pub replicas: Option<usize>,
    /// Prefill replicas: the generated pool becomes disaggregated (its
    /// replicas decode; long prompts are prefilled on a second pool of this
    /// many), or the --config pool's prefill pool is resized to this many.
    /// [default: none, or the config's]
    #[arg(long)]
    pub prefill_replicas: Option<usize>,
    /// Which requests a disaggregated pool prefills on its prefill pool:
    /// auto (decided per request), always, never. [default: auto, or the
    /// config's]
    #[arg(long, value_parser = parse_when)]
    pub disaggregate: Option<DisaggregateWhen>,
    /// KV-cache bytes per token moved from a prefill to a decode replica.
    /// [default: the profile's `[disaggregation]`, 131072]
    #[arg(long)]
    pub kv_bytes_per_token: Option<f64>,
    /// Bytes per second between a prefill and a decode replica. [default:
    /// the profile's, 25e9]
    #[arg(long)]
    pub transfer_bandwidth: Option<f64>,
    /// Time every KV transfer takes besides its bytes, e.g. `2ms`.
    /// [default: the profile's, 2ms]
    #[arg(long, value_parser = humantime::parse_duration)]
    pub transfer_latency: Option<Duration>,
    /// Engine profile of every replica: a built-in name (fast, h100-8b,
    /// vllm-cpu-tiny) or a profile file (as `llmlb replica-sim --config`
    /// reads it).
    #[arg(long, default_value = "h100-8b")]
    pub profile: String,
    /// Override the profile's context length (e.g. 131072 for a 128k model).
    /// [default: the profile's]
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Override the profile's KV-cache blocks per replica (a smaller GPU, or
    /// a larger model). [default: the profile's]
    #[arg(long)]
    pub num_blocks: Option<usize>,
    /// Override the profile's most sequences batched at once per replica
    /// (vLLM's `--max-num-seqs`). [default: the profile's]
    #[arg(long)]
    pub max_num_seqs: Option<usize>,
    /// Comma-separated: round_robin, least_connections, least_tokens, jsq,
    /// kv_aware, p2c, hash, cache, exact (prefix affinity; exact reads the
    /// engines' KV events), config (the file as is).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "round_robin,least_connections,jsq,hash,cache"
    )]
    pub policies: Vec<String>,
    /// An llmlb config: its pool serving --model is simulated (scrape,
    /// health, timeouts, prefix settings as written). [default: one
    /// generated pool]
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Model name of the requests. [default: the config's first, or the
    /// profile's]
    #[arg(long)]
    pub model: Option<String>,
    /// Priority tiers of the traffic and their relative weights, e.g.
    /// `paid=0.2,free=0.8`: names of the config's `[[tiers]]`, or of its
    /// `[[priorities]]` levels (by default `high` and `low`). Each arrival
    /// draws its tier from the seeded generator. [default: none]
    #[arg(long)]
    pub tiers: Option<TierMix>,
    /// Tenants of the traffic, their shares of the arrivals and optionally
    /// their fair-share weights, e.g. `chat=0.1@2,batch=0.9` (weights
    /// default to the config's `[[tenants]]`, else 1), or closed loops:
    /// `light=streams:1,batch=streams:12`. Each arrival draws its tenant
    /// from the seeded generator; the pool queue shares each priority level
    /// among them as `serve` does. [default: none]
    #[arg(long)]
    pub tenants: Option<TenantMix>,
    /// Goodput counts requests whose TTFT is at most this.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2s")]
    pub goodput_ttft: Duration,
    /// Goodput also asks each request's mean inter-token gap (TPOT) to be
    /// at most this, e.g. `20ms` (0: TTFT alone).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub goodput_tpot: Duration,
    /// Fixed client-side time added to every response (network, proxy,
    /// replica HTTP front), e.g. `15ms`, half on the way to the engine and
    /// half on the way back (the request counts in flight for both): TTFT
    /// and end-to-end grow by it.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub network_delay: Duration,
    /// When the second scrape of every replica comes, e.g. `40ms` (the
    /// first is at 0, before any arrival; default: one scrape interval).
    /// Reproduces a real run whose scrapes fell at that phase against its
    /// traffic.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub scrape_phase: Duration,
    /// Mean lateness of each arrival, e.g. `3ms`: every request arrives
    /// later by a seeded draw with this mean (its spread:
    /// --arrival-jitter-sd), as a real client's
    /// sends come late by a little and differently each run. With it, runs
    /// under different --seed values are draws of that spread. 0: on time.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub arrival_jitter: Duration,
    /// The lateness's standard deviation (at most --arrival-jitter): a
    /// constant part plus an exponential one. Default: --arrival-jitter
    /// (an exponential). Measured on a real client it is often smaller.
    /// [default: --arrival-jitter]
    #[arg(long, value_parser = humantime::parse_duration)]
    pub arrival_jitter_sd: Option<Duration>,
    /// A fault on the virtual clock (repeatable), e.g. `kill:replica=3,at=60s`,
    /// `slow:replica=3,at=60s,factor=3`, `hang:replica=1,at=5m`,
    /// `zone:replicas=0-63,at=10m`. [default: none]
    #[arg(long = "fault")]
    pub faults: Vec<Fault>,
    /// Search the smallest fleet meeting --objective, per policy.
    #[arg(long, requires = "objective")]
    pub find_replicas: bool,
    /// What --find-replicas must meet, e.g. `p99_ttft=2s` or
    /// `p99_ttft=2s,p99_itl=100ms`. [default: none]
    #[arg(long)]
    pub objective: Option<Objective>,
    /// Largest fleet --find-replicas tries.
    #[arg(long, default_value_t = 4096)]
    pub max_replicas: usize,
    /// llmlb instances in front of the fleet, each request to the next in
    /// turn (as a Kubernetes Service spreads them): every policy also runs
    /// with N instances without a store (each its own in-flight counts,
    /// queue and prefix view) and with a `[fleet]` store (leases of each
    /// replica's `max_inflight`, one prefix view), beside one instance.
    #[arg(long, default_value_t = 1)]
    pub instances: usize,
    /// With --instances: the runs with a store, without, or both.
    #[arg(long, value_enum, default_value = "both")]
    pub fleet_store: StoreRuns,
    /// With --instances: the store's lease refresh (`[fleet] refresh`).
    /// [default: the config's, or 50ms]
    #[arg(long, value_parser = humantime::parse_duration)]
    pub fleet_refresh: Option<Duration>,
    /// Policies simulated at once. [default: the machine's cores]
    #[arg(long)]
    pub jobs: Option<usize>,
    /// Seed of the workload, the arrivals and the replicas.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Write every figure as JSON. [default: none]
    #[arg(long, alias = "json")]
    pub out: Option<PathBuf>,
    /// Write one CSV line per request and run (policy, request, prompt and
    /// output tokens, TTFT in seconds or empty when no token came).
    /// [default: none]
    #[arg(long)]
    pub requests_out: Option<PathBuf>,
    /// Write TTFT and end-to-end CDFs as SVG. [default: none]
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

/// What `--out` holds.
#[derive(Debug, Serialize)]
pub struct Output {
    pub workload: String,
    pub requests: usize,
    pub profile: String,
    pub runs: Vec<RunResult>,
    /// `--find-replicas`: every probe per policy, (replicas, met).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub probes: Vec<(String, Vec<(usize, bool)>)>,
    /// `--find-replicas` of a disaggregated pool: every split tried per
    /// policy, ((prefill, decode), met).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub split_probes: Vec<(String, Vec<(search::Split, bool)>)>,
}

fn parse_when(s: &str) -> Result<DisaggregateWhen, String> {
    match s {
        "auto" => Ok(DisaggregateWhen::Auto),
        "always" => Ok(DisaggregateWhen::Always),
        "never" => Ok(DisaggregateWhen::Never),
        _ => Err(format!("{s:?}: expected auto, always or never")),
    }
}

/// Runs the command; returns the table text to print.
pub fn execute(args: &SimulateArgs) -> Result<String, SimulateError> {
    let mut profile = super::fleet::profile(&args.profile)?;
    if let Some(blocks) = args.num_blocks {
        profile.engine.num_blocks = blocks;
    }
    if let Some(len) = args.max_model_len {
        profile.engine.max_model_len = len;
    }
    if let Some(seqs) = args.max_num_seqs {
        profile.engine.max_num_seqs = seqs;
    }
    let link = &mut profile.disaggregation;
    if let Some(b) = args.kv_bytes_per_token {
        link.kv_bytes_per_token = b;
    }
    if let Some(b) = args.transfer_bandwidth {
        link.transfer_bandwidth = b;
    }
    if let Some(l) = args.transfer_latency {
        link.transfer_latency = l.as_secs_f64();
    }
    link.validate()
        .map_err(|e| SimulateError::Invalid(format!("--kv-bytes-per-token / --transfer-*: {e}")))?;
    if args.prefill_replicas == Some(0) {
        return Err(SimulateError::Invalid(
            "--prefill-replicas: at least 1 (leave it out for an aggregated fleet)".into(),
        ));
    }
    if args.num_blocks.is_some() || args.max_model_len.is_some() || args.max_num_seqs.is_some() {
        profile.engine.validate().map_err(|e| {
            SimulateError::Invalid(format!(
                "--num-blocks / --max-model-len / --max-num-seqs: {e}"
            ))
        })?;
    }
    let policies = args
        .policies
        .iter()
        .map(|p| p.trim().parse::<Policy>().map_err(SimulateError::Invalid))
        .collect::<Result<Vec<_>, _>>()?;
    let base: Option<Config> = match &args.config {
        Some(path) => Some(crate::config::load(path).map_err(|e| {
            SimulateError::Config {
                file: path.display().to_string(),
                issues: e
                    .issues
                    .iter()
                    .map(|i| format!("{}: {}", i.key, i.reason))
                    .collect::<Vec<_>>()
                    .join("; "),
            }
        })?),
        None => None,
    };
    let model = match (&args.model, &base) {
        (Some(m), _) => m.clone(),
        (None, Some(c)) => c
            .pools
            .first()
            .and_then(|p| p.models.first())
            .cloned()
            .ok_or_else(|| SimulateError::Invalid("the config has no pool with a model".into()))?,
        (None, None) => profile.model.clone(),
    };
    let workload = load_workload(args)?;
    // A fleet of `n` replicas (the pool's own; `None`: as given), and of
    // `p` prefill replicas when the pool is disaggregated.
    let split_fleet = |n: Option<usize>, p: Option<usize>| -> Result<Config, SimulateError> {
        let p = p.or(args.prefill_replicas);
        let when = args.disaggregate.unwrap_or_default();
        let mut c = match (&base, n, p) {
            (Some(c), Some(n), _) => decide::resized(c, &model, n)?,
            (Some(c), None, _) => c.clone(),
            (None, n, Some(p)) => decide::generated_disaggregated(&model, n.unwrap_or(4), p, when)?,
            (None, n, None) => decide::generated_config(&model, n.unwrap_or(4))?,
        };
        if let (Some(_), Some(p)) = (&base, p) {
            c = decide::resized_prefill(&c, &model, p)?;
        }
        if let Some(w) = args.disaggregate {
            c = decide::with_when(&c, &model, w);
        }
        Ok(c)
    };
    let fleet = |n: Option<usize>| split_fleet(n, None);
    let tiers = match &args.tiers {
        Some(mix) => {
            let config = fleet(args.replicas)?;
            let pool = decide::Decider::new(&config, &model, args.seed)?
                .pool()
                .name
                .clone();
            let n = workload.requests.len();
            Some(Tiers::draw(mix, &config, &pool, n, args.seed)?)
        }
        None => None,
    };
    let tenants =
        (args.tenants.as_ref()).map(|mix| Tenants::draw(mix, workload.requests.len(), args.seed));
    let variants = instance_variants(args, base.as_ref())?;
    let items: Vec<(Policy, Instances)> = (policies.iter())
        .flat_map(|p| variants.iter().map(move |v| (*p, *v)))
        .collect();
    let spec_for =
        |config: &Config, item: &(Policy, Instances)| -> Result<RunResult, SimulateError> {
            let (policy, instances) = item;
            let applied = policy.apply(config);
            let spec = RunSpec {
                workload: &workload,
                config: &applied,
                model: &model,
                profile: &profile,
                faults: &args.faults,
                goodput_ttft: args.goodput_ttft.as_secs_f64(),
                goodput_tpot: args.goodput_tpot.as_secs_f64(),
                seed: args.seed,
                network_delay: args.network_delay.as_secs_f64(),
                scrape_phase: args.scrape_phase.as_secs_f64(),
                tiers: tiers.as_ref(),
                tenants: tenants.as_ref(),
                instances: *instances,
            };
            run(&spec, &policy.name())
        };
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, items.len().max(1));
    let mut probes = Vec::new();
    let mut split_probes = Vec::new();
    let disaggregated = decide::is_disaggregated(&fleet(None)?, &model);
    let runs: Vec<RunResult> = if args.find_replicas {
        let objective = args.objective.as_ref().expect("clap requires --objective");
        let start = args.replicas.unwrap_or(4);
        // A disaggregated pool: the aggregated answer (the same pool
        // without its prefill pool) beside the split's.
        let found = parallel(&items, jobs, |item| {
            search::find(objective, start, args.max_replicas, |n| {
                let c = fleet(Some(n))?;
                spec_for(&decide::aggregated(&c, &model), item)
            })
        });
        let mut runs = Vec::new();
        for ((policy, instances), r) in items.iter().zip(found) {
            let (run, p) = r?;
            probes.push((format!("{}{}", policy.name(), instances.label()), p));
            runs.push(run);
        }
        if disaggregated {
            let found = parallel(&policies, jobs, |policy| {
                search::find_split(objective, start, args.max_replicas, |p, d| {
                    spec_for(
                        &split_fleet(Some(d), Some(p))?,
                        &(*policy, Instances::one()),
                    )
                })
            });
            for (policy, r) in policies.iter().zip(found) {
                let (run, p) = r?;
                split_probes.push((policy.name(), p));
                runs.push(run);
            }
        }
        runs
    } else {
        let config = fleet(args.replicas)?;
        parallel(&items, jobs, |item| spec_for(&config, item))
            .into_iter()
            .collect::<Result<_, _>>()?
    };
    let mut text = format!(
        "{} requests from {}, profile {}\n",
        workload.requests.len(),
        workload.name,
        args.profile
    );
    text.push_str(&report::table(&runs));
    text.push_str(&report::peaks_table(&runs));
    text.push_str(&super::split_report::table(&runs));
    text.push_str(&super::tier_report::table(&runs));
    text.push_str(&super::tenant_report::table(&runs));
    for (policy, p) in &probes {
        let list: Vec<String> = p
            .iter()
            .map(|(n, ok)| format!("{n}{}", if *ok { "✓" } else { "✗" }))
            .collect();
        text.push_str(&format!("{policy}: tried {}\n", list.join(" ")));
    }
    for (policy, p) in &split_probes {
        let list: Vec<String> = p
            .iter()
            .map(|((pre, dec), ok)| format!("{pre}P{dec}D{}", if *ok { "✓" } else { "✗" }))
            .collect();
        text.push_str(&format!("{policy} split: tried {}\n", list.join(" ")));
    }
    let events: u64 = runs.iter().map(|r| r.events).sum();
    let wall: f64 = runs.iter().map(|r| r.wall_s).sum();
    text.push_str(&format!(
        "simulated {events} events in {wall:.1} s of thread time ({:.0} ns per event)\n",
        wall * 1e9 / events.max(1) as f64
    ));
    if let Some(path) = &args.requests_out {
        write_requests(path, &workload, &runs)?;
    }
    if let Some(path) = &args.svg {
        report::write_svg(path, &runs)?;
    }
    if let Some(path) = &args.out {
        let out = Output {
            workload: workload.name.clone(),
            requests: workload.requests.len(),
            profile: args.profile.clone(),
            runs,
            probes,
            split_probes,
        };
        report::write_json(path, &out)?;
    }
    Ok(text)
}

/// One instance, and with `--instances N` the runs of N instances without
/// and with a store.
fn instance_variants(
    args: &SimulateArgs,
    config: Option<&Config>,
) -> Result<Vec<Instances>, SimulateError> {
    if args.instances == 0 || args.instances > usize::from(u16::MAX) {
        return Err(SimulateError::Invalid(
            "--instances: from 1 to 65535".into(),
        ));
    }
    let one = Instances::one();
    if args.instances == 1 {
        return Ok(vec![one]);
    }
    let refresh = (args.fleet_refresh)
        .or_else(|| config.and_then(|c| c.fleet.as_ref()).map(|f| f.refresh))
        .unwrap_or(one.refresh);
    if refresh.is_zero() {
        return Err(SimulateError::Invalid("--fleet-refresh: above 0".into()));
    }
    let n = |store| Instances {
        count: args.instances,
        store,
        refresh,
    };
    Ok(match args.fleet_store {
        StoreRuns::With => vec![one, n(true)],
        StoreRuns::Without => vec![one, n(false)],
        StoreRuns::Both => vec![one, n(false), n(true)],
    })
}

/// `--requests-out`: each run's requests as CSV lines, with the replica
/// (its index in the fleet) each was sent to last, the prompt tokens llmlb
/// predicted it holds there (empty outside the prefix modes), those it
/// found cached (empty when it did not finish) and the time to first token
/// the cost model expected there (`cache` and `exact` modes).
fn write_requests(
    path: &std::path::Path,
    workload: &SimWorkload,
    runs: &[RunResult],
) -> Result<(), SimulateError> {
    use std::fmt::Write as _;
    let mut text = String::from(
        "policy,request,prompt_tokens,output_tokens,ttft_s,replica,predicted_cached,cached,predicted_ttft_s\n",
    );
    let opt = |v: Option<u64>| v.map_or(String::new(), |v| v.to_string());
    let secs = |v: Option<f64>| v.map_or(String::new(), |t| format!("{t:.6}"));
    for r in runs {
        let rows = workload.requests.iter().zip(&r.per_request);
        for (k, (q, &(ttft, replica))) in rows.enumerate() {
            let (predicted, cached) = r.per_request_cache.get(k).copied().unwrap_or_default();
            let expected = r.per_request_predicted_ttft.get(k).copied().flatten();
            let _ = writeln!(
                text,
                "{},{k},{},{},{},{replica},{},{},{}",
                r.policy,
                q.input,
                q.output,
                secs(ttft),
                opt(predicted),
                opt(cached.map(u64::from)),
                secs(expected)
            );
        }
    }
    std::fs::write(path, text).map_err(|e| SimulateError::Io {
        path: path.display().to_string(),
        reason: e.to_string(),
    })
}

fn load_workload(args: &SimulateArgs) -> Result<SimWorkload, SimulateError> {
    let w = unjittered_workload(args)?;
    let mean = args.arrival_jitter.as_secs_f64();
    let sd = args.arrival_jitter_sd.map_or(mean, |d| d.as_secs_f64());
    Ok(w.with_arrival_jitter(mean, sd, args.seed))
}

fn unjittered_workload(args: &SimulateArgs) -> Result<SimWorkload, SimulateError> {
    if let Some(path) = &args.trace {
        let w = SimWorkload::trace(path, args.length_scale, args.rate_scale, args.max_requests)?;
        return Ok(if args.bench_text {
            w.with_bench_text()
        } else {
            w
        });
    }
    let Some(kind) = args.workload else {
        return Err(SimulateError::Invalid(
            "give --trace FILE or --workload random|shared-prefix".into(),
        ));
    };
    let rate = args
        .rate
        .ok_or_else(|| SimulateError::Invalid("--workload needs --rate".into()))?;
    let (spec, size) = match kind {
        BuiltIn::Random => (
            WorkloadSpec::Random(RandomOptions {
                input_len: args.input_len,
                output_len: args.output_len.unwrap_or(LenRange::fixed(128)),
            }),
            1000,
        ),
        BuiltIn::SharedPrefix => {
            let o = SharedPrefixOptions {
                groups: args.groups,
                prompts_per_group: args.prompts_per_group,
                system_len: args.system_len,
                question_len: args.question_len,
                output_len: args.output_len.map_or(256, |r| r.min),
            };
            let size = o.groups * o.prompts_per_group;
            (WorkloadSpec::SharedPrefix(o), size)
        }
    };
    SimWorkload::builtin(
        &spec,
        args.requests.unwrap_or(size),
        rate,
        args.rate_scale,
        args.seed,
    )
}

/// `f` over `items` on up to `jobs` threads, results in order.
fn parallel<T: Sync, R: Send>(items: &[T], jobs: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    if jobs <= 1 {
        return items.iter().map(&f).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let slots: Vec<std::sync::Mutex<Option<R>>> =
        items.iter().map(|_| Default::default()).collect();
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(item) = items.get(i) else { break };
                    let r = f(item);
                    *slots[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                }
            });
        }
    });
    slots
        .into_iter()
        .map(|m| {
            m.into_inner()
                .unwrap_or_else(|p| p.into_inner())
                .expect("every item ran")
        })
        .collect()
}

//! `llmlb replica-sim`: one or more simulated replicas in one process.
//!
//! The config of a replica is resolved in three layers: the named profile
//! (`--profile`, or the `profile` key of the `--config` file), then the
//! `--config` TOML file, then individual flags. Replica `i` listens on
//! `port + i` and uses seed `seed + i`.

use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use super::SimHandle;
use super::config::{ConfigError, SimConfig};

#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Port of the first replica; replica i listens on PORT+i.
    #[arg(long, default_value_t = 8001)]
    pub port: u16,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Number of replicas to run.
    #[arg(long, default_value_t = 1)]
    pub replicas: u16,
    /// Engine profile: a built-in name (fast, h100-8b, vllm-cpu-tiny) or a
    /// profile file. Every flag below left unset takes the profile's value.
    /// [default: the --config file's `profile`, else h100-8b]
    #[arg(long)]
    pub profile: Option<String>,
    /// TOML file overriding the profile (docs/SIMULATOR.md). [default: none]
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Model name served, as vLLM's `--served-model-name`: a proxy's pool
    /// `models` must list it. [default: the profile's; h100-8b serves
    /// meta-llama/Llama-3.1-8B-Instruct]
    #[arg(long)]
    pub model: Option<String>,
    /// Simulated seconds per real second. [default: the profile's, 1]
    #[arg(long)]
    pub time_scale: Option<f64>,
    /// Seed of replica 0 (replica i adds i). [default: the profile's, 0]
    #[arg(long)]
    pub seed: Option<u64>,
    /// Output tokens when a request does not say. [default: the profile's]
    #[arg(long)]
    pub default_max_tokens: Option<usize>,
    /// Simulated time before /health answers 200, e.g. `30s`. [default: 0s]
    #[arg(long, value_parser = humantime::parse_duration)]
    pub startup_delay: Option<std::time::Duration>,
    /// Model directory (tokenizer.json, chat template) to count prompt
    /// tokens with, as the model's vLLM does. [default: a stand-in that
    /// counts about 4 characters per token]
    #[arg(long, value_name = "DIR")]
    pub tokenizer: Option<PathBuf>,
    /// Tokens per KV-cache block (vLLM's `--block-size`). [default: the
    /// profile's]
    #[arg(long)]
    pub block_size: Option<usize>,
    /// KV-cache blocks per replica (the cache's size). [default: the
    /// profile's]
    #[arg(long)]
    pub num_blocks: Option<usize>,
    /// Most sequences batched at once (vLLM's `--max-num-seqs`). [default:
    /// the profile's]
    #[arg(long)]
    pub max_num_seqs: Option<usize>,
    /// Most tokens in one step (vLLM's `--max-num-batched-tokens`).
    /// [default: the profile's]
    #[arg(long)]
    pub max_num_batched_tokens: Option<usize>,
    /// Longest prompt plus output, in tokens (vLLM's `--max-model-len`).
    /// [default: the profile's]
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Turn prefix caching on or off. [default: the profile's, true]
    #[arg(long)]
    pub enable_prefix_caching: Option<bool>,
    /// Serve lower `priority` values first.
    #[arg(long)]
    pub priority_scheduling: bool,
    /// Step cost: fixed seconds per step. [default: the profile's]
    #[arg(long, value_name = "SECONDS")]
    pub step_overhead: Option<f64>,
    /// Step cost: extra seconds for a step that prefills. [default: the profile's]
    #[arg(long, value_name = "SECONDS")]
    pub prefill_overhead: Option<f64>,
    /// Step cost: seconds per uncached prompt token. [default: the profile's]
    #[arg(long, value_name = "SECONDS")]
    pub prefill_per_token: Option<f64>,
    /// Step cost: seconds per decoding sequence. [default: the profile's]
    #[arg(long, value_name = "SECONDS")]
    pub decode_per_seq: Option<f64>,
    /// Step cost: seconds per context token attended. [default: the profile's]
    #[arg(long, value_name = "SECONDS")]
    pub per_context_token: Option<f64>,
    /// Step cost: seconds per query-key pair of prefilled tokens (quadratic
    /// attention). [default: the profile's]
    #[arg(long, value_name = "SECONDS")]
    pub prefill_attention: Option<f64>,
    /// Step cost: API-server seconds per request, on the step that admits
    /// it. [default: the profile's]
    #[arg(long, value_name = "SECONDS")]
    pub api_per_request: Option<f64>,
    /// Step cost: API-server seconds per output token. [default: the profile's]
    #[arg(long, value_name = "SECONDS")]
    pub api_per_output_token: Option<f64>,
    /// Fraction of inference requests answered with a 500. [default: 0]
    #[arg(long)]
    pub error_rate: Option<f64>,
    /// Accept requests and never answer.
    #[arg(long)]
    pub hang: bool,
    /// Multiply step times by this factor. [default: 1]
    #[arg(long)]
    pub slowdown: Option<f64>,
    /// Answer 503 while this many requests wait in the engine queue.
    /// [default: no bound]
    #[arg(long)]
    pub max_waiting: Option<usize>,
    /// Publish KV-cache events as vLLM does (ZMQ PUB, topic `kv`): replica i
    /// on port P+i (0: any free port). [default: off]
    #[arg(long, value_name = "P")]
    pub kv_events_port: Option<u16>,
    /// Serve KV-event replay (ZMQ ROUTER) on port R+i; needs
    /// --kv-events-port. [default: off]
    #[arg(long, value_name = "R")]
    pub kv_events_replay_port: Option<u16>,
    /// Prefill/decode disaggregation: the side this replica plays in vLLM's
    /// KV-transfer protocol (both: either). [default: the --config file's,
    /// else both]
    #[arg(long, value_enum)]
    pub role: Option<super::Role>,
    /// KV-cache bytes per token, for the transfer time to a decode replica.
    /// [default: the --config file's, else 131072]
    #[arg(long, value_name = "BYTES")]
    pub kv_bytes_per_token: Option<f64>,
    /// Bytes per second from a prefill to a decode replica. [default: the
    /// --config file's, else 25e9]
    #[arg(long, value_name = "BYTES_PER_SECOND")]
    pub transfer_bandwidth: Option<f64>,
    /// Fixed seconds of every KV transfer. [default: the --config file's,
    /// else 0.002]
    #[arg(long, value_name = "SECONDS")]
    pub transfer_latency: Option<f64>,
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("--replicas must be at least 1")]
    NoReplicas,
    #[error("ports {first}..{first}+{n} do not fit below 65536")]
    Ports { first: u16, n: u16 },
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("--kv-events-replay-port needs --kv-events-port")]
    ReplayWithoutEvents,
    #[error("KV events: {0}")]
    KvEvents(#[from] crate::kv_events::publisher::PublishError),
}

/// The config of replica 0 from the three layers (replica `i` adds `i` to the seed).
pub fn resolve(args: &SimArgs) -> Result<SimConfig, ConfigError> {
    let profile = args.profile.as_deref().unwrap_or("h100-8b");
    let mut c = match &args.config {
        Some(path) => SimConfig::from_toml_file(path, profile)?,
        None => SimConfig::named_or_file(profile)?,
    };
    fn set<T: Clone>(dst: &mut T, v: &Option<T>) {
        if let Some(v) = v {
            *dst = v.clone();
        }
    }
    set(&mut c.model, &args.model);
    set(&mut c.time_scale, &args.time_scale);
    set(&mut c.seed, &args.seed);
    set(&mut c.default_max_tokens, &args.default_max_tokens);
    set(
        &mut c.startup_delay,
        &args.startup_delay.map(|d| d.as_secs_f64()),
    );
    if args.tokenizer.is_some() {
        c.tokenizer_dir = args.tokenizer.clone();
    }
    let e = &mut c.engine;
    set(&mut e.block_size, &args.block_size);
    set(&mut e.num_blocks, &args.num_blocks);
    set(&mut e.max_num_seqs, &args.max_num_seqs);
    set(&mut e.max_num_batched_tokens, &args.max_num_batched_tokens);
    set(&mut e.max_model_len, &args.max_model_len);
    set(&mut e.enable_prefix_caching, &args.enable_prefix_caching);
    e.priority_scheduling |= args.priority_scheduling;
    let k = &mut c.cost;
    set(&mut k.step_overhead, &args.step_overhead);
    set(&mut k.prefill_overhead, &args.prefill_overhead);
    set(&mut k.prefill_per_token, &args.prefill_per_token);
    set(&mut k.decode_per_seq, &args.decode_per_seq);
    set(&mut k.per_context_token, &args.per_context_token);
    set(&mut k.prefill_attention, &args.prefill_attention);
    set(&mut k.api_per_request, &args.api_per_request);
    set(&mut k.api_per_output_token, &args.api_per_output_token);
    let f = &mut c.faults;
    set(&mut f.error_rate, &args.error_rate);
    f.hang |= args.hang;
    set(&mut f.slowdown, &args.slowdown);
    if args.max_waiting.is_some() {
        f.max_waiting = args.max_waiting;
    }
    let d = &mut c.disaggregation;
    set(&mut d.role, &args.role);
    set(&mut d.kv_bytes_per_token, &args.kv_bytes_per_token);
    set(&mut d.transfer_bandwidth, &args.transfer_bandwidth);
    set(&mut d.transfer_latency, &args.transfer_latency);
    c.validate().map_err(ConfigError::Invalid)?;
    Ok(c)
}

/// Starts the replicas `args` describe on the current runtime. Replica `i`
/// listens on `port + i` (every replica on a free port when `port` is 0) with
/// seed `seed + i`. On a bind failure, the replicas already started are
/// stopped again.
pub async fn start(args: &SimArgs) -> Result<Vec<SimHandle>, CliError> {
    let base = resolve(args)?;
    if args.replicas == 0 {
        return Err(CliError::NoReplicas);
    }
    let ports = [
        Some(args.port),
        args.kv_events_port,
        args.kv_events_replay_port,
    ];
    for first in ports.into_iter().flatten() {
        if u32::from(first) + u32::from(args.replicas) - 1 > u32::from(u16::MAX) {
            return Err(CliError::Ports {
                first,
                n: args.replicas,
            });
        }
    }
    if args.kv_events_replay_port.is_some() && args.kv_events_port.is_none() {
        return Err(CliError::ReplayWithoutEvents);
    }
    let nth = |first: u16, i: u16| if first == 0 { 0 } else { first + i };
    let mut handles: Vec<SimHandle> = Vec::with_capacity(args.replicas.into());
    for i in 0..args.replicas {
        let addr = SocketAddr::new(args.host, nth(args.port, i));
        let listener = match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => l,
            Err(source) => {
                for h in handles {
                    h.shutdown().await;
                }
                return Err(CliError::Bind { addr, source });
            }
        };
        let mut cfg = base.clone();
        cfg.seed = base.seed.wrapping_add(u64::from(i));
        let handle = match args.kv_events_port {
            None => super::spawn(listener, cfg),
            Some(p) => {
                let kv = super::KvEventsAddrs {
                    events: SocketAddr::new(args.host, nth(p, i)),
                    replay: args
                        .kv_events_replay_port
                        .map(|r| SocketAddr::new(args.host, nth(r, i))),
                };
                match super::spawn_with_kv_events(listener, cfg, kv).await {
                    Ok(h) => h,
                    Err(e) => {
                        for h in handles {
                            h.shutdown().await;
                        }
                        return Err(e.into());
                    }
                }
            }
        };
        handles.push(handle);
    }
    Ok(handles)
}

/// Runs the replicas until `stop` completes, then shuts them down.
pub async fn run(args: SimArgs, stop: impl Future<Output = ()>) -> Result<(), CliError> {
    let handles = start(&args).await?;
    for h in &handles {
        let c = h.config();
        println!(
            "llmlb replica-sim: replica http://{} model {:?} (blocks {} x {}, max_num_seqs {}, time scale {})",
            h.addr,
            c.model,
            c.engine.num_blocks,
            c.engine.block_size,
            c.engine.max_num_seqs,
            c.time_scale
        );
        if let Some(kv) = h.kv_events {
            let replay = h
                .kv_replay
                .map_or(String::new(), |r| format!(", replay tcp://{r}"));
            println!("llmlb replica-sim:   KV events tcp://{kv}{replay}");
        }
    }
    stop.await;
    for h in handles {
        h.shutdown().await;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        sim: SimArgs,
    }

    fn args(line: &[&str]) -> SimArgs {
        Wrap::parse_from(std::iter::once("sim").chain(line.iter().copied())).sim
    }

    #[test]
    fn flags_override_the_profile() {
        let c = resolve(&args(&[
            "--profile",
            "fast",
            "--model",
            "x",
            "--num-blocks",
            "64",
            "--max-model-len",
            "1000",
            "--max-waiting",
            "5",
            "--step-overhead",
            "0.5",
            "--priority-scheduling",
        ]))
        .unwrap();
        assert_eq!(c.model, "x");
        assert_eq!(c.engine.num_blocks, 64);
        assert!(c.engine.priority_scheduling);
        assert_eq!(c.cost.step_overhead, 0.5);
        assert_eq!(c.faults.max_waiting, Some(5));
        assert_eq!(c.engine.block_size, 16);
    }

    #[tokio::test]
    async fn start_runs_several_replicas_with_their_own_seeds() {
        let handles = start(&args(&[
            "--profile",
            "fast",
            "--port",
            "0",
            "--replicas",
            "3",
            "--seed",
            "40",
        ]))
        .await
        .unwrap();
        assert_eq!(handles.len(), 3);
        let seeds: Vec<u64> = handles.iter().map(|h| h.config().seed).collect();
        assert_eq!(seeds, vec![40, 41, 42]);
        let mut ports: Vec<u16> = handles.iter().map(|h| h.addr.port()).collect();
        ports.dedup();
        assert_eq!(ports.len(), 3);
        for h in handles {
            h.shutdown().await;
        }
        assert!(matches!(
            start(&args(&["--replicas", "0"])).await,
            Err(CliError::NoReplicas)
        ));
    }

    #[tokio::test]
    async fn kv_events_flags_give_each_replica_its_endpoints() {
        let line = [
            "--profile",
            "fast",
            "--port",
            "0",
            "--replicas",
            "2",
            "--kv-events-port",
            "0",
            "--kv-events-replay-port",
            "0",
        ];
        let handles = start(&args(&line)).await.unwrap();
        let events: Vec<_> = handles.iter().map(|h| h.kv_events.unwrap()).collect();
        assert_ne!(events[0], events[1]);
        assert!(handles.iter().all(|h| h.kv_replay.is_some()));
        for h in handles {
            h.shutdown().await;
        }
        assert!(matches!(
            start(&args(&["--kv-events-replay-port", "7000"])).await,
            Err(CliError::ReplayWithoutEvents)
        ));
    }

    #[test]
    fn default_profile_is_h100_and_bad_values_fail() {
        assert_eq!(
            resolve(&args(&[])).unwrap(),
            SimConfig::profile("h100-8b").unwrap()
        );
        assert!(resolve(&args(&["--profile", "nope"])).is_err());
        assert!(resolve(&args(&["--time-scale=-1"])).is_err());
    }
}

//! Named sets of engine and cost constants. `docs/SIMULATOR.md` explains
//! where each number comes from.
//!
//! - `fast`: tiny step times and a small cache, for tests and quick demos;
//! - `h100-8b`: an 8B-parameter model (Llama-3.1-8B class, bf16) on one
//!   H100 80GB, from the public figures gathered in the project reference;
//! - `vllm-cpu-tiny`: the tiny random-weight Llama served by vLLM's CPU
//!   backend on a 2-core machine, with the block size (128), cache size
//!   (32 blocks) and batch limits of that setup and step times measured on it.
//!   Give it the model's tokenizer (`--tokenizer`, or `tokenizer_dir` in a
//!   config file; `../shared/tokenizers/tiny-llama` holds that model's files)
//!   so prompts count as many tokens as on the real replica.

use super::config::{FaultConfig, SimConfig};
use super::engine::{CostModel, EngineParams};
use super::role::{Role, RoleConfig};

/// Every profile name, for error messages and `--help`.
pub const NAMES: &[&str] = &["fast", "h100-8b", "vllm-cpu-tiny"];

pub fn named(name: &str) -> Option<SimConfig> {
    match name {
        "fast" => Some(fast()),
        "h100-8b" => Some(h100_8b()),
        "vllm-cpu-tiny" => Some(vllm_cpu_tiny()),
        _ => None,
    }
}

fn fast() -> SimConfig {
    SimConfig {
        model: "llmlb-sim".into(),
        time_scale: 1.0,
        seed: 0,
        default_max_tokens: 16,
        startup_delay: 0.0,
        engine: EngineParams {
            block_size: 16,
            num_blocks: 1024,
            max_num_seqs: 32,
            max_num_batched_tokens: 2048,
            max_model_len: 4096,
            enable_prefix_caching: true,
            priority_scheduling: false,
        },
        cost: CostModel {
            step_overhead: 0.002,
            prefill_overhead: 0.001,
            prefill_per_token: 0.000_001,
            decode_per_seq: 0.000_01,
            per_context_token: 0.000_000_01,
            prefill_attention: 0.0,
            api_per_request: 0.0,
            api_per_output_token: 0.0,
        },
        faults: FaultConfig::default(),
        tokenizer_dir: None,
        disaggregation: RoleConfig::default(),
        fitted: None,
    }
}

fn h100_8b() -> SimConfig {
    SimConfig {
        model: "meta-llama/Llama-3.1-8B-Instruct".into(),
        time_scale: 1.0,
        seed: 0,
        default_max_tokens: 256,
        startup_delay: 0.0,
        engine: EngineParams {
            block_size: 16,
            // ~52 GB of KV at 128 KiB per token (32 layers x 8 KV heads x
            // 128 dims x 2 (K, V) x 2 bytes) = ~400k tokens.
            num_blocks: 25_000,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            max_model_len: 32_768,
            enable_prefix_caching: true,
            priority_scheduling: false,
        },
        cost: CostModel {
            // Reading 16 GB of weights at ~3 TB/s (~5 ms) plus scheduling and
            // sampling: inter-token latency ~10 ms at batch 1.
            step_overhead: 0.010,
            prefill_overhead: 0.025,
            // 10k prefill tokens/s when batched.
            prefill_per_token: 0.000_1,
            decode_per_seq: 0.000_05,
            // 128 KiB of KV read per context token at ~3.3 TB/s.
            per_context_token: 0.000_000_04,
            prefill_attention: 0.0,
            api_per_request: 0.0,
            api_per_output_token: 0.0,
        },
        faults: FaultConfig::default(),
        tokenizer_dir: None,
        disaggregation: RoleConfig::default(),
        fitted: None,
    }
}

fn vllm_cpu_tiny() -> SimConfig {
    SimConfig {
        model: "tiny-llama".into(),
        time_scale: 1.0,
        seed: 0,
        default_max_tokens: 16,
        startup_delay: 0.0,
        engine: EngineParams {
            block_size: 128,
            // KV_BYTES 8 MiB = 4,096 tokens = 32 blocks (31 usable).
            num_blocks: 32,
            max_num_seqs: 32,
            max_num_batched_tokens: 2048,
            max_model_len: 2048,
            enable_prefix_caching: true,
            priority_scheduling: false,
        },
        // Fitted to probes against vllm-cpu 0.32.0 on one core of a shared
        // 2-core machine (scripts/sim_fidelity.py --calibrate): vLLM's own
        // time to first token (its /metrics) is 4.2 ms for 16 prompt tokens,
        // 10.7 ms for 512, 32.5 ms for 1536: through 2.46 ms at 0 and the
        // last two, 14.36 us per token plus 6.8 ns per query-key pair
        // (convex, as attention is); client-side inter-token latency medians
        // 1.18 ms at batch 1, 1.68 ms at 16, 2.38 ms at 32. The API server's
        // per-request work (2.5 ms) was chosen to close the throughput gap of
        // an older fidelity run, when the simulator charged it to the steps
        // of a busy engine; `llmlb calibrate` fits it from a burst of
        // requests. Its per-token work is in decode_per_seq, measured
        // client-side.
        cost: CostModel {
            step_overhead: 0.001_12,
            prefill_overhead: 0.001_3,
            prefill_per_token: 0.000_014_3,
            decode_per_seq: 0.000_045,
            per_context_token: 0.000_000_05,
            prefill_attention: 0.000_000_006_8,
            api_per_request: 0.002_5,
            api_per_output_token: 0.0,
        },
        faults: FaultConfig::default(),
        tokenizer_dir: None,
        // The tiny model's KV cache is 2 KiB a token (3 MB for a 1,536-token
        // prefix through vLLM's shared-storage connector); the transfer goes
        // through a file on local disk.
        disaggregation: RoleConfig {
            role: Role::Both,
            kv_bytes_per_token: 2048.0,
            transfer_bandwidth: 1e9,
            transfer_latency: 0.005,
        },
        fitted: None,
    }
}

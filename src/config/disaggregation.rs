//! Config of prefill/decode disaggregation: a pool's role, and the
//! `[pools.disaggregation]` table of a pool whose requests may be
//! prefilled on another pool's replicas.

use std::time::Duration;

use serde::Deserialize;

/// `[[pools]] role`: what a pool's replicas do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolRole {
    /// Serves requests by model name (and decodes the disaggregated ones
    /// when it has a `[pools.disaggregation]` table).
    #[default]
    Serve,
    /// Prefills for the pools that name it in `prefill_pool`; lists no
    /// models and is never routed to by name.
    Prefill,
}

impl PoolRole {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolRole::Serve => "serve",
            PoolRole::Prefill => "prefill",
        }
    }
}

/// `[pools.disaggregation] protocol`: how the prefill and decode replicas
/// are paired.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KvProtocol {
    /// vLLM: prefill with `kv_transfer_params.do_remote_decode`, then decode
    /// with the parameters the prefill answered.
    #[default]
    Vllm,
    /// SGLang: both at once, paired by `bootstrap_host`/`port`/`room`.
    Sglang,
}

impl KvProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            KvProtocol::Vllm => "vllm",
            KvProtocol::Sglang => "sglang",
        }
    }
}

/// `[pools.disaggregation] when`: which requests are disaggregated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DisaggregateWhen {
    /// Per request: when the prompt's uncached tokens on the best decode
    /// replica pay for the transfer (at least `min_uncached_tokens`, and
    /// more while the measured transfer costs more than the decode
    /// replica's own prefill would), or when the decode replicas are busy
    /// prefilling.
    #[default]
    Auto,
    /// Every request.
    Always,
    /// No request (the decode pool serves alone; for comparisons).
    Never,
}

impl DisaggregateWhen {
    pub fn as_str(self) -> &'static str {
        match self {
            DisaggregateWhen::Auto => "auto",
            DisaggregateWhen::Always => "always",
            DisaggregateWhen::Never => "never",
        }
    }
}

/// `[pools.disaggregation]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DisaggregationConfig {
    /// The pool (`role = "prefill"`) whose replicas prefill for this one.
    pub prefill_pool: String,
    #[serde(default)]
    pub protocol: KvProtocol,
    #[serde(default)]
    pub when: DisaggregateWhen,
    /// `auto`: uncached prompt tokens below which a request is never
    /// disaggregated (the floor of the learned threshold).
    #[serde(default = "default_min_uncached_tokens")]
    pub min_uncached_tokens: u64,
    /// `auto`: requests waiting for their first token on the best decode
    /// replica (llmlb's count) at or above which the next request is
    /// disaggregated whatever its size: the decode replica is busy
    /// prefilling (0: off).
    #[serde(default = "default_busy_prefills")]
    pub busy_prefills: u64,
    /// Longest wait for a prefill replica's answer.
    #[serde(default = "default_prefill_timeout", with = "super::duration")]
    pub prefill_timeout: Duration,
    /// Prefill replicas tried for one request before it falls back.
    #[serde(default = "default_prefill_attempts")]
    pub prefill_attempts: u32,
    /// After the prefill attempts failed, the decode replica prefills
    /// itself (`true`), or the client gets the error (`false`).
    #[serde(default = "default_true")]
    pub fallback: bool,
    /// `sglang`: the prefill servers' bootstrap port.
    #[serde(default = "default_bootstrap_port")]
    pub bootstrap_port: u16,
}

fn default_min_uncached_tokens() -> u64 {
    512
}

fn default_busy_prefills() -> u64 {
    4
}

fn default_prefill_timeout() -> Duration {
    Duration::from_secs(30)
}

fn default_prefill_attempts() -> u32 {
    2
}

fn default_true() -> bool {
    true
}

fn default_bootstrap_port() -> u16 {
    8998
}

//! A replica's part in prefill/decode disaggregation (`llmlb replica-sim --role`)
//! and the time a prompt's KV cache takes to reach a decode replica.
//!
//! Roles follow vLLM's `kv_role`: a `prefill` replica (`kv_producer`)
//! prefills requests marked `kv_transfer_params.do_remote_decode` and
//! answers with the parameters that locate their KV cache; a `decode`
//! replica (`kv_consumer`) takes requests marked `do_remote_prefill`,
//! waits for the transfer and then decodes them without prefilling their
//! prompt; `both` (`kv_both`, the default) does either. Every role serves
//! ordinary requests too. A request marked for the side a replica does not
//! play is refused with 400, as a misconfigured pair should be found early.
//!
//! The transfer time of `n` tokens is `latency + n × kv_bytes_per_token ÷
//! bandwidth`, counted over the prompt tokens the decode replica's own
//! prefix cache does not already hold.

use serde::{Deserialize, Serialize};

/// `[disaggregation] role`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    #[default]
    Both,
    Prefill,
    Decode,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Both => "both",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }

    pub fn prefills_for_others(self) -> bool {
        self != Role::Decode
    }

    pub fn decodes_for_others(self) -> bool {
        self != Role::Prefill
    }
}

/// The `[disaggregation]` table of a replica's config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoleConfig {
    pub role: Role,
    /// KV-cache bytes per token (2 × layers × KV heads × head size × bytes
    /// per value: 131,072 for an 8B Llama in 16-bit).
    pub kv_bytes_per_token: f64,
    /// Bytes per second between a prefill and a decode replica.
    pub transfer_bandwidth: f64,
    /// Seconds every transfer takes besides its bytes (handshake, first
    /// block).
    pub transfer_latency: f64,
}

impl Default for RoleConfig {
    fn default() -> Self {
        RoleConfig {
            role: Role::Both,
            kv_bytes_per_token: 131_072.0,
            // A 200 Gb/s RDMA link, about what NIXL gets between nodes.
            transfer_bandwidth: 25e9,
            transfer_latency: 0.002,
        }
    }
}

impl RoleConfig {
    /// Seconds to receive the KV cache of `tokens` tokens.
    pub fn transfer_time(&self, tokens: usize) -> f64 {
        if tokens == 0 {
            return 0.0;
        }
        self.transfer_latency + tokens as f64 * self.kv_bytes_per_token / self.transfer_bandwidth
    }

    pub fn validate(&self) -> Result<(), String> {
        if !(self.kv_bytes_per_token.is_finite() && self.kv_bytes_per_token >= 0.0) {
            return Err("disaggregation.kv_bytes_per_token must be a number >= 0".into());
        }
        if !(self.transfer_bandwidth.is_finite() && self.transfer_bandwidth > 0.0) {
            return Err("disaggregation.transfer_bandwidth must be a number > 0".into());
        }
        if !(self.transfer_latency.is_finite() && self.transfer_latency >= 0.0) {
            return Err("disaggregation.transfer_latency must be a number >= 0".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_time_is_latency_plus_bytes_over_bandwidth() {
        let c = RoleConfig {
            role: Role::Decode,
            kv_bytes_per_token: 1000.0,
            transfer_bandwidth: 1e6,
            transfer_latency: 0.01,
        };
        assert_eq!(c.transfer_time(0), 0.0);
        assert!((c.transfer_time(4000) - 4.01).abs() < 1e-12);
        // An 8B model's 4k-token prompt over the default link: about 23 ms.
        let t = RoleConfig::default().transfer_time(4096);
        assert!((0.02..0.03).contains(&t), "{t}");
        assert!(
            RoleConfig {
                transfer_bandwidth: 0.0,
                ..c
            }
            .validate()
            .is_err()
        );
    }
}

//! `discovery = { dns = "...", port = 8000, interval = "5s" }`: a pool whose
//! replicas are the addresses a DNS name resolves to (a Kubernetes headless
//! Service), instead of a static list.

use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiscoveryConfig {
    /// Name whose A/AAAA records are the replicas.
    pub dns: String,
    /// Port every discovered replica listens on.
    pub port: u16,
    /// How often the name is resolved again.
    #[serde(default = "default_interval", with = "super::duration")]
    pub interval: Duration,
    /// Resolve from this hosts-format file (`IP NAME...` lines) instead of
    /// the system resolver: for static set-ups and tests.
    #[serde(default)]
    pub hosts_file: Option<String>,
    /// Port on which every discovered replica publishes KV-cache events.
    #[serde(default)]
    pub kv_events_port: Option<u16>,
    /// Port of every discovered replica's KV-event replay endpoint.
    #[serde(default)]
    pub kv_events_replay_port: Option<u16>,
    /// How discovered replicas are named in metrics, logs and the admin API.
    #[serde(default)]
    pub replica_names: ReplicaNames,
}

impl DiscoveryConfig {
    /// `dns` on `port`, every other field at its default.
    pub fn new(dns: impl Into<String>, port: u16) -> DiscoveryConfig {
        DiscoveryConfig {
            dns: dns.into(),
            port,
            interval: default_interval(),
            hosts_file: None,
            kv_events_port: None,
            kv_events_replay_port: None,
            replica_names: ReplicaNames::default(),
        }
    }
}

/// Where a discovered replica's name comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReplicaNames {
    /// The first label of the address's reverse DNS name (the pod name for a
    /// StatefulSet's pods behind a headless Service), else the address.
    #[default]
    ReverseDns,
    /// Always `host:port`.
    Address,
}

fn default_interval() -> Duration {
    Duration::from_secs(5)
}

//! `[fleet]`: the store several llmlb instances share (Redis or Valkey), so
//! per-replica limits, and the prefix view hold across instances.

use std::time::Duration;

use serde::Deserialize;

use super::ConfigIssue;
use super::validate::push;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetConfig {
    /// `redis://[user:password@]host:port[/db]`.
    pub store: String,
    /// Prefix of every key llmlb writes in the store. Instances that share
    /// a prefix form one fleet.
    #[serde(default = "default_prefix")]
    pub key_prefix: String,
    /// Longest wait for one store call; a slower answer counts as a failure.
    #[serde(
        default = "default_timeout",
        deserialize_with = "super::duration::deserialize"
    )]
    pub timeout: Duration,
    /// How often each instance renews its registration and its slot leases.
    #[serde(
        default = "default_refresh",
        deserialize_with = "super::duration::deserialize"
    )]
    pub refresh: Duration,
    /// An instance not heard from for this long is gone: its slots go back
    /// to the others, and an instance cut off from the store for this long
    /// stops using its leases and falls back to its share.
    #[serde(
        default = "default_ttl",
        deserialize_with = "super::duration::deserialize"
    )]
    pub instance_ttl: Duration,
    /// This instance's name on the status page (default: host name and process id).
    #[serde(default)]
    pub name: Option<String>,
    /// Share dispatch records with the other instances so that `cache` and
    /// `hash` prefix indexes see what every instance sent where.
    #[serde(default = "default_true")]
    pub share_prefixes: bool,
}

fn default_prefix() -> String {
    "llmlb:fleet:".to_string()
}
fn default_timeout() -> Duration {
    Duration::from_millis(50)
}
fn default_refresh() -> Duration {
    Duration::from_millis(50)
}
fn default_ttl() -> Duration {
    Duration::from_secs(2)
}
fn default_true() -> bool {
    true
}

/// The `[fleet]` rules; `fleet` is the section's value.
pub(super) fn validate(fleet: &FleetConfig, out: &mut Vec<ConfigIssue>) {
    match fleet.store.split_once("://") {
        Some((
            "redis" | super::store_url::SENTINEL_SCHEME | super::store_url::CLUSTER_SCHEME,
            rest,
        )) if !rest.is_empty() => {
            if let Err(e) = super::StoreUrl::parse(&fleet.store) {
                push(out, "fleet.store", &format!("not a valid store URL: {e}"));
            }
        }
        _ => push(
            out,
            "fleet.store",
            "must be a redis://host:port[/db] URL (Redis or Valkey), redis+sentinel://host:port[,host:port...]/master[/db] or redis+cluster://host:port[,host:port...]",
        ),
    }
    if fleet.key_prefix.is_empty() {
        push(out, "fleet.key_prefix", "must not be empty");
    }
    for (key, d) in [
        ("fleet.timeout", fleet.timeout),
        ("fleet.refresh", fleet.refresh),
        ("fleet.instance_ttl", fleet.instance_ttl),
    ] {
        if d.is_zero() {
            push(out, key, "must be greater than 0");
        }
    }
    if fleet.refresh * 3 > fleet.instance_ttl {
        push(
            out,
            "fleet.instance_ttl",
            "must be at least three times fleet.refresh (a live instance renews several times per TTL)",
        );
    }
    if fleet.timeout > fleet.refresh {
        push(out, "fleet.timeout", "must not exceed fleet.refresh");
    }
}

#[cfg(test)]
mod tests {
    use crate::config::parse;

    const POOL: &str = "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n\
                        [[pools.replicas]]\nurl = \"http://127.0.0.1:1\"\n";

    #[test]
    fn defaults_and_rules() {
        let c = parse(&format!(
            "[fleet]\nstore = \"redis://127.0.0.1:6379\"\n{POOL}"
        ))
        .unwrap();
        let f = c.fleet.unwrap();
        assert_eq!(f.key_prefix, "llmlb:fleet:");
        assert_eq!(f.refresh, std::time::Duration::from_millis(50));
        assert!(f.share_prefixes);
        let issues = parse(&format!(
            "[fleet]\nstore = \"http://x\"\nrefresh = \"1s\"\ninstance_ttl = \"2s\"\n{POOL}"
        ))
        .unwrap_err();
        let keys: Vec<&str> = issues.iter().map(|i| i.key.as_str()).collect();
        assert_eq!(keys, ["fleet.store", "fleet.instance_ttl"], "{issues:?}");
        let issues = parse(&format!(
            "[fleet]\nstore = \"redis://h\"\nttl = \"1s\"\n{POOL}"
        ))
        .unwrap_err();
        assert!(issues[0].key.starts_with("fleet"), "{issues:?}");
    }

    #[test]
    fn sentinel_and_cluster_urls_name_the_store_and_a_bad_one_names_the_key() {
        let ok = "redis+sentinel://:pw@10.0.0.1:26379,10.0.0.2/main/2";
        let c = parse(&format!("[fleet]\nstore = \"{ok}\"\n{POOL}")).unwrap();
        assert_eq!(c.fleet.unwrap().store, ok);
        let issues = parse(&format!(
            "[fleet]\nstore = \"redis+sentinel://10.0.0.1:26379\"\n{POOL}"
        ))
        .unwrap_err();
        assert_eq!(issues[0].key, "fleet.store", "{issues:?}");
        assert!(issues[0].reason.contains("master"), "{issues:?}");
        let cluster = "redis+cluster://10.0.0.1:7000,10.0.0.2:7000";
        assert!(parse(&format!("[fleet]\nstore = \"{cluster}\"\n{POOL}")).is_ok());
        let issues = parse(&format!(
            "[fleet]\nstore = \"redis+cluster://10.0.0.1\"\n{POOL}"
        ))
        .unwrap_err();
        assert_eq!(issues[0].key, "fleet.store", "{issues:?}");
    }
}

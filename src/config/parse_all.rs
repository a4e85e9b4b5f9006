//! Every parse-level mistake in one pass.
//!
//! serde stops at the first field it cannot read, so a file with a typo in
//! `[server]` and a bad duration in the third pool would be fixed one run of
//! `llmlb check` at a time. When the whole file does not deserialize, each
//! top-level section, and each element of the `[[...]]` arrays, is read again
//! on its own, and each one's first problem is reported with its dotted key.
//! (Within one section or element serde still stops at the first problem.)
//!
//! Cost: runs only on a file that already failed, once per section; a valid
//! file never comes here.

use serde::de::DeserializeOwned;

use super::ConfigIssue;
use super::gateway::{GatewayConfig, KeyConfig, LimitsConfig, PriorityConfig, TierConfig};
use super::schema::PoolConfig;
use super::server::ServerConfig;

/// The problems of each section of `text` (which must be valid TOML).
pub fn section_issues(text: &str) -> Vec<ConfigIssue> {
    let Ok(table) = text.parse::<toml::Table>() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (key, value) in table {
        match key.as_str() {
            "server" => one::<ServerConfig>(&key, value, &mut out),
            "gateway" => one::<GatewayConfig>(&key, value, &mut out),
            "limits" => one::<LimitsConfig>(&key, value, &mut out),
            "telemetry" => one::<super::TelemetryConfig>(&key, value, &mut out),
            "fleet" => one::<super::FleetConfig>(&key, value, &mut out),
            "default_pool" => one::<String>(&key, value, &mut out),
            "aliases" => one::<std::collections::BTreeMap<String, String>>(&key, value, &mut out),
            "pools" => each::<PoolConfig>(&key, value, &mut out),
            "tiers" => each::<TierConfig>(&key, value, &mut out),
            "keys" => each::<KeyConfig>(&key, value, &mut out),
            "priorities" => each::<PriorityConfig>(&key, value, &mut out),
            _ => out.push(ConfigIssue {
                key,
                reason: "unknown section; expected one of server, pools, gateway, tiers, keys, \
                         limits, priorities, default_pool, aliases, telemetry, fleet"
                    .into(),
            }),
        }
    }
    out
}

fn one<T: DeserializeOwned>(key: &str, value: toml::Value, out: &mut Vec<ConfigIssue>) {
    if let Err(e) = serde_path_to_error::deserialize::<_, T>(value) {
        let inner = e.path().to_string();
        let key = if inner == "." || inner.is_empty() {
            key.to_string()
        } else if inner.starts_with('[') {
            format!("{key}{inner}")
        } else {
            format!("{key}.{inner}")
        };
        out.push(ConfigIssue {
            key,
            reason: e.inner().message().to_string(),
        });
    }
}

fn each<T: DeserializeOwned>(key: &str, value: toml::Value, out: &mut Vec<ConfigIssue>) {
    match value {
        toml::Value::Array(items) => {
            for (i, item) in items.into_iter().enumerate() {
                one::<T>(&format!("{key}[{i}]"), item, out);
            }
        }
        other => one::<Vec<T>>(key, other, out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_broken_section_and_pool_is_named() {
        let text = r#"
[server]
listen = "127.0.0.1:8080"
max_body_byts = 10

[[pools]]
name = "a"
models = ["m"]
[[pools.replicas]]
url = "http://127.0.0.1:1"

[[pools]]
name = "b"
models = ["m2"]
[pools.timeouts]
connect = 5
[[pools.replicas]]
url = "http://127.0.0.1:2"

[mystery]
x = 1
"#;
        let issues = section_issues(text);
        let keys: Vec<&str> = issues.iter().map(|i| i.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "mystery",
                "pools[1].timeouts.connect",
                "server.max_body_byts"
            ],
            "{issues:?}"
        );
        assert!(issues[1].reason.contains("needs a unit"), "{issues:?}");
        assert!(issues[2].reason.contains("unknown field"), "{issues:?}");
    }

    #[test]
    fn a_valid_file_has_no_section_issues() {
        let text = "[[pools]]\nname = \"a\"\nmodels = [\"m\"]\n[[pools.replicas]]\nurl = \"http://127.0.0.1:1\"\n";
        assert!(section_issues(text).is_empty());
    }
}

//! Configuration: parse → validate → typed.
//!
//! `load` reads one TOML file and returns either a validated [`Config`] or every
//! problem found, each naming the file, the dotted key and the reason.

mod cors;
mod disaggregation;
mod discovery;
mod duration;
mod fleet;
mod gateway;
mod hints;
mod parse_all;
mod replica_list;
mod routing;
mod schema;
mod server;
mod store_url;
mod telemetry;
mod tls_files;
mod tokenizer;
mod upstream_tls;
mod validate;
mod validate_disaggregation;
mod validate_gateway;
mod validate_kv_events;
mod validate_load;
mod validate_routing;
mod validate_tenants;
mod watch;

pub use cors::CorsConfig;
pub use disaggregation::{DisaggregateWhen, DisaggregationConfig, KvProtocol, PoolRole};
pub use discovery::{DiscoveryConfig, ReplicaNames};
pub use duration::format as format_duration;
pub use fleet::FleetConfig;
pub use gateway::*;
pub use hints::{prefill_hints, prefix_hints, priority_hint};
pub use routing::*;
pub use schema::*;
pub use server::{ServerConfig, TlsConfig};
pub use store_url::{SentinelUrl, StoreUrl};
pub use telemetry::{ACCESS_LOG_FIELDS, AccessLogConfig, OtlpConfig, TelemetryConfig};
pub use tls_files::{TlsError, UpstreamTlsError, UpstreamTrust, server_tls};
pub use tokenizer::TokenizerConfig;
pub use upstream_tls::UpstreamTlsConfig;
pub use validate::validate;
pub use watch::{CustomMetricNames, HealthConfig, MetricsPreset, OutlierConfig, ScrapeConfig};

use std::fmt;
use std::path::{Path, PathBuf};

/// One problem in a config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigIssue {
    /// Dotted key such as `pools[0].replicas[1].url`; empty for the whole file.
    pub key: String,
    pub reason: String,
}

/// Every problem found in one file.
#[derive(Debug, Clone, thiserror::Error)]
pub struct ConfigError {
    pub file: PathBuf,
    pub issues: Vec<ConfigIssue>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, issue) in self.issues.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            let file = self.file.display();
            if issue.key.is_empty() {
                write!(f, "{file}: {}", issue.reason)?;
            } else {
                write!(f, "{file}: {}: {}", issue.key, issue.reason)?;
            }
        }
        Ok(())
    }
}

impl ConfigError {
    /// Every issue on one line (`; `-separated, line breaks inside a
    /// reason, such as a TOML parse error's excerpt, folded into spaces):
    /// a log entry stays one line.
    pub fn one_line(&self) -> String {
        let text = self.to_string();
        let parts: Vec<String> = text
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .filter(|l| !l.is_empty())
            .collect();
        parts.join("; ")
    }
}

/// Reads, parses and validates the config at `path`.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: path.to_path_buf(),
        issues: vec![ConfigIssue {
            key: String::new(),
            reason: format!("cannot read file: {e}"),
        }],
    })?;
    let mut config = parse(&text).map_err(|issues| ConfigError {
        file: path.to_path_buf(),
        issues,
    })?;
    // The admin token may come from the environment (a Kubernetes Secret)
    // instead of the file; the file wins when it sets one.
    if config.server.admin_token.is_none()
        && let Ok(token) = std::env::var(ADMIN_TOKEN_ENV)
        && !token.is_empty()
    {
        config.server.admin_token = Some(token);
    }
    Ok(config)
}

/// Environment variable read for `server.admin_token` when the file sets none.
pub const ADMIN_TOKEN_ENV: &str = "LLMLB_ADMIN_TOKEN";

/// Parses and validates config text.
pub fn parse(text: &str) -> Result<Config, Vec<ConfigIssue>> {
    let de =
        toml::Deserializer::parse(text).map_err(|e| vec![toml_issue(text, String::new(), &e)])?;
    let config: Config = serde_path_to_error::deserialize(de).map_err(|e| {
        let key = e.path().to_string();
        let key = if key == "." { String::new() } else { key };
        // The first problem with its line; then every other section's.
        let first = toml_issue(text, key, e.inner());
        let mut issues = vec![first];
        for issue in parse_all::section_issues(text) {
            if issue.key != issues[0].key {
                issues.push(issue);
            }
        }
        issues
    })?;
    let issues = validate::validate(&config);
    if issues.is_empty() {
        Ok(config)
    } else {
        Err(issues)
    }
}

fn toml_issue(text: &str, key: String, e: &toml::de::Error) -> ConfigIssue {
    let mut reason = e.message().to_string();
    if let Some(span) = e.span() {
        let before = &text[..span.start.min(text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
        reason.push_str(&format!(" (line {line}, column {column})"));
    }
    ConfigIssue { key, reason }
}

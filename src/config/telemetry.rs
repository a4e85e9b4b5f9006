//! `[telemetry]`: the access log (`[telemetry.access_log]`).

use serde::Deserialize;

use super::ConfigIssue;

/// Every field an access-log line can carry, in the order written.
pub const ACCESS_LOG_FIELDS: &[&str] = &[
    "request_id",
    "client",
    "method",
    "path",
    "model",
    "stream",
    "pool",
    "replica",
    "route",
    "branch",
    "status",
    "attempts",
    "ttft_ms",
    "duration_ms",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "outcome",
];

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    pub access_log: AccessLogConfig,
}

/// One structured line per finished request, on stderr through the
/// process's log format (text or `--log-format json`), at `info` under the
/// target `llmlb::access` (so `RUST_LOG=llmlb::access=off` silences it).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AccessLogConfig {
    pub enabled: bool,
    /// Share of successful requests logged (0.0..=1.0); requests that ended
    /// with an error status or broke are always logged.
    pub sample: f64,
    /// Which fields to write (default: all of [`ACCESS_LOG_FIELDS`]).
    pub fields: Vec<String>,
}

impl Default for AccessLogConfig {
    fn default() -> Self {
        AccessLogConfig {
            enabled: true,
            sample: 1.0,
            fields: ACCESS_LOG_FIELDS.iter().map(|f| f.to_string()).collect(),
        }
    }
}

impl AccessLogConfig {
    /// A bit per entry of [`ACCESS_LOG_FIELDS`] that is written.
    pub fn field_mask(&self) -> u32 {
        ACCESS_LOG_FIELDS
            .iter()
            .enumerate()
            .filter(|(_, f)| self.fields.iter().any(|x| x == *f))
            .fold(0, |m, (i, _)| m | (1 << i))
    }
}

pub fn validate(t: &TelemetryConfig, out: &mut Vec<ConfigIssue>) {
    let a = &t.access_log;
    if !(0.0..=1.0).contains(&a.sample) {
        out.push(ConfigIssue {
            key: "telemetry.access_log.sample".into(),
            reason: format!("must be between 0.0 and 1.0, got {}", a.sample),
        });
    }
    for (i, f) in a.fields.iter().enumerate() {
        if !ACCESS_LOG_FIELDS.contains(&f.as_str()) {
            out.push(ConfigIssue {
                key: format!("telemetry.access_log.fields[{i}]"),
                reason: format!(
                    "unknown field `{f}`; known: {}",
                    ACCESS_LOG_FIELDS.join(", ")
                ),
            });
        }
    }
}

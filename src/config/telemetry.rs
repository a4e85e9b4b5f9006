//! `[telemetry]`: the access log (`[telemetry.access_log]`) and request
//! traces over OTLP (`[telemetry.otlp]`).

use serde::Deserialize;
use std::sync::OnceLock;

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
    "error",
    "ttfb_ms",
    "tier",
    "queue_ms",
    "cached_tokens_predicted",
    "ttft_predicted_ms",
];

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    pub access_log: AccessLogConfig,
    /// Off unless the table is present.
    pub otlp: Option<OtlpConfig>,
}

/// Request traces exported over OTLP/HTTP (JSON encoding) to a collector:
/// a span per request with children for the queue wait, the routing
/// decision and each upstream attempt; a client's W3C `traceparent` is
/// continued and the upstream attempt's context is forwarded to the replica.
/// Read at start-up: a reload applies the rest of the file and lists a
/// changed `[telemetry.otlp]` among the settings that need a restart.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpConfig {
    /// The collector's traces URL; a bare `http://host:4318` gets the
    /// standard `/v1/traces` path.
    pub endpoint: String,
    /// `service.name` on every span.
    pub service_name: String,
    /// Share of new traces recorded (0.0..=1.0). A client's `traceparent`
    /// that says "sampled" is always followed.
    pub sample_ratio: f64,
    /// How often finished spans are sent in one batch.
    #[serde(with = "super::duration")]
    pub export_interval: std::time::Duration,
    /// Give up on one export after this long (spans are then dropped, never
    /// the request).
    #[serde(with = "super::duration")]
    pub timeout: std::time::Duration,
}

impl Default for OtlpConfig {
    fn default() -> Self {
        OtlpConfig {
            endpoint: String::new(),
            service_name: "llmlb".into(),
            sample_ratio: 1.0,
            export_interval: std::time::Duration::from_secs(1),
            timeout: std::time::Duration::from_secs(5),
        }
    }
}

impl OtlpConfig {
    /// The URL spans are posted to.
    pub fn traces_url(&self) -> String {
        let trimmed = self.endpoint.trim_end_matches('/');
        match trimmed.split_once("://") {
            Some((_, rest)) if !rest.contains('/') => format!("{trimmed}/v1/traces"),
            _ => self.endpoint.clone(),
        }
    }
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
    /// [`AccessLogConfig::field_mask`], worked out once per config.
    #[serde(skip)]
    mask: MaskCache,
}

/// A computed value kept beside the config; two configs are equal whatever
/// it holds (it follows from the fields).
#[derive(Debug, Clone, Default)]
struct MaskCache(OnceLock<u32>);

impl PartialEq for MaskCache {
    fn eq(&self, _: &MaskCache) -> bool {
        true
    }
}

impl Default for AccessLogConfig {
    fn default() -> Self {
        AccessLogConfig {
            enabled: true,
            sample: 1.0,
            fields: ACCESS_LOG_FIELDS.iter().map(|f| f.to_string()).collect(),
            mask: MaskCache::default(),
        }
    }
}

impl AccessLogConfig {
    /// A bit per entry of [`ACCESS_LOG_FIELDS`] that is written (compared
    /// name by name the first time, then kept: every request asks).
    pub fn field_mask(&self) -> u32 {
        *self.mask.0.get_or_init(|| {
            ACCESS_LOG_FIELDS
                .iter()
                .enumerate()
                .filter(|(_, f)| self.fields.iter().any(|x| x == *f))
                .fold(0, |m, (i, _)| m | (1 << i))
        })
    }
}

pub fn validate(t: &TelemetryConfig, out: &mut Vec<ConfigIssue>) {
    if let Some(otlp) = &t.otlp {
        validate_otlp(otlp, out);
    }
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

fn validate_otlp(o: &OtlpConfig, out: &mut Vec<ConfigIssue>) {
    let mut issue = |key: &str, reason: String| {
        out.push(ConfigIssue {
            key: format!("telemetry.otlp.{key}"),
            reason,
        })
    };
    match o.traces_url().parse::<http::Uri>() {
        _ if o.endpoint.is_empty() => issue(
            "endpoint",
            "is required, e.g. \"http://127.0.0.1:4318\" (OTLP over HTTP)".into(),
        ),
        Ok(uri) if uri.scheme_str() == Some("http") && uri.host().is_some() => {}
        Ok(uri) if uri.scheme_str() == Some("https") => issue(
            "endpoint",
            format!("{uri}: only plain http is supported; run a local collector as a sidecar"),
        ),
        Ok(uri) => issue("endpoint", format!("{uri}: not an http://host:port URL")),
        Err(e) => issue("endpoint", format!("{:?}: {e}", o.endpoint)),
    }
    if !(0.0..=1.0).contains(&o.sample_ratio) {
        issue(
            "sample_ratio",
            format!("must be between 0.0 and 1.0, got {}", o.sample_ratio),
        );
    }
    if o.service_name.is_empty() {
        issue("service_name", "must not be empty".into());
    }
    for (key, d) in [
        ("export_interval", o.export_interval),
        ("timeout", o.timeout),
    ] {
        if d.is_zero() {
            issue(key, "must be more than zero".into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_endpoint_gets_the_traces_path() {
        let url = |e: &str| {
            OtlpConfig {
                endpoint: e.into(),
                ..OtlpConfig::default()
            }
            .traces_url()
        };
        assert_eq!(
            url("http://127.0.0.1:4318"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            url("http://127.0.0.1:4318/"),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            url("http://c:4318/custom/traces"),
            "http://c:4318/custom/traces"
        );
    }

    #[test]
    fn otlp_mistakes_are_named() {
        let mut out = Vec::new();
        let bad = OtlpConfig {
            endpoint: "https://collector:4318".into(),
            sample_ratio: 2.0,
            timeout: std::time::Duration::ZERO,
            ..OtlpConfig::default()
        };
        validate_otlp(&bad, &mut out);
        let keys: Vec<&str> = out.iter().map(|i| i.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "telemetry.otlp.endpoint",
                "telemetry.otlp.sample_ratio",
                "telemetry.otlp.timeout"
            ]
        );
    }
}

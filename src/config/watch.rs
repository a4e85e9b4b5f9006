//! How llmlb watches a pool's replicas: passive outlier ejection, the
//! metrics scrape and the active health check.

use serde::Deserialize;
use std::time::Duration;

/// Passive health (outlier ejection): a replica whose requests keep failing
/// (connect errors, timeouts, 5xx other than 503) is ejected for a while.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OutlierConfig {
    /// Consecutive failures that eject a replica.
    pub consecutive_failures: u32,
    /// Base ejection time, multiplied by how many times the replica has been
    /// ejected in a row.
    #[serde(with = "super::duration", alias = "base_ejection_time")]
    pub cooldown: Duration,
    /// Upper bound of one ejection.
    #[serde(with = "super::duration")]
    pub max_ejection_time: Duration,
    /// Largest share of a pool ejected at once for timeouts and 5xx answers,
    /// in percent (at least one replica may always be ejected). Replicas that
    /// refuse connections are ejected regardless.
    pub max_ejection_percent: u32,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        OutlierConfig {
            consecutive_failures: 3,
            cooldown: Duration::from_secs(10),
            max_ejection_time: Duration::from_secs(300),
            max_ejection_percent: 50,
        }
    }
}

/// Metric-name presets for the scraper.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricsPreset {
    Vllm,
    Sglang,
    Custom,
}

/// Metric names for `preset = "custom"` (`[pools.scrape.metrics]`); each
/// list is tried in order and the first name present wins.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CustomMetricNames {
    pub running: Vec<String>,
    pub waiting: Vec<String>,
    pub kv_usage: Vec<String>,
}

/// Polling replicas' Prometheus `/metrics` (`[pools.scrape]`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScrapeConfig {
    /// On or off; when unset, on exactly when the balancer reads scraped load.
    pub enabled: Option<bool>,
    pub path: String,
    #[serde(with = "super::duration")]
    pub interval: Duration,
    #[serde(with = "super::duration")]
    pub timeout: Duration,
    /// Snapshots older than this are not used: balancers fall back to the
    /// proxy's own counts for every candidate.
    #[serde(with = "super::duration")]
    pub staleness: Duration,
    pub preset: MetricsPreset,
    pub metrics: CustomMetricNames,
}

impl Default for ScrapeConfig {
    fn default() -> Self {
        ScrapeConfig {
            enabled: None,
            path: "/metrics".into(),
            interval: Duration::from_millis(500),
            timeout: Duration::from_millis(400),
            staleness: Duration::from_secs(2),
            preset: MetricsPreset::Vllm,
            metrics: CustomMetricNames::default(),
        }
    }
}

/// Active health checks in HAProxy's manner (`[pools.health]`): `fall`
/// failed checks in a row mark a replica down, `rise` good ones bring it back.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthConfig {
    pub enabled: bool,
    pub path: String,
    #[serde(with = "super::duration")]
    pub interval: Duration,
    #[serde(with = "super::duration")]
    pub timeout: Duration,
    pub fall: u32,
    pub rise: u32,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            enabled: true,
            path: "/health".into(),
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            fall: 3,
            rise: 2,
        }
    }
}

//! Rules for the load-signal sections of a pool: `balancing`, `scrape`,
//! `health` and `outlier`. Each problem names its dotted key.

use super::validate::push;
use super::{ConfigIssue, MetricsPreset, PoolConfig};

pub fn validate_load(out: &mut Vec<ConfigIssue>, key: &str, pool: &PoolConfig) {
    let b = &pool.balancing;
    if !(b.kv_threshold > 0.0 && b.kv_threshold <= 1.0) {
        push(
            out,
            &format!("{key}.balancing.kv_threshold"),
            "must be in (0, 1]",
        );
    }
    if b.max_model_len == 0 {
        push(
            out,
            &format!("{key}.balancing.max_model_len"),
            "must be greater than 0",
        );
    }
    if b.kv_capacity_tokens == 0 {
        push(
            out,
            &format!("{key}.balancing.kv_capacity_tokens"),
            "must be greater than 0",
        );
    }

    let s = &pool.scrape;
    if !s.path.starts_with('/') {
        push(out, &format!("{key}.scrape.path"), "must start with '/'");
    }
    if s.interval.is_zero() {
        push(
            out,
            &format!("{key}.scrape.interval"),
            "must be greater than 0",
        );
    }
    if s.timeout.is_zero() {
        push(
            out,
            &format!("{key}.scrape.timeout"),
            "must be greater than 0",
        );
    } else if s.timeout > s.interval {
        push(
            out,
            &format!("{key}.scrape.timeout"),
            "must not exceed scrape.interval",
        );
    }
    if s.staleness <= s.interval {
        push(
            out,
            &format!("{key}.scrape.staleness"),
            "must be longer than scrape.interval, or every snapshot would count as stale",
        );
    }
    let custom = &s.metrics;
    let any_custom =
        !custom.running.is_empty() || !custom.waiting.is_empty() || !custom.kv_usage.is_empty();
    match s.preset {
        MetricsPreset::Custom if !any_custom => push(
            out,
            &format!("{key}.scrape.metrics"),
            "preset \"custom\" needs at least one of running, waiting, kv_usage",
        ),
        MetricsPreset::Vllm | MetricsPreset::Sglang if any_custom => push(
            out,
            &format!("{key}.scrape.metrics"),
            "metric names are only read with preset = \"custom\"",
        ),
        _ => {}
    }
    for (field, names) in [
        ("running", &custom.running),
        ("waiting", &custom.waiting),
        ("kv_usage", &custom.kv_usage),
    ] {
        for (i, n) in names.iter().enumerate() {
            if !valid_metric_name(n) {
                push(
                    out,
                    &format!("{key}.scrape.metrics.{field}[{i}]"),
                    &format!("{n:?} is not a Prometheus metric name"),
                );
            }
        }
    }
    if pool.balancer.uses_scraped_load(b) && pool.scrape.enabled == Some(false) {
        push(
            out,
            &format!("{key}.scrape.enabled"),
            &format!(
                "balancer {:?} reads scraped load; scraping cannot be off",
                pool.balancer.as_str()
            ),
        );
    }

    let h = &pool.health;
    if !h.path.starts_with('/') {
        push(out, &format!("{key}.health.path"), "must start with '/'");
    }
    if h.interval.is_zero() {
        push(
            out,
            &format!("{key}.health.interval"),
            "must be greater than 0",
        );
    }
    if h.timeout.is_zero() {
        push(
            out,
            &format!("{key}.health.timeout"),
            "must be greater than 0",
        );
    } else if h.timeout > h.interval {
        push(
            out,
            &format!("{key}.health.timeout"),
            "must not exceed health.interval",
        );
    }
    if h.fall == 0 {
        push(out, &format!("{key}.health.fall"), "must be at least 1");
    }
    if h.rise == 0 {
        push(out, &format!("{key}.health.rise"), "must be at least 1");
    }

    let o = &pool.outlier;
    if o.cooldown.is_zero() {
        push(
            out,
            &format!("{key}.outlier.cooldown"),
            "must be greater than 0",
        );
    }
    if o.max_ejection_time < o.cooldown {
        push(
            out,
            &format!("{key}.outlier.max_ejection_time"),
            "must be at least outlier.cooldown",
        );
    }
    if o.max_ejection_percent > 100 {
        push(
            out,
            &format!("{key}.outlier.max_ejection_percent"),
            "must be at most 100",
        );
    }
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`
fn valid_metric_name(n: &str) -> bool {
    let mut chars = n.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

#[cfg(test)]
mod tests {
    use super::super::{BalancerKind, MetricsPreset, P2cMetric, parse};
    use std::time::Duration;

    const BASE: &str = r#"
        [[pools]]
        name = "llama"
        models = ["m"]
        balancer = "jsq"
        [[pools.replicas]]
        url = "http://127.0.0.1:8001"
    "#;

    fn keys(extra: &str) -> Vec<String> {
        parse(&format!("{BASE}{extra}"))
            .unwrap_err()
            .into_iter()
            .map(|i| i.key)
            .collect()
    }

    #[test]
    fn full_sections_parse() {
        let c = parse(&format!(
            "{BASE}
            [pools.balancing]
            default_max_tokens = 128
            kv_threshold = 0.8
            p2c_metric = \"jsq\"
            seed = 7
            [pools.scrape]
            interval = \"250ms\"
            timeout = \"200ms\"
            staleness = \"1s\"
            preset = \"custom\"
            [pools.scrape.metrics]
            waiting = [\"my:queue\"]
            [pools.health]
            enabled = true
            interval = \"2s\"
            fall = 3
            rise = 2
            [pools.outlier]
            consecutive_failures = 5
            base_ejection_time = \"30s\"
            max_ejection_time = \"300s\"
            max_ejection_percent = 10
            "
        ))
        .unwrap();
        let p = &c.pools[0];
        assert_eq!(p.balancer, BalancerKind::Jsq);
        assert_eq!(p.balancing.default_max_tokens, 128);
        assert_eq!(p.balancing.p2c_metric, P2cMetric::Jsq);
        assert_eq!(p.scrape.interval, Duration::from_millis(250));
        assert_eq!(p.scrape.preset, MetricsPreset::Custom);
        assert_eq!(p.scrape.metrics.waiting, vec!["my:queue".to_string()]);
        assert!(p.health.enabled);
        assert_eq!(p.outlier.cooldown, Duration::from_secs(30));
        assert_eq!(p.outlier.max_ejection_percent, 10);
        assert!(p.scrape_enabled());
    }

    #[test]
    fn scrape_defaults_follow_balancer() {
        let c = parse(&BASE.replace("\"jsq\"", "\"round_robin\"")).unwrap();
        assert!(!c.pools[0].scrape_enabled());
        let c = parse(BASE).unwrap();
        assert!(c.pools[0].scrape_enabled());
    }

    #[test]
    fn every_bad_value_is_named() {
        let k = keys(
            "
            [pools.balancing]
            kv_threshold = 1.5
            kv_capacity_tokens = 0
            [pools.scrape]
            enabled = false
            path = \"metrics\"
            interval = \"1s\"
            timeout = \"2s\"
            staleness = \"500ms\"
            [pools.scrape.metrics]
            running = [\"bad name\"]
            [pools.health]
            fall = 0
            rise = 0
            timeout = \"5s\"
            [pools.outlier]
            max_ejection_percent = 150
            max_ejection_time = \"1s\"
            ",
        );
        for expected in [
            "pools[0].balancing.kv_threshold",
            "pools[0].balancing.kv_capacity_tokens",
            "pools[0].scrape.path",
            "pools[0].scrape.timeout",
            "pools[0].scrape.staleness",
            "pools[0].scrape.metrics",
            "pools[0].scrape.metrics.running[0]",
            "pools[0].scrape.enabled",
            "pools[0].health.timeout",
            "pools[0].health.fall",
            "pools[0].health.rise",
            "pools[0].outlier.max_ejection_time",
            "pools[0].outlier.max_ejection_percent",
        ] {
            assert!(
                k.iter().any(|x| x == expected),
                "{expected} missing in {k:?}"
            );
        }
    }

    #[test]
    fn custom_preset_needs_names() {
        let k = keys("[pools.scrape]\npreset = \"custom\"\n");
        assert_eq!(k, vec!["pools[0].scrape.metrics"]);
    }

    #[test]
    fn unknown_balancer_and_key_are_named() {
        let e = parse(&BASE.replace("\"jsq\"", "\"fastest\"")).unwrap_err();
        assert_eq!(e[0].key, "pools[0].balancer");
        let k = keys("[pools.scrape]\nintervall = \"1s\"\n");
        assert_eq!(k, vec!["pools[0].scrape.intervall"]);
    }
}

//! Rules for the routing sections: the default pool and aliases must point
//! at something served, canary versions must match the replicas', tiers must
//! name pools and replicas that exist, and the cost model must be positive.

use std::collections::{HashMap, HashSet};

use super::validate::{parse_replica_url, push};
use super::{Config, ConfigIssue, PoolConfig};

pub fn validate(config: &Config, out: &mut Vec<ConfigIssue>) {
    let pools: HashSet<&str> = config.pools.iter().map(|p| p.name.as_str()).collect();
    let models: HashSet<&str> = config
        .pools
        .iter()
        .flat_map(|p| p.models.iter().map(String::as_str))
        .collect();
    if let Some(name) = &config.default_pool
        && !pools.contains(name.as_str())
    {
        push(out, "default_pool", &format!("unknown pool {name:?}"));
    }
    for (alias, target) in &config.aliases {
        let key = format!("aliases.{alias}");
        if alias.is_empty() {
            push(out, "aliases", "an alias must not be empty");
        } else if models.contains(alias.as_str()) {
            push(
                out,
                &key,
                "is already a served model name; an alias must be a new name",
            );
        }
        if !models.contains(target.as_str()) {
            push(
                out,
                &key,
                &format!("points at {target:?}, which no pool serves"),
            );
        }
    }
    for (i, pool) in config.pools.iter().enumerate() {
        validate_pool(out, &format!("pools[{i}]"), pool);
    }
    validate_tiers(config, &pools, out);
}

fn validate_pool(out: &mut Vec<ConfigIssue>, key: &str, pool: &PoolConfig) {
    let p = &pool.prefix;
    if p.tokens == 0 {
        push(out, &format!("{key}.prefix.tokens"), "must be at least 1");
    }
    if p.block_size == 0 || p.block_size > 1024 {
        push(
            out,
            &format!("{key}.prefix.block_size"),
            "must be in 1..=1024",
        );
    }
    if p.max_blocks_per_replica == 0 {
        push(
            out,
            &format!("{key}.prefix.max_blocks_per_replica"),
            "must be at least 1",
        );
    }
    if !(p.prefill_tokens_per_second.is_finite() && p.prefill_tokens_per_second > 0.0) {
        push(
            out,
            &format!("{key}.prefix.prefill_tokens_per_second"),
            "must be a positive number",
        );
    }
    if !(p.seconds_per_request_ahead.is_finite() && p.seconds_per_request_ahead >= 0.0) {
        push(
            out,
            &format!("{key}.prefix.seconds_per_request_ahead"),
            "must be a number at least 0",
        );
    }
    if !(p.rate_band.is_finite() && p.rate_band >= 1.0) {
        push(
            out,
            &format!("{key}.prefix.rate_band"),
            "must be a number at least 1 (a ratio of rates; 1 turns it off)",
        );
    }
    if !(p.fit_band.is_finite() && p.fit_band >= 1.0) {
        push(
            out,
            &format!("{key}.prefix.fit_band"),
            "must be a number at least 1 (a ratio of costs; 1 turns it off)",
        );
    }
    if !(p.replicate_above.is_finite() && p.replicate_above >= 1.0) {
        push(
            out,
            &format!("{key}.prefix.replicate_above"),
            "must be a number at least 1 (in-flight requests)",
        );
    }
    if p.replicate_hold.is_zero() {
        push(
            out,
            &format!("{key}.prefix.replicate_hold"),
            "must be longer than 0 (e.g. \"10s\")",
        );
    }
    if pool.saturation.max_in_flight == Some(0) {
        push(
            out,
            &format!("{key}.saturation.max_in_flight"),
            "must be at least 1 (omit it for no bound)",
        );
    }
    if let Some(u) = pool.saturation.max_kv_usage
        && !(u > 0.0 && u <= 1.0)
    {
        push(
            out,
            &format!("{key}.saturation.max_kv_usage"),
            &format!("must be a fraction above 0 and at most 1 (e.g. 0.9), not {u}"),
        );
    }
    if http::HeaderName::from_bytes(pool.session.header.as_bytes()).is_err() {
        push(
            out,
            &format!("{key}.session.header"),
            "is not a valid header name",
        );
    }
    for (r, replica) in pool.replicas.iter().enumerate() {
        if replica.version.as_deref() == Some("") {
            push(
                out,
                &format!("{key}.replicas[{r}].version"),
                "must not be empty",
            );
        }
    }
    let Some(canary) = &pool.canary else {
        return;
    };
    if canary.weights.is_empty() {
        push(
            out,
            &format!("{key}.canary.weights"),
            "list at least one version, e.g. { v1 = 95, v2 = 5 }",
        );
    } else if canary.weights.values().map(|w| u64::from(*w)).sum::<u64>() == 0 {
        push(
            out,
            &format!("{key}.canary.weights"),
            "at least one weight must be greater than 0",
        );
    }
    if canary.sticky.is_empty() {
        push(
            out,
            &format!("{key}.canary.sticky"),
            "list at least one of \"user\", \"session\", \"api_key\"",
        );
    }
    let mut seen = HashSet::new();
    for (s, source) in canary.sticky.iter().enumerate() {
        if !seen.insert(*source) {
            push(
                out,
                &format!("{key}.canary.sticky[{s}]"),
                &format!("{:?} is listed twice", source.as_str()),
            );
        }
    }
    if http::HeaderName::from_bytes(canary.header.as_bytes()).is_err() {
        push(
            out,
            &format!("{key}.canary.header"),
            "is not a valid header name",
        );
    }
    let mut replicas_per_version: HashMap<&str, usize> = HashMap::new();
    for (r, replica) in pool.replicas.iter().enumerate() {
        match replica.version.as_deref() {
            None => push(
                out,
                &format!("{key}.replicas[{r}].version"),
                "every replica needs a version when [pools.canary] is set",
            ),
            Some(v) if !canary.weights.contains_key(v) => push(
                out,
                &format!("{key}.replicas[{r}].version"),
                &format!("version {v:?} has no weight in canary.weights"),
            ),
            Some(v) => *replicas_per_version.entry(v).or_default() += 1,
        }
    }
    for (version, weight) in &canary.weights {
        if *weight > 0 && !replicas_per_version.contains_key(version.as_str()) {
            push(
                out,
                &format!("{key}.canary.weights.{version}"),
                "no replica runs this version",
            );
        }
    }
}

fn validate_tiers(config: &Config, pools: &HashSet<&str>, out: &mut Vec<ConfigIssue>) {
    let mut replica_names: HashSet<String> = HashSet::new();
    for pool in &config.pools {
        for r in &pool.replicas {
            if let Some(name) = r.name.clone().or_else(|| parse_replica_url(&r.url).ok()) {
                replica_names.insert(name);
            }
        }
    }
    let mut claimed: HashMap<&str, usize> = HashMap::new();
    for (i, tier) in config.tiers.iter().enumerate() {
        let key = format!("tiers[{i}]");
        if let Some(pool) = &tier.pool {
            if !pools.contains(pool.as_str()) {
                push(
                    out,
                    &format!("{key}.pool"),
                    &format!("unknown pool {pool:?}"),
                );
            }
            if !tier.replicas.is_empty() {
                push(
                    out,
                    &format!("{key}.replicas"),
                    "give either pool or replicas, not both",
                );
            }
        }
        for (r, name) in tier.replicas.iter().enumerate() {
            if !replica_names.contains(name) {
                push(
                    out,
                    &format!("{key}.replicas[{r}]"),
                    &format!("no replica is named {name:?}"),
                );
            } else if let Some(first) = claimed.insert(name, i) {
                push(
                    out,
                    &format!("{key}.replicas[{r}]"),
                    &format!("replica {name:?} is already reserved by tiers[{first}]"),
                );
            }
        }
        if tier.overflow && tier.pool.is_none() && tier.replicas.is_empty() {
            push(
                out,
                &format!("{key}.overflow"),
                "needs pool or replicas to overflow from",
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{PrefixMode, StickySource, parse};

    const POOL: &str = "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n";

    /// The dotted keys of every issue `text` has, in order.
    fn issue_keys(text: &str) -> Vec<String> {
        parse(text)
            .unwrap_err()
            .into_iter()
            .map(|i| i.key)
            .collect()
    }

    fn replica(port: u16, extra: &str) -> String {
        format!("[[pools.replicas]]\nurl = \"http://127.0.0.1:{port}\"\n{extra}\n")
    }

    #[test]
    fn cost_switches_have_defaults_and_a_bad_value_names_the_key() {
        use super::super::{Evictions, KvWait, Preemptions};
        let with = |extra: &str| {
            format!(
                "{POOL}[pools.prefix]\nmode = \"cache\"\n{extra}\n{}",
                replica(1, "")
            )
        };
        let prefix = |extra: &str| parse(&with(extra)).unwrap().pools[0].prefix.clone();
        // The KV wait is off unless asked for; evictions and preemptions
        // are charged unless declared free.
        assert_eq!(prefix("").kv_wait, KvWait::None);
        assert_eq!(prefix("").evictions, Evictions::Charged);
        assert_eq!(prefix("kv_wait = \"batch\"").kv_wait, KvWait::Batch);
        assert_eq!(prefix("evictions = \"free\"").evictions, Evictions::Free);
        assert_eq!(prefix("").preemptions, Preemptions::Charged);
        assert_eq!(
            prefix("preemptions = \"free\"").preemptions,
            Preemptions::Free
        );
        for (bad, key) in [
            ("kv_wait = \"always\"", "pools[0].prefix.kv_wait"),
            ("evictions = \"yes\"", "pools[0].prefix.evictions"),
            ("preemptions = \"some\"", "pools[0].prefix.preemptions"),
        ] {
            assert_eq!(issue_keys(&with(bad)), vec![key], "{bad}");
        }
    }

    #[test]
    fn full_routing_config_parses() {
        let text = format!(
            "default_pool = \"p\"\n[aliases]\ngpt = \"m\"\n\
             [[tiers]]\nname = \"paid\"\npriority = \"high\"\nreplicas = [\"a\"]\noverflow = true\n\
             [[tiers]]\nname = \"free\"\npriority = \"low\"\nreplicas = [\"b\"]\n\
             {POOL}[pools.prefix]\nmode = \"cache\"\nblock_size = 16\n\
             [pools.canary]\nweights = {{ v1 = 95, v2 = 5 }}\nsticky = [\"session\", \"user\"]\n\
             [pools.session]\nheader = \"x-conversation\"\naffinity = true\n{}{}",
            replica(1, "name = \"a\"\nversion = \"v1\""),
            replica(2, "name = \"b\"\nversion = \"v2\""),
        );
        let c = parse(&text).unwrap();
        let p = &c.pools[0];
        assert_eq!(p.prefix.mode, PrefixMode::Cache);
        let canary = p.canary.as_ref().unwrap();
        assert_eq!(canary.weights["v2"], 5);
        assert_eq!(
            canary.sticky,
            vec![StickySource::Session, StickySource::User]
        );
        assert_eq!(canary.header, "x-llmlb-version");
        assert_eq!(c.aliases["gpt"], "m");
        assert!(c.tiers[0].overflow);
    }

    #[test]
    fn dangling_names_are_reported_with_keys() {
        let text = format!(
            "default_pool = \"nope\"\n[aliases]\nm = \"m\"\nx = \"ghost\"\n\
             [[tiers]]\nname = \"paid\"\npriority = \"high\"\npool = \"zz\"\n\
             [[tiers]]\nname = \"free\"\npriority = \"low\"\nreplicas = [\"who\"]\n\
             [[tiers]]\nname = \"trial\"\npriority = \"low\"\noverflow = true\n\
             {POOL}{}",
            replica(1, "")
        );
        let keys = issue_keys(&text);
        assert_eq!(
            keys,
            vec![
                "default_pool",
                "aliases.m",
                "aliases.x",
                "tiers[0].pool",
                "tiers[1].replicas[0]",
                "tiers[2].overflow"
            ]
        );
    }

    #[test]
    fn canary_versions_must_match_replicas() {
        let text = format!(
            "{POOL}[pools.canary]\nweights = {{ v1 = 90, v2 = 10 }}\nsticky = [\"user\", \"user\"]\n{}{}",
            replica(1, "version = \"v1\""),
            replica(2, "version = \"v3\""),
        );
        let keys = issue_keys(&text);
        assert_eq!(
            keys,
            vec![
                "pools[0].canary.sticky[1]",
                "pools[0].replicas[1].version",
                "pools[0].canary.weights.v2"
            ]
        );
    }

    #[test]
    fn prefix_parameters_are_checked() {
        let text = format!(
            "{POOL}[pools.prefix]\nmode = \"hash\"\ntokens = 0\nblock_size = 0\nprefill_tokens_per_second = -1.0\nrate_band = 0.5\nfit_band = 0.9\nreplicate_above = 0.5\nreplicate_hold = \"0s\"\n[pools.saturation]\nmax_in_flight = 0\nmax_kv_usage = 1.5\n{}",
            replica(1, "")
        );
        let keys = issue_keys(&text);
        assert_eq!(
            keys,
            vec![
                "pools[0].prefix.tokens",
                "pools[0].prefix.block_size",
                "pools[0].prefix.prefill_tokens_per_second",
                "pools[0].prefix.rate_band",
                "pools[0].prefix.fit_band",
                "pools[0].prefix.replicate_above",
                "pools[0].prefix.replicate_hold",
                "pools[0].saturation.max_in_flight",
                "pools[0].saturation.max_kv_usage"
            ]
        );
        let bad_mode = format!("{POOL}[pools.prefix]\nmode = \"radix\"\n{}", replica(1, ""));
        let issues = parse(&bad_mode).unwrap_err();
        assert_eq!(issues[0].key, "pools[0].prefix.mode");
    }
}

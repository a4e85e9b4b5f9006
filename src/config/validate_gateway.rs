//! Rules for the gateway and admission sections: names that refer to each
//! other must exist, hashes must be hashes, limits must be positive.

use std::collections::HashMap;

use super::validate::push;
use super::{Config, ConfigIssue};

pub fn validate(config: &Config, out: &mut Vec<ConfigIssue>) {
    let mut levels: HashMap<&str, usize> = HashMap::new();
    if config.priorities.is_empty() {
        push(out, "priorities", "list at least one priority level");
    }
    for (i, p) in config.priorities.iter().enumerate() {
        if p.name.is_empty() {
            push(out, &format!("priorities[{i}].name"), "must not be empty");
        } else if let Some(first) = levels.insert(&p.name, i) {
            push(
                out,
                &format!("priorities[{i}].name"),
                &format!("duplicate level {:?} (also priorities[{first}])", p.name),
            );
        }
        for (field, d) in [
            ("max_wait", p.max_wait),
            ("promote_after", p.promote_after),
            ("ttft_objective", p.ttft_objective),
        ] {
            if d.is_some_and(|d| d.is_zero()) {
                push(
                    out,
                    &format!("priorities[{i}].{field}"),
                    "must be greater than 0",
                );
            }
        }
    }

    let mut tiers: HashMap<&str, usize> = HashMap::new();
    for (i, t) in config.tiers.iter().enumerate() {
        if t.name.is_empty() {
            push(out, &format!("tiers[{i}].name"), "must not be empty");
        } else if let Some(first) = tiers.insert(&t.name, i) {
            push(
                out,
                &format!("tiers[{i}].name"),
                &format!("duplicate tier {:?} (also tiers[{first}])", t.name),
            );
        }
        if !levels.contains_key(t.priority.as_str()) {
            push(
                out,
                &format!("tiers[{i}].priority"),
                &format!(
                    "unknown priority level {:?}; known: {}",
                    t.priority,
                    names(&levels)
                ),
            );
        }
    }

    if let Some(tier) = &config.gateway.default_tier
        && !tiers.contains_key(tier.as_str())
    {
        push(
            out,
            "gateway.default_tier",
            &format!("unknown tier {tier:?}"),
        );
    }
    if config.gateway.auth && config.keys.is_empty() {
        push(
            out,
            "gateway.auth",
            "auth is on but no [[keys]] are configured",
        );
    }

    if config.limits.backend == super::LimitsBackend::Redis {
        match &config.limits.url {
            None => push(out, "limits.url", "required with backend = \"redis\""),
            Some(url) => {
                if let Err(e) = super::StoreUrl::parse(url) {
                    push(
                        out,
                        "limits.url",
                        &format!("invalid Redis URL {:?}: {e}", super::redact_url(url)),
                    );
                }
            }
        }
    }
    if config.limits.timeout.is_zero() {
        push(out, "limits.timeout", "must be greater than 0");
    }

    let mut hashes: HashMap<String, usize> = HashMap::new();
    for (i, k) in config.keys.iter().enumerate() {
        let key = format!("keys[{i}]");
        let h = k.sha256.to_ascii_lowercase();
        if h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()) {
            push(
                out,
                &format!("{key}.sha256"),
                "must be 64 hex digits (the output of `llmlb hash-key`), never the key itself",
            );
        } else if let Some(first) = hashes.insert(h, i) {
            push(
                out,
                &format!("{key}.sha256"),
                &format!("duplicate key (also keys[{first}])"),
            );
        }
        if k.tenant.is_empty() {
            push(out, &format!("{key}.tenant"), "must not be empty");
        }
        if !tiers.contains_key(k.tier.as_str()) {
            push(
                out,
                &format!("{key}.tier"),
                &format!("unknown tier {:?}", k.tier),
            );
        }
        if k.requests_per_minute == Some(0) {
            push(
                out,
                &format!("{key}.requests_per_minute"),
                "must be at least 1 (omit it for no limit)",
            );
        }
        if k.tokens_per_minute == Some(0) {
            push(
                out,
                &format!("{key}.tokens_per_minute"),
                "must be at least 1 (omit it for no limit)",
            );
        }
    }

    for (i, pool) in config.pools.iter().enumerate() {
        let key = format!("pools[{i}]");
        if pool.max_inflight == Some(0) {
            push(out, &format!("{key}.max_inflight"), "must be at least 1");
        }
        for (r, replica) in pool.replicas.iter().enumerate() {
            if replica.max_inflight == Some(0) {
                push(
                    out,
                    &format!("{key}.replicas[{r}].max_inflight"),
                    "must be at least 1",
                );
            }
        }
        if let Some(p) = pool.max_prefilling {
            let limited = pool.max_inflight.is_some()
                || (!pool.replicas.is_empty()
                    && pool.replicas.iter().all(|r| r.max_inflight.is_some()));
            if p == 0 {
                push(out, &format!("{key}.max_prefilling"), "must be at least 1");
            } else if !limited {
                push(
                    out,
                    &format!("{key}.max_prefilling"),
                    "needs max_inflight: the requests it holds back wait in the pool's queue, which max_inflight turns on",
                );
            }
        }
        let q = &pool.queue;
        if q.max_depth == 0 {
            push(out, &format!("{key}.queue.max_depth"), "must be at least 1");
        }
        for (field, d) in [
            ("max_wait", q.max_wait),
            ("timeout", q.timeout),
            ("promote_after", q.promote_after),
        ] {
            if d.is_zero() {
                push(
                    out,
                    &format!("{key}.queue.{field}"),
                    "must be greater than 0",
                );
            }
        }
    }
}

fn names(map: &HashMap<&str, usize>) -> String {
    let mut v: Vec<(&usize, &&str)> = map.iter().map(|(k, i)| (i, k)).collect();
    v.sort();
    v.iter()
        .map(|(_, k)| format!("{k:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::super::parse;

    const POOL: &str = "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\nmax_inflight = 4\n[[pools.replicas]]\nurl = \"http://127.0.0.1:1\"\n";
    const HASH: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    #[test]
    fn paid_free_setup_is_valid() {
        let text = format!(
            "{POOL}[gateway]\nauth = true\ndefault_tier = \"free\"\n[[tiers]]\nname = \"paid\"\npriority = \"high\"\n[[tiers]]\nname = \"free\"\npriority = \"low\"\n[[keys]]\nsha256 = \"{HASH}\"\ntenant = \"acme\"\ntier = \"paid\"\nrequests_per_minute = 600\n"
        );
        let c = parse(&text).unwrap();
        assert_eq!(c.priorities.len(), 2);
        assert_eq!(c.pools[0].max_inflight, Some(4));
    }

    #[test]
    fn max_prefilling_is_positive_and_needs_max_inflight() {
        let ok = parse(&POOL.replace("max_inflight = 4", "max_inflight = 4\nmax_prefilling = 2"));
        assert_eq!(ok.unwrap().pools[0].max_prefilling, Some(2));
        let zero = POOL.replace("max_inflight = 4", "max_inflight = 4\nmax_prefilling = 0");
        let issues = parse(&zero).unwrap_err();
        assert_eq!(issues[0].key, "pools[0].max_prefilling");
        assert!(issues[0].reason.contains("at least 1"), "{:?}", issues[0]);
        let unlimited = POOL.replace("max_inflight = 4", "max_prefilling = 2");
        let issues = parse(&unlimited).unwrap_err();
        assert_eq!(issues[0].key, "pools[0].max_prefilling");
        assert!(
            issues[0].reason.contains("needs max_inflight"),
            "{:?}",
            issues[0]
        );
    }

    #[test]
    fn a_ttft_objective_is_a_positive_duration() {
        let level = |v: &str| {
            format!(
                "{POOL}[[priorities]]\nname = \"high\"\n[[priorities]]\nname = \"low\"\nttft_objective = {v}\n"
            )
        };
        let c = parse(&level("\"2s\"")).unwrap();
        assert_eq!(
            c.priorities[1].ttft_objective,
            Some(std::time::Duration::from_secs(2))
        );
        assert_eq!(c.priorities[0].ttft_objective, None);
        for bad in ["\"0s\"", "\"soon\""] {
            let issues = parse(&level(bad)).unwrap_err();
            assert_eq!(
                issues[0].key, "priorities[1].ttft_objective",
                "{bad}: {issues:?}"
            );
        }
    }

    #[test]
    fn redis_limits_need_a_valid_url() {
        let ok =
            format!("limits = {{ backend = \"redis\", url = \"redis://127.0.0.1:6379\" }}\n{POOL}");
        assert!(parse(&ok).is_ok());
        let missing = format!("limits = {{ backend = \"redis\" }}\n{POOL}");
        assert_eq!(parse(&missing).unwrap_err()[0].key, "limits.url");
        let bad = format!("limits = {{ backend = \"redis\", url = \"http://x\" }}\n{POOL}");
        assert_eq!(parse(&bad).unwrap_err()[0].key, "limits.url");
    }

    #[test]
    fn dangling_names_and_bad_hashes_are_reported() {
        let text = format!(
            "{POOL}[gateway]\nauth = true\ndefault_tier = \"gold\"\n[[tiers]]\nname = \"paid\"\npriority = \"urgent\"\n[[keys]]\nsha256 = \"sk-live-123\"\ntenant = \"acme\"\ntier = \"vip\"\ntokens_per_minute = 0\n"
        );
        let issues = parse(&text).unwrap_err();
        let keys: Vec<&str> = issues.iter().map(|i| i.key.as_str()).collect();
        assert_eq!(
            keys,
            vec![
                "tiers[0].priority",
                "gateway.default_tier",
                "keys[0].sha256",
                "keys[0].tier",
                "keys[0].tokens_per_minute"
            ]
        );
    }
}

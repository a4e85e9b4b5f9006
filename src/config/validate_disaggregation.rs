//! Rules of prefill/decode disaggregation: a `[pools.disaggregation]` names
//! an existing prefill pool; a prefill pool is reached only through it.

use std::collections::HashMap;

use super::validate::push;
use super::{Config, ConfigIssue, PoolRole};

pub fn validate(config: &Config, out: &mut Vec<ConfigIssue>) {
    let roles: HashMap<&str, PoolRole> = config
        .pools
        .iter()
        .map(|p| (p.name.as_str(), p.role))
        .collect();
    for (i, pool) in config.pools.iter().enumerate() {
        let key = format!("pools[{i}]");
        if pool.role == PoolRole::Prefill {
            if !pool.models.is_empty() || pool.models_from_replicas {
                push(
                    out,
                    &format!("{key}.models"),
                    "a prefill pool is not routed to by model name: list its models on the pool that names it in [pools.disaggregation] prefill_pool",
                );
            }
            if pool.disaggregation.is_some() {
                push(
                    out,
                    &format!("{key}.disaggregation"),
                    "a prefill pool cannot itself hand its requests to a prefill pool",
                );
            }
            if pool.canary.is_some() {
                push(
                    out,
                    &format!("{key}.canary"),
                    "canary splits apply to the pool that serves the model, not to its prefill pool",
                );
            }
            if config.default_pool.as_deref() == Some(pool.name.as_str()) {
                push(
                    out,
                    "default_pool",
                    &format!("{:?} is a prefill pool", pool.name),
                );
            }
        }
        let Some(d) = &pool.disaggregation else {
            continue;
        };
        let key = format!("{key}.disaggregation");
        match roles.get(d.prefill_pool.as_str()) {
            None => push(
                out,
                &format!("{key}.prefill_pool"),
                &format!("unknown pool {:?}", d.prefill_pool),
            ),
            Some(PoolRole::Serve) => push(
                out,
                &format!("{key}.prefill_pool"),
                &format!("pool {:?} does not have role = \"prefill\"", d.prefill_pool),
            ),
            Some(PoolRole::Prefill) => {}
        }
        if d.prefill_timeout.is_zero() {
            push(
                out,
                &format!("{key}.prefill_timeout"),
                "must be greater than 0",
            );
        }
        if d.prefill_attempts == 0 {
            push(
                out,
                &format!("{key}.prefill_attempts"),
                "must be at least 1",
            );
        }
        if d.protocol == super::KvProtocol::Sglang && d.bootstrap_port == 0 {
            push(
                out,
                &format!("{key}.bootstrap_port"),
                "must be greater than 0",
            );
        }
    }
    for (t, tier) in config.tiers.iter().enumerate() {
        if let Some(p) = &tier.pool
            && roles.get(p.as_str()) == Some(&PoolRole::Prefill)
        {
            push(
                out,
                &format!("tiers[{t}].pool"),
                &format!("{p:?} is a prefill pool"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{DisaggregateWhen, KvProtocol, parse};

    const PAIR: &str = r#"
        [[pools]]
        name = "chat"
        models = ["m"]
        [pools.disaggregation]
        prefill_pool = "chat-prefill"
        [[pools.replicas]]
        url = "http://127.0.0.1:8001"
        [[pools]]
        name = "chat-prefill"
        role = "prefill"
        [[pools.replicas]]
        url = "http://127.0.0.1:8002"
    "#;

    fn issues(text: &str) -> Vec<(String, String)> {
        parse(text)
            .unwrap_err()
            .into_iter()
            .map(|i| (i.key, i.reason))
            .collect()
    }

    #[test]
    fn a_pool_and_its_prefill_pool_parse_with_defaults() {
        let c = parse(PAIR).unwrap();
        let d = c.pools[0].disaggregation.as_ref().unwrap();
        assert_eq!(d.prefill_pool, "chat-prefill");
        assert_eq!(d.protocol, KvProtocol::Vllm);
        assert_eq!(d.when, DisaggregateWhen::Auto);
        assert_eq!(d.min_uncached_tokens, 512);
        assert_eq!(d.prefill_attempts, 2);
        assert!(d.fallback);
        assert_eq!(c.pools[1].role, super::PoolRole::Prefill);
    }

    #[test]
    fn the_prefill_pool_must_exist_and_have_the_prefill_role() {
        let unknown =
            issues(&PAIR.replace("prefill_pool = \"chat-prefill\"", "prefill_pool = \"nope\""));
        assert_eq!(unknown.len(), 1, "{unknown:?}");
        assert_eq!(unknown[0].0, "pools[0].disaggregation.prefill_pool");
        assert!(unknown[0].1.contains("unknown pool \"nope\""));
        let serving = issues(&PAIR.replace("role = \"prefill\"", "models = [\"other\"]"));
        assert_eq!(serving.len(), 1, "{serving:?}");
        assert!(serving[0].1.contains("does not have role = \"prefill\""));
    }

    #[test]
    fn a_prefill_pool_lists_no_models_and_is_no_default() {
        let text = format!(
            "default_pool = \"chat-prefill\"\n{}",
            PAIR.replace("role = \"prefill\"", "role = \"prefill\"\nmodels = [\"x\"]")
        );
        let keys: Vec<String> = issues(&text).into_iter().map(|i| i.0).collect();
        assert!(keys.contains(&"pools[1].models".to_string()), "{keys:?}");
        assert!(keys.contains(&"default_pool".to_string()), "{keys:?}");
    }

    #[test]
    fn bad_values_and_unknown_keys_are_named() {
        let text = PAIR.replace(
            "prefill_pool = \"chat-prefill\"",
            "prefill_pool = \"chat-prefill\"\nprefill_timeout = \"0s\"\nprefill_attempts = 0",
        );
        let keys: Vec<String> = issues(&text).into_iter().map(|i| i.0).collect();
        assert_eq!(
            keys,
            vec![
                "pools[0].disaggregation.prefill_timeout",
                "pools[0].disaggregation.prefill_attempts"
            ]
        );
        let typo = issues(&PAIR.replace("prefill_pool =", "protocl = \"vllm\"\nprefill_pool ="));
        assert!(typo[0].0.starts_with("pools[0]"), "{typo:?}");
        assert!(typo[0].1.contains("protocl"), "{typo:?}");
        let proto = issues(&PAIR.replace("prefill_pool =", "protocol = \"nixl\"\nprefill_pool ="));
        assert!(proto[0].1.contains("nixl"), "{proto:?}");
    }
}

//! Rules for fair share among tenants: `[[tenants]]` (unique names,
//! positive weights and bounds), each pool queue's `prompt_weight` and
//! `tenant_max_depth`, and the gateway's tenant header.

use std::collections::HashMap;

use super::validate::push;
use super::{Config, ConfigIssue};

pub fn validate(config: &Config, out: &mut Vec<ConfigIssue>) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (i, t) in config.tenants.iter().enumerate() {
        let key = format!("tenants[{i}]");
        if t.name.is_empty() {
            push(out, &format!("{key}.name"), "must not be empty");
        } else if let Some(first) = seen.insert(&t.name, i) {
            push(
                out,
                &format!("{key}.name"),
                &format!("duplicate tenant {:?} (also tenants[{first}])", t.name),
            );
        }
        if !(t.weight.is_finite() && t.weight > 0.0) {
            push(
                out,
                &format!("{key}.weight"),
                "must be a number greater than 0",
            );
        }
        if t.max_depth == Some(0) {
            push(out, &format!("{key}.max_depth"), "must be at least 1");
        }
    }
    for (i, pool) in config.pools.iter().enumerate() {
        let q = &pool.queue;
        let key = format!("pools[{i}].queue");
        if !(q.prompt_weight.is_finite() && q.prompt_weight >= 0.0) {
            push(
                out,
                &format!("{key}.prompt_weight"),
                "must be a number of at least 0",
            );
        }
        if q.tenant_max_depth == Some(0) {
            push(
                out,
                &format!("{key}.tenant_max_depth"),
                "must be at least 1",
            );
        }
    }
    if let Some(h) = &config.gateway.tenant_header
        && http::HeaderName::from_bytes(h.as_bytes()).is_err()
    {
        push(
            out,
            "gateway.tenant_header",
            &format!("{h:?} is not a valid header name"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse;

    const POOL: &str = "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\nmax_inflight = 4\n[[pools.replicas]]\nurl = \"http://127.0.0.1:1\"\n";

    #[test]
    fn tenants_with_weights_and_bounds_parse() {
        let text = format!(
            "[[tenants]]\nname = \"batch\"\nweight = 1\nmax_depth = 16\n[[tenants]]\nname = \"chat\"\nweight = 2.5\n\
             {POOL}[pools.queue]\nfairness = \"tenants\"\nprompt_weight = 0.25\ntenant_max_depth = 64\n"
        );
        let c = parse(&text).unwrap();
        assert_eq!(c.tenants.len(), 2);
        assert_eq!(c.tenants[1].weight, 2.5);
        assert_eq!(c.tenants[0].max_depth, Some(16));
        assert_eq!(c.pools[0].queue.tenant_max_depth, Some(64));
        assert_eq!(c.pools[0].queue.prompt_weight, 0.25);
        let default = parse(&format!("[[tenants]]\nname = \"a\"\n{POOL}")).unwrap();
        assert_eq!(default.tenants[0].weight, 1.0);
        assert_eq!(default.pools[0].queue.prompt_weight, 0.5);
    }

    #[test]
    fn bad_tenants_are_reported_by_dotted_key() {
        let text = format!(
            "[[tenants]]\nname = \"a\"\nweight = 0\n[[tenants]]\nname = \"a\"\nmax_depth = 0\n\
             [gateway]\ntenant_header = \"bad header\"\n\
             {POOL}[pools.queue]\nprompt_weight = -1\ntenant_max_depth = 0\n"
        );
        let issues = parse(&text).unwrap_err();
        let keys: Vec<&str> = issues.iter().map(|i| i.key.as_str()).collect();
        assert_eq!(
            keys,
            vec![
                "tenants[0].weight",
                "tenants[1].name",
                "tenants[1].max_depth",
                "pools[0].queue.prompt_weight",
                "pools[0].queue.tenant_max_depth",
                "gateway.tenant_header",
            ]
        );
        let unknown = parse(&format!("{POOL}[pools.queue]\nfairness = \"lottery\"\n")).unwrap_err();
        assert!(unknown[0].key.contains("fairness"), "{unknown:?}");
    }
}

//! Rules that span fields: uniqueness, ranges, URLs. Every rule reports the
//! dotted key it is about; all problems are collected, not just the first.

use std::collections::HashMap;

use super::{Config, ConfigIssue, PoolConfig};

pub fn validate(config: &Config) -> Vec<ConfigIssue> {
    let mut out = Vec::new();
    if config.server.listen == config.server.admin_listen && config.server.listen.port() != 0 {
        push(
            &mut out,
            "server.admin_listen",
            "must differ from server.listen",
        );
    }
    if config.server.max_body_bytes == 0 {
        push(&mut out, "server.max_body_bytes", "must be greater than 0");
    }
    let server = &config.server;
    if server.max_header_bytes < 8192 {
        push(&mut out, "server.max_header_bytes", "must be at least 8192");
    }
    for (key, zero) in [
        ("server.max_headers", server.max_headers == 0),
        ("server.max_connections", server.max_connections == 0),
        (
            "server.header_read_timeout",
            server.header_read_timeout.is_zero(),
        ),
        (
            "server.client_idle_timeout",
            server.client_idle_timeout.is_zero(),
        ),
        ("server.body_timeout", server.body_timeout.is_zero()),
        ("server.max_buffered_bytes", server.max_buffered_bytes == 0),
    ] {
        if zero {
            push(&mut out, key, "must be greater than 0");
        }
    }
    if let Some(tls) = &server.tls
        && let Err(e) = super::server_tls(tls, server.http2)
    {
        push(&mut out, "server.tls", &e.to_string());
    }
    if server.max_connections > 1_000_000 {
        push(
            &mut out,
            "server.max_connections",
            "must be at most 1000000",
        );
    }
    if config.pools.is_empty() {
        push(
            &mut out,
            "pools",
            "at least one [[pools]] entry is required",
        );
    }
    let mut pool_names: HashMap<&str, usize> = HashMap::new();
    let mut model_owner: HashMap<&str, usize> = HashMap::new();
    for (i, pool) in config.pools.iter().enumerate() {
        let key = format!("pools[{i}]");
        if pool.name.trim().is_empty() {
            push(&mut out, &format!("{key}.name"), "must not be empty");
        } else if let Some(first) = pool_names.insert(&pool.name, i) {
            push(
                &mut out,
                &format!("{key}.name"),
                &format!("duplicate pool name {:?} (also pools[{first}])", pool.name),
            );
        }
        if pool.models.is_empty()
            && !pool.models_from_replicas
            && pool.role != super::PoolRole::Prefill
        {
            push(
                &mut out,
                &format!("{key}.models"),
                "list at least one model name (or set models_from_replicas = true)",
            );
        }
        for (m, model) in pool.models.iter().enumerate() {
            if model.is_empty() {
                push(&mut out, &format!("{key}.models[{m}]"), "must not be empty");
            } else if let Some(owner) = model_owner.insert(model, i) {
                push(
                    &mut out,
                    &format!("{key}.models[{m}]"),
                    &format!("model {model:?} is already served by pools[{owner}]"),
                );
            }
        }
        validate_pool(&mut out, &key, pool);
    }
    super::validate_gateway::validate(config, &mut out);
    if let Some(fleet) = &config.fleet {
        super::fleet::validate(fleet, &mut out);
    }
    super::validate_routing::validate(config, &mut out);
    super::validate_disaggregation::validate(config, &mut out);
    super::validate_tenants::validate(config, &mut out);
    super::telemetry::validate(&config.telemetry, &mut out);
    out
}

fn validate_pool(out: &mut Vec<ConfigIssue>, key: &str, pool: &PoolConfig) {
    if let Some(k) = &pool.upstream_api_key
        && (k.is_empty() || http::HeaderValue::from_str(&format!("Bearer {k}")).is_err())
    {
        push(
            out,
            &format!("{key}.upstream_api_key"),
            "must be non-empty visible ASCII",
        );
    }
    if pool.replicas.is_empty() && pool.discovery.is_none() {
        push(
            out,
            &format!("{key}.replicas"),
            "list at least one replica, or set `discovery`",
        );
    }
    if let Some(d) = &pool.discovery {
        if !pool.replicas.is_empty() {
            push(
                out,
                &format!("{key}.discovery"),
                "set either `discovery` or `replicas`, not both",
            );
        }
        if d.dns.trim().is_empty() {
            push(out, &format!("{key}.discovery.dns"), "must not be empty");
        }
        if d.port == 0 {
            push(
                out,
                &format!("{key}.discovery.port"),
                "must be a port number (1-65535)",
            );
        }
        if d.interval.is_zero() {
            push(
                out,
                &format!("{key}.discovery.interval"),
                "must be greater than 0",
            );
        }
    }

    if pool.timeouts.connect.is_zero() {
        push(
            out,
            &format!("{key}.timeouts.connect"),
            "must be greater than 0",
        );
    }
    if pool.timeouts.first_byte.is_zero() {
        push(
            out,
            &format!("{key}.timeouts.first_byte"),
            "must be greater than 0",
        );
    }
    if pool.timeouts.idle.is_zero() {
        push(
            out,
            &format!("{key}.timeouts.idle"),
            "must be greater than 0",
        );
    }
    if pool.outlier.consecutive_failures == 0 {
        push(
            out,
            &format!("{key}.outlier.consecutive_failures"),
            "must be at least 1",
        );
    }
    if let Err(e) = super::UpstreamTrust::read(&pool.tls) {
        push(out, &format!("{key}.tls.{}", e.key()), &e.to_string());
    }
    if let Some(t) = &pool.tokenizer
        && let Err(e) = crate::tokenize::PromptTokenizer::load(&t.dir)
    {
        push(out, &format!("{key}.tokenizer.dir"), &e.to_string());
    }
    super::validate_load::validate_load(out, key, pool);
    super::validate_kv_events::validate_pool(out, key, pool);
    let mut urls: HashMap<String, usize> = HashMap::new();
    let mut names: HashMap<String, usize> = HashMap::new();
    for (r, replica) in pool.replicas.iter().enumerate() {
        let rkey = format!("{key}.replicas[{r}]");
        match parse_replica_url(&replica.url) {
            Ok(authority) => {
                if let Some(first) = urls.insert(authority.clone(), r) {
                    push(
                        out,
                        &format!("{rkey}.url"),
                        &format!("duplicate replica {authority} (also {key}.replicas[{first}])"),
                    );
                }
                let name = replica.name.clone().unwrap_or(authority);
                if let Some(first) = names.insert(name.clone(), r) {
                    push(
                        out,
                        &format!("{rkey}.name"),
                        &format!("duplicate replica name {name:?} (also {key}.replicas[{first}])"),
                    );
                }
            }
            Err(reason) => push(out, &format!("{rkey}.url"), &reason),
        }
        if replica.weight == 0 {
            push(out, &format!("{rkey}.weight"), "must be at least 1");
        } else if replica.weight > 1000 {
            push(out, &format!("{rkey}.weight"), "must be at most 1000");
        }
    }
}

/// Checks a replica URL and returns its `host:port`.
pub fn parse_replica_url(url: &str) -> Result<String, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| format!("invalid URL {url:?}: {e}"))?;
    let default_port = match uri.scheme_str() {
        Some("http") => 80,
        Some("https") => 443,
        Some(other) => {
            return Err(format!(
                "unsupported scheme {other:?} in {url:?}; use http:// or https://"
            ));
        }
        None => {
            return Err(format!(
                "{url:?} needs a scheme, e.g. http://127.0.0.1:8000"
            ));
        }
    };
    let authority = uri
        .authority()
        .ok_or_else(|| format!("{url:?} has no host"))?;
    if uri.path() != "/" && !uri.path().is_empty() {
        return Err(format!(
            "{url:?} has a path; give only scheme, host and port"
        ));
    }
    let port = authority.port_u16().unwrap_or(default_port);
    Ok(format!("{}:{port}", authority.host()))
}

pub(super) fn push(out: &mut Vec<ConfigIssue>, key: &str, reason: &str) {
    out.push(ConfigIssue {
        key: key.to_string(),
        reason: reason.to_string(),
    });
}

#[cfg(test)]
mod tests {
    use super::super::parse;

    const GOOD: &str = r#"
        [server]
        listen = "127.0.0.1:8080"
        admin_listen = "127.0.0.1:9090"
        [[pools]]
        name = "llama"
        models = ["llama-3-8b"]
        [[pools.replicas]]
        url = "http://127.0.0.1:8001"
    "#;

    #[test]
    fn accepts_minimal_config() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.pools[0].replicas[0].weight, 1);
        assert_eq!(c.pools[0].retries, 2);
    }

    #[test]
    fn unknown_key_is_named() {
        let text = GOOD.replace("models =", "modles = [\"x\"]\nmodels =");
        let issues = parse(&text).unwrap_err();
        assert_eq!(issues.len(), 1);
        assert!(issues[0].key.starts_with("pools[0]"), "{issues:?}");
        assert!(issues[0].reason.contains("modles"), "{issues:?}");
    }

    #[test]
    fn bad_url_and_weight_reported_together() {
        let text = GOOD.replace(
            "url = \"http://127.0.0.1:8001\"",
            "url = \"ftp://x\"\nweight = 0\n[[pools.replicas]]\nurl = \"http://127.0.0.1:8002\"\n[[pools.replicas]]\nurl = \"nonsense\"",
        );
        let issues = parse(&text).unwrap_err();
        let keys: Vec<&str> = issues.iter().map(|i| i.key.as_str()).collect();
        assert_eq!(
            keys,
            vec![
                "pools[0].replicas[0].url",
                "pools[0].replicas[0].weight",
                "pools[0].replicas[2].url"
            ]
        );
    }

    #[test]
    fn duplicate_model_across_pools() {
        let text = format!(
            "{GOOD}\n[[pools]]\nname = \"b\"\nmodels = [\"llama-3-8b\"]\n[[pools.replicas]]\nurl = \"http://127.0.0.1:9001\"\n"
        );
        let issues = parse(&text).unwrap_err();
        assert_eq!(issues[0].key, "pools[1].models[0]");
    }

    #[test]
    fn https_replicas_are_accepted() {
        let text = GOOD.replace("http://127.0.0.1:8001", "https://vllm-0.internal");
        let c = parse(&text).unwrap();
        assert_eq!(c.pools[0].replicas[0].url, "https://vllm-0.internal");
        assert_eq!(
            super::parse_replica_url("https://vllm-0.internal").unwrap(),
            "vllm-0.internal:443"
        );
    }

    #[test]
    fn unreadable_ca_file_names_key() {
        let text = format!("{GOOD}\n[pools.tls]\nca_file = \"/nonexistent/ca.pem\"\n");
        let issues = parse(&text).unwrap_err();
        assert_eq!(issues.len(), 1, "{issues:?}");
        assert_eq!(issues[0].key, "pools[0].tls.ca_file");
        assert!(
            issues[0].reason.contains("/nonexistent/ca.pem"),
            "{issues:?}"
        );
    }

    #[test]
    fn unusable_tokenizer_dir_names_key_and_file() {
        let text = format!("{GOOD}\n[pools.tokenizer]\ndir = \"/nonexistent/model\"\n");
        let issues = parse(&text).unwrap_err();
        assert_eq!(issues.len(), 1, "{issues:?}");
        assert_eq!(issues[0].key, "pools[0].tokenizer.dir");
        assert!(
            issues[0]
                .reason
                .contains("/nonexistent/model: not a directory")
        );
        let text = format!("{GOOD}\n[pools.tokenizer]\ndir = \"/\"\n");
        let issues = parse(&text).unwrap_err();
        assert!(issues[0].reason.contains("/tokenizer.json"), "{issues:?}");
        let text =
            format!("{GOOD}\n[pools.tokenizer]\ndir = \"../shared/tokenizers/tiny-llama\"\n");
        let config = parse(&text).unwrap();
        assert!(config.pools[0].tokenizer.is_some());
    }

    #[test]
    fn bad_duration_names_key() {
        let text = format!("{GOOD}\n[pools.timeouts]\nconnect = \"soon\"\n");
        let issues = parse(&text).unwrap_err();
        assert_eq!(issues[0].key, "pools[0].timeouts.connect");
        assert!(issues[0].reason.contains("invalid duration"));
    }
}

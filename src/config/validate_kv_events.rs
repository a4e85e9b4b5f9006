//! Rules for KV-cache event sources: `kv_events` and `kv_events_replay` on a
//! replica are `tcp://host:port`, a replay endpoint needs an event endpoint,
//! discovery ports are not 0, and `prefix.mode = "exact"` has at least one
//! source to learn from.

use super::validate::push;
use super::{ConfigIssue, PoolConfig, PrefixMode};

pub fn validate_pool(out: &mut Vec<ConfigIssue>, key: &str, pool: &PoolConfig) {
    let mut sources = 0;
    for (r, replica) in pool.replicas.iter().enumerate() {
        let rkey = format!("{key}.replicas[{r}]");
        if let Some(e) = &replica.kv_events {
            sources += 1;
            if let Err(reason) = parse_tcp_endpoint(e) {
                push(out, &format!("{rkey}.kv_events"), &reason);
            }
        }
        if let Some(e) = &replica.kv_events_replay {
            if let Err(reason) = parse_tcp_endpoint(e) {
                push(out, &format!("{rkey}.kv_events_replay"), &reason);
            }
            if replica.kv_events.is_none() {
                push(
                    out,
                    &format!("{rkey}.kv_events_replay"),
                    "needs `kv_events` on the same replica",
                );
            }
        }
    }
    if let Some(d) = &pool.discovery {
        if d.kv_events_port == Some(0) {
            push(
                out,
                &format!("{key}.discovery.kv_events_port"),
                "must be 1..=65535",
            );
        }
        if d.kv_events_replay_port == Some(0) {
            push(
                out,
                &format!("{key}.discovery.kv_events_replay_port"),
                "must be 1..=65535",
            );
        }
        if d.kv_events_replay_port.is_some() && d.kv_events_port.is_none() {
            push(
                out,
                &format!("{key}.discovery.kv_events_replay_port"),
                "needs `kv_events_port`",
            );
        }
        if d.kv_events_port.is_some() {
            sources += 1;
        }
    }
    if pool.prefix.mode == PrefixMode::Exact && sources == 0 {
        push(
            out,
            &format!("{key}.prefix.mode"),
            "\"exact\" needs KV-cache events: set `kv_events = \"tcp://host:port\"` on the replicas (or `discovery.kv_events_port`)",
        );
    }
}

/// Checks a `tcp://host:port` endpoint.
pub fn parse_tcp_endpoint(e: &str) -> Result<(), String> {
    let Some(rest) = e.strip_prefix("tcp://") else {
        return Err(format!("{e:?} is not a tcp://host:port endpoint"));
    };
    let Some((host, port)) = rest.rsplit_once(':') else {
        return Err(format!("{e:?} has no port"));
    };
    if host.is_empty() || host == "*" {
        return Err(format!(
            "{e:?} needs the replica's host (llmlb connects to it)"
        ));
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => Err(format!("{e:?}: port must be 1..=65535")),
    }
}

#[cfg(test)]
mod tests {
    use crate::config::parse;

    fn keys(text: &str) -> Vec<String> {
        parse(text)
            .unwrap_err()
            .iter()
            .map(|i| i.key.clone())
            .collect()
    }

    #[test]
    fn endpoints_and_exact_mode_are_checked() {
        let good = "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n[pools.prefix]\nmode = \"exact\"\n\
             [[pools.replicas]]\nurl = \"http://127.0.0.1:8000\"\nkv_events = \"tcp://127.0.0.1:5557\"\nkv_events_replay = \"tcp://127.0.0.1:5558\"\n";
        let c = parse(good).unwrap();
        assert_eq!(
            c.pools[0].replicas[0].kv_events.as_deref(),
            Some("tcp://127.0.0.1:5557")
        );
        let bad = "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n[pools.prefix]\nmode = \"exact\"\n\
             [[pools.replicas]]\nurl = \"http://127.0.0.1:8000\"\nkv_events_replay = \"127.0.0.1:5558\"\n\
             [[pools.replicas]]\nurl = \"http://127.0.0.1:8001\"\nkv_events = \"tcp://*:5557\"\n";
        assert_eq!(
            keys(bad),
            vec![
                "pools[0].replicas[0].kv_events_replay",
                "pools[0].replicas[0].kv_events_replay",
                "pools[0].replicas[1].kv_events",
            ]
        );
        let none = "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n[pools.prefix]\nmode = \"exact\"\n\
             [[pools.replicas]]\nurl = \"http://127.0.0.1:8000\"\n";
        assert_eq!(keys(none), vec!["pools[0].prefix.mode"]);
    }
}

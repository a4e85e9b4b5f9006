//! Durations in the config are human strings: `"250ms"`, `"2s"`, `"5m"`.

use serde::{Deserialize, Deserializer};
use std::time::Duration;

/// A duration as written: a string, or a bare number (a common slip).
#[derive(Deserialize)]
#[serde(untagged)]
enum Written {
    Text(String),
    Int(i64),
    Float(f64),
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let bare = |n: String| {
        serde::de::Error::custom(format!(
            "a duration needs a unit and quotes: write \"{n}s\" (or \"{n}ms\", \"{n}m\"), not {n}"
        ))
    };
    let s = match Written::deserialize(d)? {
        Written::Text(s) => s,
        Written::Int(n) => return Err(bare(n.to_string())),
        Written::Float(n) => return Err(bare(n.to_string())),
    };
    humantime::parse_duration(&s).map_err(|e| {
        serde::de::Error::custom(format!(
            "invalid duration {s:?} ({e}); write e.g. \"250ms\", \"2s\", \"5m\"{}",
            if s.trim().parse::<f64>().is_ok() {
                format!(" (a bare number has no unit: \"{}s\"?)", s.trim())
            } else {
                String::new()
            }
        ))
    })
}

pub fn format(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// A listen address, with a hint for the `":8080"` shorthand other servers
/// accept.
pub fn listen_addr<'de, D: Deserializer<'de>>(d: D) -> Result<std::net::SocketAddr, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map_err(|_| {
        let hint = match s.strip_prefix(':') {
            Some(port) => format!(
                "; write \"0.0.0.0:{port}\" for every interface or \"127.0.0.1:{port}\" for this machine only"
            ),
            None => "; write IP:PORT, e.g. \"127.0.0.1:8080\" (host names are not resolved)".into(),
        };
        serde::de::Error::custom(format!("invalid listen address {s:?}{hint}"))
    })
}

#[cfg(test)]
mod tests {
    use crate::config::parse;

    fn reason(toml: &str) -> String {
        let issues = parse(toml).unwrap_err();
        issues
            .iter()
            .map(|i| format!("{}: {}", i.key, i.reason))
            .collect()
    }

    #[test]
    fn bare_numbers_and_port_only_addresses_get_a_hint() {
        let r = reason("[server]\ndrain_timeout = 60\n");
        assert!(
            r.contains("server.drain_timeout") && r.contains("write \"60s\""),
            "{r}"
        );
        let r = reason("[server]\ndrain_timeout = \"60\"\n");
        assert!(r.contains("\"60s\"?"), "{r}");
        let r = reason("[server]\nlisten = \":8080\"\n");
        assert!(
            r.contains("server.listen") && r.contains("\"0.0.0.0:8080\""),
            "{r}"
        );
        let r = reason("[server]\nadmin_listen = \"localhost:9090\"\n");
        assert!(r.contains("IP:PORT"), "{r}");
    }
}

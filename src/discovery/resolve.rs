//! Turning a discovery name into replica addresses: the system resolver
//! (A and AAAA records, as a Kubernetes headless Service publishes one per
//! ready pod), or a hosts-format file.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::config::DiscoveryConfig;

#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("resolving {name}: {source}")]
    Lookup {
        name: String,
        source: std::io::Error,
    },
    #[error("resolving {name}: no answer within {timeout:?}")]
    Timeout { name: String, timeout: Duration },
    #[error("reading hosts file {path}: {source}")]
    HostsFile {
        path: String,
        source: std::io::Error,
    },
}

/// Every address `config.dns` resolves to, with `config.port`, sorted and
/// without duplicates (so two resolutions of the same records compare equal).
pub async fn resolve(
    config: &DiscoveryConfig,
    timeout: Duration,
) -> Result<Vec<SocketAddr>, ResolveError> {
    let mut addrs: Vec<SocketAddr> = match &config.hosts_file {
        Some(path) => {
            let text = tokio::fs::read_to_string(path).await.map_err(|source| {
                ResolveError::HostsFile {
                    path: path.clone(),
                    source,
                }
            })?;
            hosts_lookup(&text, &config.dns)
                .into_iter()
                .map(|ip| SocketAddr::new(ip, config.port))
                .collect()
        }
        None => {
            let lookup = tokio::net::lookup_host((config.dns.as_str(), config.port));
            tokio::time::timeout(timeout, lookup)
                .await
                .map_err(|_| ResolveError::Timeout {
                    name: config.dns.clone(),
                    timeout,
                })?
                .map_err(|source| ResolveError::Lookup {
                    name: config.dns.clone(),
                    source,
                })?
                .collect()
        }
    };
    addrs.sort();
    addrs.dedup();
    Ok(addrs)
}

/// Addresses of `name` in hosts-file text (`IP NAME [ALIAS...]`, `#` comments).
pub fn hosts_lookup(text: &str, name: &str) -> Vec<IpAddr> {
    hosts_entries(text)
        .filter_map(|(ip, mut names)| names.any(|n| n.eq_ignore_ascii_case(name)).then_some(ip))
        .collect()
}

/// Each line of hosts-file text with an address: the address and its names
/// (comments and lines without a valid address skipped).
pub fn hosts_entries(text: &str) -> impl Iterator<Item = (IpAddr, std::str::SplitWhitespace<'_>)> {
    text.lines().filter_map(|l| {
        let mut fields = l.split('#').next().unwrap_or("").split_whitespace();
        let ip: IpAddr = fields.next()?.parse().ok()?;
        Some((ip, fields))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_file_lists_every_record_of_the_name() {
        let text = "# pods of the vllm service\n\
                    10.0.0.7 vllm.default.svc.cluster.local vllm\n\
                    10.0.0.3   vllm.default.svc.cluster.local # second pod\n\
                    fd00::5 VLLM.default.svc.cluster.local\n\
                    10.0.0.9 other.default.svc.cluster.local\n\
                    not-an-ip vllm.default.svc.cluster.local\n";
        let ips = hosts_lookup(text, "vllm.default.svc.cluster.local");
        let want: Vec<IpAddr> = ["10.0.0.7", "10.0.0.3", "fd00::5"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(ips, want);
        assert!(hosts_lookup(text, "missing").is_empty());
    }

    #[tokio::test]
    async fn resolves_from_a_hosts_file_sorted_and_deduplicated() {
        let dir = std::env::temp_dir().join(format!("llmlb-hosts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("hosts");
        std::fs::write(&path, "10.0.0.9 svc\n10.0.0.2 svc\n10.0.0.9 svc\n").unwrap();
        let config = DiscoveryConfig {
            hosts_file: Some(path.display().to_string()),
            ..DiscoveryConfig::new("svc", 8000)
        };
        let addrs = resolve(&config, Duration::from_secs(1)).await.unwrap();
        assert_eq!(
            addrs,
            vec![
                "10.0.0.2:8000".parse::<SocketAddr>().unwrap(),
                "10.0.0.9:8000".parse().unwrap()
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn system_resolver_finds_localhost() {
        let config = DiscoveryConfig::new("localhost", 9);
        let addrs = resolve(&config, Duration::from_secs(5)).await.unwrap();
        assert!(
            addrs.iter().any(|a| a.ip().is_loopback() && a.port() == 9),
            "{addrs:?}"
        );
    }
}

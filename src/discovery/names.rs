//! Names for discovered replicas, so that their metric series and log lines
//! outlive an address where the platform keeps a name: a StatefulSet's pods
//! behind a headless Service resolve back to `vllm-0.vllm.default.svc...`,
//! named `vllm-0` here, and keep that name when they restart with a new IP.
//!
//! The name is the first label of the address's reverse DNS name (PTR
//! record, through the system resolver on the blocking pool, within the
//! resolution timeout); with `hosts_file`, the first other name on the
//! address's line in that file. A label that only spells the address
//! (Kubernetes names other pods `10-1-2-3.<service>...`) is no name. An
//! address without a name, or sharing its name with another address of the
//! pool, is named `host:port` as before.
//!
//! Cost: one reverse lookup per address the first time it appears; the name
//! of an address already known is kept, so a flaky resolver never renames a
//! replica (and never resets its state).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::config::DiscoveryConfig;

/// A replica address and the name found for it.
pub type Named = (SocketAddr, Option<String>);

/// The name of `ip` by reverse lookup, or `None`.
pub async fn reverse_name(
    config: &DiscoveryConfig,
    ip: IpAddr,
    timeout: Duration,
) -> Option<String> {
    let host = match &config.hosts_file {
        Some(path) => {
            let text = tokio::fs::read_to_string(path).await.ok()?;
            hosts_reverse(&text, ip, &config.dns)?
        }
        None => {
            let lookup = tokio::task::spawn_blocking(move || dns_lookup::lookup_addr(&ip));
            tokio::time::timeout(timeout, lookup)
                .await
                .ok()?
                .ok()?
                .ok()?
        }
    };
    label_of(&host, ip)
}

/// The first name other than `service` given to `ip` in hosts-file text.
pub fn hosts_reverse(text: &str, ip: IpAddr, service: &str) -> Option<String> {
    super::resolve::hosts_entries(text)
        .filter(|(addr, _)| *addr == ip)
        .flat_map(|(_, names)| names)
        .find(|n| !n.eq_ignore_ascii_case(service))
        .map(str::to_string)
}

/// The first DNS label of `host`, unless it only spells `ip` (the address
/// itself, or its dashed form).
pub fn label_of(host: &str, ip: IpAddr) -> Option<String> {
    let label = host.split('.').next()?.trim().to_ascii_lowercase();
    let spelled = ip.to_string().replace([':', '.'], "-");
    let valid = label
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if label.is_empty() || !valid || label == spelled || host.parse::<IpAddr>().is_ok() {
        return None;
    }
    Some(label)
}

/// Clears every name given to more than one address.
pub fn unique(named: &mut [Named]) {
    let names: Vec<Option<String>> = named.iter().map(|(_, n)| n.clone()).collect();
    for (_, name) in named.iter_mut() {
        if name.is_some() && names.iter().filter(|n| *n == name).count() > 1 {
            *name = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_pod_name_is_the_first_label() {
        let a = ip("10.1.2.3");
        assert_eq!(
            label_of("vllm-0.vllm.default.svc.cluster.local", a).as_deref(),
            Some("vllm-0")
        );
        assert_eq!(
            label_of("Localhost", ip("127.0.0.1")).as_deref(),
            Some("localhost")
        );
    }

    #[test]
    fn a_name_that_only_spells_the_address_is_none() {
        let a = ip("10.1.2.3");
        assert_eq!(label_of("10-1-2-3.vllm.default.svc.cluster.local", a), None);
        assert_eq!(label_of("10.1.2.3", a), None);
        assert_eq!(label_of("", a), None);
        assert_eq!(label_of("bad_label.example", a), None);
        let v6 = ip("fd00::5");
        assert_eq!(label_of("fd00--5.svc", v6), None);
    }

    #[test]
    fn hosts_file_names_skip_the_service_name() {
        let text = "10.0.0.7 vllm.default.svc.cluster.local vllm-0.vllm # pod\n\
                    10.0.0.8 vllm.default.svc.cluster.local\n";
        let svc = "vllm.default.svc.cluster.local";
        assert_eq!(
            hosts_reverse(text, ip("10.0.0.7"), svc).as_deref(),
            Some("vllm-0.vllm")
        );
        assert_eq!(hosts_reverse(text, ip("10.0.0.8"), svc), None);
        assert_eq!(hosts_reverse(text, ip("10.0.0.9"), svc), None);
    }

    #[test]
    fn shared_names_fall_back_to_the_address() {
        let a: SocketAddr = "10.0.0.1:8000".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:8000".parse().unwrap();
        let c: SocketAddr = "10.0.0.3:8000".parse().unwrap();
        let mut named = vec![
            (a, Some("x".to_string())),
            (b, Some("x".to_string())),
            (c, Some("y".to_string())),
        ];
        unique(&mut named);
        assert_eq!(
            named,
            vec![(a, None), (b, None), (c, Some("y".to_string()))]
        );
    }

    #[tokio::test]
    async fn the_system_resolver_names_the_loopback_address() {
        let config = DiscoveryConfig::new("localhost", 9);
        // Every resolver answers 127.0.0.1 with a name (`localhost` on most
        // systems); it must be a plain label.
        let name = reverse_name(&config, ip("127.0.0.1"), Duration::from_secs(5)).await;
        let name = name.expect("127.0.0.1 has a reverse name");
        assert!(!name.is_empty() && !name.contains('.'), "{name}");
    }
}

//! Does the replica-sim profile used to plan (`llmlb doctor --profile FILE`)
//! still describe this replica? A profile `llmlb calibrate` wrote carries
//! where it was fitted (`[fitted]`: host, CPU, model, engine and version);
//! the doctor compares that with what each probed replica reports
//! (`GET /version`, the pool's model) and, for a replica on this machine,
//! with this machine's host name and CPU. Pure: the caller gathers what it
//! compares (it reads the profile file and this machine's facts).

use super::finding::{Finding, Topic};

/// The profile to check: its name as given, where it was fitted (`None`
/// when it has no `[fitted]` table), and this machine's host name and CPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub name: String,
    pub fitted: Option<FittedOn>,
    pub host: String,
    pub cpu: Option<String>,
}

/// What a profile's `[fitted]` table says of where it was fitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FittedOn {
    /// When, as an RFC 3339 UTC time.
    pub date: String,
    /// The replica probed.
    pub url: String,
    pub model: String,
    pub engine: String,
    pub engine_version: Option<String>,
    pub host: String,
    pub cpu: Option<String>,
}

/// What the doctor knows of one replica and of the machine it runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen<'a> {
    pub replica_url: &'a str,
    /// What the replica's `GET /version` answered.
    pub engine_version: Option<&'a str>,
    /// The model the pool sends to it.
    pub model: &'a str,
    /// This machine's host name and CPU model.
    pub host: &'a str,
    pub cpu: Option<&'a str>,
}

/// Whether a URL's host is this machine.
pub fn is_local(url: &str) -> bool {
    let host = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .split(['/', '?'])
        .next()
        .unwrap_or_default();
    let host = match host.rsplit_once(':') {
        Some((h, port)) if port.chars().all(|c| c.is_ascii_digit()) => h,
        _ => host,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// The findings for one replica against the profile named `name`.
pub fn judge(name: &str, fitted: Option<&FittedOn>, seen: &Seen<'_>) -> Vec<Finding> {
    let Some(f) = fitted else {
        return vec![Finding::warning(
            Topic::Profile,
            format!(
                "profile {name} was not fitted to a replica (no [fitted] table): nothing says its \
                 step times are this replica's; fit one with `llmlb calibrate --url {}`",
                seen.replica_url
            ),
        )];
    };
    let mut out = Vec::new();
    let refit = format!("refit with `llmlb calibrate --url {}`", seen.replica_url);
    match (f.engine_version.as_deref(), seen.engine_version) {
        (Some(was), Some(is)) if was != is => out.push(Finding::warning(
            Topic::Profile,
            format!(
                "profile {name} was fitted against {} {was}; this replica runs {is}: \
                 step times change between engine versions, {refit}",
                f.engine
            ),
        )),
        (Some(was), None) => out.push(Finding::warning(
            Topic::Profile,
            format!(
                "profile {name} was fitted against {} {was}; this replica does not say its \
                 version (GET /version)",
                f.engine
            ),
        )),
        _ => {}
    }
    if f.model != seen.model {
        out.push(Finding::warning(
            Topic::Profile,
            format!(
                "profile {name} was fitted with model {}; this pool sends {}: {refit}",
                f.model, seen.model
            ),
        ));
    }
    let fitted_here = is_local(&f.url);
    if is_local(seen.replica_url) && fitted_here {
        if f.host != seen.host {
            out.push(Finding::warning(
                Topic::Profile,
                format!(
                    "profile {name} was fitted on host {}, this is {}: {refit}",
                    f.host, seen.host
                ),
            ));
        } else if let (Some(was), Some(is)) = (f.cpu.as_deref(), seen.cpu)
            && was != is
        {
            out.push(Finding::warning(
                Topic::Profile,
                format!("profile {name} was fitted on a {was}, this machine has a {is}: {refit}"),
            ));
        }
    } else if f.url.trim_end_matches('/') != seen.replica_url.trim_end_matches('/') {
        out.push(Finding::ok(
            Topic::Profile,
            format!(
                "profile {name} was fitted against {} on {}: it holds for this replica if it \
                 runs the same hardware",
                f.url, f.date
            ),
        ));
    }
    if out.is_empty() {
        out.push(Finding::ok(
            Topic::Profile,
            format!(
                "profile {name} was fitted against this replica ({} {}, {} on {})",
                f.engine,
                f.engine_version.as_deref().unwrap_or("version unknown"),
                f.host,
                f.date
            ),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::Severity;

    fn fitted() -> Option<FittedOn> {
        Some(FittedOn {
            date: "2026-12-03T09:00:00Z".into(),
            url: "http://127.0.0.1:18000".into(),
            model: "tiny-llama".into(),
            engine: "vllm".into(),
            engine_version: Some("0.32.0".into()),
            host: "box-a".into(),
            cpu: Some("AMD EPYC 7B13".into()),
        })
    }

    fn seen<'a>(version: Option<&'a str>, host: &'a str) -> Seen<'a> {
        Seen {
            replica_url: "http://127.0.0.1:18000",
            engine_version: version,
            model: "tiny-llama",
            host,
            cpu: Some("AMD EPYC 7B13"),
        }
    }

    fn worst(f: &[Finding]) -> Severity {
        f.iter().map(|f| f.severity).max().unwrap()
    }

    #[test]
    fn the_same_replica_host_and_version_is_ok() {
        let f = judge("p.toml", fitted().as_ref(), &seen(Some("0.32.0"), "box-a"));
        assert_eq!(worst(&f), Severity::Ok, "{f:?}");
        assert!(f[0].message.contains("fitted against this replica"));
    }

    #[test]
    fn another_engine_version_or_host_is_a_warning() {
        let f = judge("p.toml", fitted().as_ref(), &seen(Some("0.33.1"), "box-a"));
        assert_eq!(worst(&f), Severity::Warning);
        assert!(
            f[0].message.contains("vllm 0.32.0") && f[0].message.contains("0.33.1"),
            "{f:?}"
        );
        let f = judge("p.toml", fitted().as_ref(), &seen(Some("0.32.0"), "box-b"));
        assert_eq!(worst(&f), Severity::Warning);
        assert!(f[0].message.contains("host box-a, this is box-b"), "{f:?}");
        let mut other_cpu = seen(Some("0.32.0"), "box-a");
        other_cpu.cpu = Some("Intel Xeon");
        let f = judge("p.toml", fitted().as_ref(), &other_cpu);
        assert!(f[0].message.contains("Intel Xeon"), "{f:?}");
    }

    #[test]
    fn a_profile_without_fitted_table_says_so() {
        let f = judge("h100-8b", None, &seen(None, "box-a"));
        assert_eq!(worst(&f), Severity::Warning);
        assert!(f[0].message.contains("llmlb calibrate"), "{f:?}");
    }

    #[test]
    fn loopback_urls_are_local() {
        assert!(is_local("http://127.0.0.1:18000"));
        assert!(is_local("http://localhost:8000/v1"));
        assert!(is_local("http://[::1]:8000"));
        assert!(!is_local("http://10.0.0.5:8000"));
        assert!(!is_local("http://vllm-0.vllm:8000"));
    }
}

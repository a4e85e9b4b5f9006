//! Tenants of simulated traffic: `--tenants chat=0.1@2,batch=0.9`, or
//! closed loops: `--tenants light=streams:1,heavy=streams:12`.
//!
//! Each entry is a tenant name, its share of the arrivals (relative: `1,9`
//! is `0.1,0.9`) or its number of streams, and optionally `@WEIGHT`, its
//! fair-share weight (default: the config's `[[tenants]] weight`, else 1).
//! With shares, every arrival draws its tenant from a generator seeded by
//! `--seed`, so every policy of a run sees the same requests from the same
//! tenants. With streams (every tenant must have them), each stream sends
//! its first request at 0 and the next when the last one ended (answered,
//! failed or refused), as `llmlb bench --concurrency` does; the workload's
//! requests go out in their order to whichever stream sends next, and its
//! arrival times are not used. The pool queue then shares each priority
//! level among the tenants as `serve`'s queue does
//! ([`crate::admission::fair`]).
//!
//! Without `--tenants`, no request names a tenant: one tenant, oldest
//! first.

use std::str::FromStr;
use std::sync::Arc;

use super::decide::splitmix;

/// One entry of the `--tenants` flag.
#[derive(Debug, Clone, PartialEq)]
pub struct MixTenant {
    pub name: String,
    /// Relative share of the arrivals (open loop).
    pub share: f64,
    /// Streams, each sending its next request when the last ended (closed
    /// loop).
    pub streams: Option<usize>,
    /// Fair-share weight, overriding the config's.
    pub weight: Option<f64>,
}

/// The `--tenants` flag as given.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantMix(pub Vec<MixTenant>);

fn positive(what: &str, name: &str, v: &str) -> Result<f64, String> {
    let x: f64 = v
        .trim()
        .parse()
        .map_err(|_| format!("tenant {name:?}: {what} {v:?} is not a number"))?;
    if !(x.is_finite() && x > 0.0) {
        return Err(format!("tenant {name:?}: {what} must be above 0"));
    }
    Ok(x)
}

impl FromStr for TenantMix {
    type Err = String;
    fn from_str(s: &str) -> Result<TenantMix, String> {
        let mut out: Vec<MixTenant> = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, rest) = part.split_once('=').ok_or_else(|| {
                format!("{part:?}: expected NAME=SHARE[@WEIGHT], e.g. chat=0.1@2")
            })?;
            let name = name.trim();
            if name.is_empty() {
                return Err(format!("{part:?}: the tenant name is empty"));
            }
            let (share, weight) = match rest.split_once('@') {
                Some((s, w)) => (s, Some(positive("weight", name, w)?)),
                None => (rest, None),
            };
            let (share, streams) = match share.trim().strip_prefix("streams:") {
                Some(n) => {
                    let n: usize = n.trim().parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                        format!("tenant {name:?}: streams {n:?} is not a whole number above 0")
                    })?;
                    (0.0, Some(n))
                }
                None => (positive("share", name, share)?, None),
            };
            if out.iter().any(|t| t.name == name) {
                return Err(format!("tenant {name:?} is given twice"));
            }
            out.push(MixTenant {
                name: name.to_string(),
                share,
                streams,
                weight,
            });
        }
        if out.is_empty() {
            return Err("expected NAME=SHARE[@WEIGHT],..., e.g. chat=0.1@2,batch=0.9".into());
        }
        if out.iter().any(|t| t.streams.is_some()) && out.iter().any(|t| t.streams.is_none()) {
            return Err(
                "give every tenant a share (open loop) or every tenant streams:N (closed loop)"
                    .into(),
            );
        }
        if out.len() > usize::from(u16::MAX) {
            return Err("at most 65535 tenants".into());
        }
        Ok(TenantMix(out))
    }
}

/// A tenant of the run.
#[derive(Debug, Clone, PartialEq)]
pub struct SimTenant {
    pub name: Arc<str>,
    /// Fair-share weight given on the command line.
    pub weight: Option<f64>,
}

/// The tenants of a run and each request's draw.
#[derive(Debug, Clone)]
pub struct Tenants {
    pub tenants: Vec<SimTenant>,
    /// Per workload request, its index into `tenants` (closed loop: the
    /// streams' first requests; the run deals the rest).
    pub of_request: Vec<u16>,
    /// Streams per tenant (closed loop), else empty.
    pub streams: Vec<usize>,
}

impl Tenants {
    /// Draws a tenant for each of `requests` arrivals.
    pub fn draw(mix: &TenantMix, requests: usize, seed: u64) -> Tenants {
        let tenants = (mix.0.iter())
            .map(|t| SimTenant {
                name: Arc::from(t.name.as_str()),
                weight: t.weight,
            })
            .collect();
        if mix.0.iter().all(|t| t.streams.is_some()) {
            let streams: Vec<usize> = mix.0.iter().map(|t| t.streams.unwrap_or(0)).collect();
            let mut of_request: Vec<u16> = (streams.iter().enumerate())
                .flat_map(|(t, &n)| std::iter::repeat_n(t as u16, n))
                .take(requests)
                .collect();
            of_request.resize(requests, 0);
            return Tenants {
                tenants,
                of_request,
                streams,
            };
        }
        let total: f64 = mix.0.iter().map(|t| t.share).sum();
        let mut state = seed ^ 0x7e4a_47f5;
        let of_request = (0..requests)
            .map(|_| {
                state = splitmix(state);
                let u = (state >> 11) as f64 / (1u64 << 53) as f64 * total;
                let mut acc = 0.0;
                let pick = mix.0.iter().position(|t| {
                    acc += t.share;
                    u < acc
                });
                pick.unwrap_or(mix.0.len() - 1) as u16
            })
            .collect();
        Tenants {
            tenants,
            of_request,
            streams: Vec::new(),
        }
    }

    /// Streams in all (closed loop), 0 with shares.
    pub fn total_streams(&self) -> usize {
        self.streams.iter().sum()
    }

    /// The tenant of request `i`.
    pub fn of(&self, i: usize) -> &SimTenant {
        &self.tenants[usize::from(self.of_request[i])]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_parses_shares_and_weights_and_refuses_nonsense() {
        let mix: TenantMix = "chat=0.1@2, batch=0.9".parse().unwrap();
        assert_eq!(
            mix.0,
            vec![
                MixTenant {
                    name: "chat".into(),
                    share: 0.1,
                    streams: None,
                    weight: Some(2.0)
                },
                MixTenant {
                    name: "batch".into(),
                    share: 0.9,
                    streams: None,
                    weight: None
                },
            ]
        );
        let closed: TenantMix = "light=streams:1,heavy=streams:12@2".parse().unwrap();
        assert_eq!(closed.0[1].streams, Some(12));
        assert_eq!(closed.0[1].weight, Some(2.0));
        let t = Tenants::draw(&closed, 20, 0);
        assert_eq!(t.total_streams(), 13);
        assert_eq!(&t.of_request[..3], &[0, 1, 1]);
        for bad in [
            "",
            "a",
            "a=x",
            "a=0",
            "a=1@0",
            "a=1@x",
            "=1",
            "a=1,a=2",
            "a=streams:0",
            "a=streams:1,b=0.5",
        ] {
            assert!(bad.parse::<TenantMix>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn draws_follow_the_shares_and_the_seed() {
        let mix: TenantMix = "a=1,b=3".parse().unwrap();
        let x = Tenants::draw(&mix, 4000, 7);
        let y = Tenants::draw(&mix, 4000, 7);
        let z = Tenants::draw(&mix, 4000, 8);
        assert_eq!(x.of_request, y.of_request);
        assert_ne!(x.of_request, z.of_request);
        let a = x.of_request.iter().filter(|&&t| t == 0).count();
        assert!((900..1100).contains(&a), "{a} of 4000 at share 1/4");
        assert_eq!(&*x.of(0).name, ["a", "b"][usize::from(x.of_request[0])]);
    }
}

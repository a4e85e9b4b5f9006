//! Tenants of simulated traffic: `--tenants chat=0.1@2,batch=0.9`.
//!
//! Each entry is a tenant name, its share of the arrivals (relative: `1,9`
//! is `0.1,0.9`), and optionally `@WEIGHT`, its fair-share weight (default:
//! the config's `[[tenants]] weight`, else 1). Every arrival draws its
//! tenant from a generator seeded by `--seed`, so every policy of a run
//! sees the same requests from the same tenants. The pool queue then
//! shares each priority level among them as `serve`'s queue does
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
    /// Relative share of the arrivals.
    pub share: f64,
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
            let share = positive("share", name, share)?;
            if out.iter().any(|t| t.name == name) {
                return Err(format!("tenant {name:?} is given twice"));
            }
            out.push(MixTenant {
                name: name.to_string(),
                share,
                weight,
            });
        }
        if out.is_empty() {
            return Err("expected NAME=SHARE[@WEIGHT],..., e.g. chat=0.1@2,batch=0.9".into());
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
    /// Per workload request, its index into `tenants`.
    pub of_request: Vec<u16>,
}

impl Tenants {
    /// Draws a tenant for each of `requests` arrivals.
    pub fn draw(mix: &TenantMix, requests: usize, seed: u64) -> Tenants {
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
        let tenants = (mix.0.iter())
            .map(|t| SimTenant {
                name: Arc::from(t.name.as_str()),
                weight: t.weight,
            })
            .collect();
        Tenants {
            tenants,
            of_request,
        }
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
                    weight: Some(2.0)
                },
                MixTenant {
                    name: "batch".into(),
                    share: 0.9,
                    weight: None
                },
            ]
        );
        for bad in ["", "a", "a=x", "a=0", "a=1@0", "a=1@x", "=1", "a=1,a=2"] {
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

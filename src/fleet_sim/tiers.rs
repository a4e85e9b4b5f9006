//! Priority tiers of simulated traffic: `--tiers paid=0.2,free=0.8`.
//!
//! Each name is a `[[tiers]]` name of the config (its requests take that
//! tier's `priority` level, and routing sees the tier, as for a caller
//! whose key or tier header names it), or else a `[[priorities]]` level
//! name (its requests take that level and no tier). Without `[[priorities]]`
//! a config has llmlb's default levels, `high` and `low`. Weights are
//! relative (`1,4` is `0.2,0.8`). Every arrival draws its tier from a
//! generator seeded by `--seed`, so every policy of a run sees the same
//! requests in the same tiers.
//!
//! Without `--tiers`, every request takes the level `serve` gives a caller
//! that names no tier: `[gateway] default_tier`'s, else the lowest.
//!
//! A tier whose `[[tiers]]` entry names its own `pool` is refused: the
//! simulation runs the one pool serving `--model`.

use std::str::FromStr;

use crate::config::Config;
use crate::routing::tiers::tier_levels;

use super::SimulateError;
use super::decide::splitmix;

/// The `--tiers` flag as given: names and relative weights.
#[derive(Debug, Clone, PartialEq)]
pub struct TierMix(pub Vec<(String, f64)>);

impl FromStr for TierMix {
    type Err = String;
    fn from_str(s: &str) -> Result<TierMix, String> {
        let mut out: Vec<(String, f64)> = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, weight) = part
                .split_once('=')
                .ok_or_else(|| format!("{part:?}: expected NAME=WEIGHT, e.g. paid=0.2"))?;
            let name = name.trim();
            let weight: f64 = weight
                .trim()
                .parse()
                .map_err(|_| format!("tier {name:?}: weight {weight:?} is not a number"))?;
            if !(weight.is_finite() && weight > 0.0) {
                return Err(format!("tier {name:?}: weight must be above 0"));
            }
            if name.is_empty() {
                return Err(format!("{part:?}: the tier name is empty"));
            }
            if out.iter().any(|(n, _)| n == name) {
                return Err(format!("tier {name:?} is given twice"));
            }
            out.push((name.to_string(), weight));
        }
        if out.is_empty() {
            return Err("expected NAME=WEIGHT,..., e.g. paid=0.2,free=0.8".into());
        }
        if out.len() > usize::from(u8::MAX) {
            return Err("at most 255 tiers".into());
        }
        Ok(TierMix(out))
    }
}

/// A tier of the mix, resolved against the config.
#[derive(Debug, Clone, PartialEq)]
pub struct SimTier {
    pub name: String,
    /// Priority level index (0 = highest).
    pub level: usize,
    /// The level's name.
    pub priority: String,
    /// The `[[tiers]]` name routing sees (`None` for a bare priority level).
    pub route_tier: Option<String>,
    weight: f64,
}

/// The tiers of a run and each request's draw.
#[derive(Debug, Clone)]
pub struct Tiers {
    pub tiers: Vec<SimTier>,
    /// Per workload request, its index into `tiers`.
    pub of_request: Vec<u8>,
}

impl Tiers {
    /// Resolves `mix` against `config` (whose pool serving the model is
    /// `pool`) and draws a tier for each of `requests` arrivals.
    pub fn draw(
        mix: &TierMix,
        config: &Config,
        pool: &str,
        requests: usize,
        seed: u64,
    ) -> Result<Tiers, SimulateError> {
        let levels = tier_levels(config);
        let tiers = mix
            .0
            .iter()
            .map(|(name, weight)| resolve(config, &levels, pool, name, *weight))
            .collect::<Result<Vec<_>, _>>()?;
        let total: f64 = tiers.iter().map(|t| t.weight).sum();
        let mut state = seed ^ 0x7135_eed5;
        let of_request = (0..requests)
            .map(|_| {
                state = splitmix(state);
                let u = (state >> 11) as f64 / (1u64 << 53) as f64 * total;
                let mut acc = 0.0;
                let pick = tiers.iter().position(|t| {
                    acc += t.weight;
                    u < acc
                });
                pick.unwrap_or(tiers.len() - 1) as u8
            })
            .collect();
        Ok(Tiers { tiers, of_request })
    }

    /// The tier of request `i`.
    pub fn of(&self, i: usize) -> &SimTier {
        &self.tiers[usize::from(self.of_request[i])]
    }
}

fn resolve(
    config: &Config,
    levels: &std::collections::HashMap<&str, usize>,
    pool: &str,
    name: &str,
    weight: f64,
) -> Result<SimTier, SimulateError> {
    if let Some(t) = config.tiers.iter().find(|t| t.name == name) {
        if let Some(own) = t.pool.as_deref().filter(|p| *p != pool) {
            return Err(SimulateError::Invalid(format!(
                "--tiers: tier {name:?} is served by pool {own:?}; llmlb fleet-sim runs \
                 only pool {pool:?}"
            )));
        }
        return Ok(SimTier {
            name: name.to_string(),
            level: levels[name],
            priority: t.priority.clone(),
            route_tier: Some(name.to_string()),
            weight,
        });
    }
    if let Some(level) = config.priorities.iter().position(|p| p.name == name) {
        return Ok(SimTier {
            name: name.to_string(),
            level,
            priority: name.to_string(),
            route_tier: None,
            weight,
        });
    }
    let mut known: Vec<&str> = config.tiers.iter().map(|t| t.name.as_str()).collect();
    known.extend(config.priorities.iter().map(|p| p.name.as_str()));
    Err(SimulateError::Invalid(format!(
        "--tiers: unknown tier {name:?}: expected a [[tiers]] or [[priorities]] name of the \
         config ({})",
        known.join(", ")
    )))
}

/// The level `serve` gives a caller that names no tier: the default
/// tier's, else the lowest.
pub fn default_level(config: &Config) -> usize {
    let lowest = config.priorities.len().saturating_sub(1);
    config
        .gateway
        .default_tier
        .as_deref()
        .and_then(|t| tier_levels(config).get(t).copied())
        .map_or(lowest, |l| l.min(lowest))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = "[[priorities]]\nname = \"high\"\n[[priorities]]\nname = \"low\"\n\
         [[tiers]]\nname = \"paid\"\npriority = \"high\"\n\
         [[tiers]]\nname = \"other\"\npriority = \"high\"\npool = \"elsewhere\"\n\
         [[pools]]\nname = \"p\"\nmodels = [\"m\"]\n[[pools.replicas]]\nurl = \"http://127.0.0.1:1\"\n\
         [[pools]]\nname = \"elsewhere\"\nmodels = [\"n\"]\n[[pools.replicas]]\nurl = \"http://127.0.0.1:2\"\n";

    fn config() -> Config {
        crate::config::parse(CONFIG).unwrap()
    }

    #[test]
    fn the_flag_parses_names_and_weights_and_refuses_nonsense() {
        let mix: TierMix = "paid=0.2, low=0.8".parse().unwrap();
        assert_eq!(mix.0, vec![("paid".into(), 0.2), ("low".into(), 0.8)]);
        for bad in ["", "paid", "paid=x", "paid=0", "paid=-1", "=1", "a=1,a=2"] {
            assert!(bad.parse::<TierMix>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn names_resolve_to_tiers_then_levels_and_unknown_ones_are_named() {
        let c = config();
        let mix: TierMix = "paid=1,low=3".parse().unwrap();
        let t = Tiers::draw(&mix, &c, "p", 4000, 7).unwrap();
        assert_eq!(
            (t.tiers[0].level, t.tiers[0].route_tier.as_deref()),
            (0, Some("paid"))
        );
        assert_eq!(
            (t.tiers[1].level, t.tiers[1].route_tier.as_deref()),
            (1, None)
        );
        let err = Tiers::draw(&"gold=1".parse().unwrap(), &c, "p", 1, 0).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("unknown tier \"gold\""), "{msg}");
        assert!(msg.contains("paid, other, high, low"), "{msg}");
        let err = Tiers::draw(&"other=1".parse().unwrap(), &c, "p", 1, 0).unwrap_err();
        assert!(err.to_string().contains("pool \"elsewhere\""), "{err}");
    }

    #[test]
    fn draws_follow_the_weights_and_the_seed() {
        let c = config();
        let mix: TierMix = "paid=1,low=3".parse().unwrap();
        let a = Tiers::draw(&mix, &c, "p", 4000, 7).unwrap();
        let b = Tiers::draw(&mix, &c, "p", 4000, 7).unwrap();
        let other = Tiers::draw(&mix, &c, "p", 4000, 8).unwrap();
        assert_eq!(a.of_request, b.of_request);
        assert_ne!(a.of_request, other.of_request);
        let paid = a.of_request.iter().filter(|&&t| t == 0).count();
        assert!((900..1100).contains(&paid), "{paid} of 4000 at weight 1/4");
        assert_eq!(a.of(0).name, a.tiers[usize::from(a.of_request[0])].name);
    }

    #[test]
    fn without_tiers_requests_take_the_default_tier_s_level() {
        let mut c = config();
        assert_eq!(default_level(&c), 1);
        c.gateway.default_tier = Some("paid".into());
        assert_eq!(default_level(&c), 0);
    }
}

//! `--find-replicas`: the smallest fleet that meets an objective such as
//! `p99_ttft=2s` (several joined by commas; quantiles p50, p90, p99 of ttft,
//! itl, e2e). A fleet meets it when every named quantile is at or under its
//! bound and no request failed other than for its own length (a prompt over
//! the context limit fails on any fleet).
//!
//! Search: double N from the starting size until the objective is met (or
//! `max` is passed), then bisect between the last miss and the first hit:
//! about 2·log2(N) runs, assuming more replicas never make latency worse.

use std::str::FromStr;

use super::SimulateError;
use super::report::RunResult;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bound {
    pub metric: Metric,
    pub quantile: u8,
    pub max_s: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    Ttft,
    Itl,
    E2e,
}

/// Bounds that must all hold.
#[derive(Debug, Clone, PartialEq)]
pub struct Objective(pub Vec<Bound>);

impl FromStr for Objective {
    type Err = String;
    fn from_str(s: &str) -> Result<Objective, String> {
        let mut out = Vec::new();
        for part in s.split(',').filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once('=')
                .ok_or_else(|| format!("objective {part:?}: expected e.g. p99_ttft=2s"))?;
            let (q, m) = key
                .split_once('_')
                .ok_or_else(|| format!("objective {key:?}: expected pNN_METRIC"))?;
            let quantile = match q {
                "p50" => 50,
                "p90" => 90,
                "p99" => 99,
                _ => return Err(format!("objective {key:?}: quantile is p50, p90 or p99")),
            };
            let metric = match m {
                "ttft" => Metric::Ttft,
                "itl" => Metric::Itl,
                "e2e" => Metric::E2e,
                _ => return Err(format!("objective {key:?}: metric is ttft, itl or e2e")),
            };
            let max_s = humantime::parse_duration(value)
                .map_err(|e| format!("objective {part:?}: {e}"))?
                .as_secs_f64();
            out.push(Bound {
                metric,
                quantile,
                max_s,
            });
        }
        if out.is_empty() {
            return Err("empty objective".into());
        }
        Ok(Objective(out))
    }
}

impl Objective {
    pub fn met_by(&self, r: &RunResult) -> bool {
        let o = &r.outcomes;
        let failed = o.errors() - o.too_long + o.unfinished;
        failed == 0
            && self.0.iter().all(|b| {
                let q = match b.metric {
                    Metric::Ttft => r.ttft_s,
                    Metric::Itl => r.itl_s,
                    Metric::E2e => r.e2e_s,
                };
                let v = match b.quantile {
                    50 => q.p50,
                    90 => q.p90,
                    _ => q.p99,
                };
                v <= b.max_s
            })
    }
}

/// The smallest N in `1..=max` for which `run(N)` meets `objective`, with
/// that run and every probe made (N, met).
pub fn find(
    objective: &Objective,
    start: usize,
    max: usize,
    mut run: impl FnMut(usize) -> Result<RunResult, SimulateError>,
) -> Result<(RunResult, Vec<(usize, bool)>), SimulateError> {
    let mut probes = Vec::new();
    let mut lo = 0; // largest N known to miss
    let mut n = start.clamp(1, max);
    let mut best = loop {
        let r = run(n)?;
        let ok = objective.met_by(&r);
        probes.push((n, ok));
        if ok {
            break (n, r);
        }
        lo = n;
        if n >= max {
            return Err(SimulateError::Invalid(format!(
                "no fleet of up to {max} replicas meets the objective (raise --max-replicas)"
            )));
        }
        n = (n * 2).min(max);
    };
    while best.0 - lo > 1 {
        let mid = lo + (best.0 - lo) / 2;
        let r = run(mid)?;
        let ok = objective.met_by(&r);
        probes.push((mid, ok));
        if ok {
            best = (mid, r);
        } else {
            lo = mid;
        }
    }
    Ok((best.1, probes))
}

/// A prefill/decode split: (prefill replicas, decode replicas).
pub type Split = (usize, usize);

/// The split with the fewest replicas in all meeting `objective` (ties:
/// the higher goodput), with that run and every probe made.
///
/// Search, assuming more replicas of either role never make latency
/// worse: double an equal split (k, k) from `start` until it meets the
/// objective, then walk the frontier from (1, 2k): a split that meets it
/// gives up one decode replica, one that misses adds a prefill replica, so
/// every decode count up to 2k meets its fewest prefill replicas, in at
/// most 4k runs (splits larger than the best found are stepped over, not
/// run). Splits with more than 2k decode replicas are not tried.
pub fn find_split(
    objective: &Objective,
    start: usize,
    max: usize,
    mut run: impl FnMut(usize, usize) -> Result<RunResult, SimulateError>,
) -> Result<(RunResult, Vec<(Split, bool)>), SimulateError> {
    let mut probes: Vec<(Split, bool)> = Vec::new();
    let mut best: Option<(Split, RunResult)> = None;
    let mut probe = |split: Split,
                     probes: &mut Vec<(Split, bool)>,
                     best: &mut Option<(Split, RunResult)>|
     -> Result<bool, SimulateError> {
        if let Some((_, ok)) = probes.iter().find(|(s, _)| *s == split) {
            return Ok(*ok);
        }
        let r = run(split.0, split.1)?;
        let ok = objective.met_by(&r);
        probes.push((split, ok));
        if ok {
            let better = best.as_ref().is_none_or(|((p, d), b)| {
                let (total, was) = (split.0 + split.1, p + d);
                total < was || (total == was && r.goodput_rps > b.goodput_rps)
            });
            if better {
                *best = Some((split, r));
            }
        }
        Ok(ok)
    };
    let half = max / 2;
    let mut k = (start / 2).clamp(1, half.max(1));
    while !probe((k, k), &mut probes, &mut best)? {
        if k >= half {
            return Err(SimulateError::Invalid(format!(
                "no split of up to {max} replicas meets the objective (raise --max-replicas)"
            )));
        }
        k = (k * 2).min(half);
    }
    let (mut p, mut d) = (1, (2 * k).min(max - 1));
    while d >= 1 && p + d <= max && p <= 2 * k {
        let known = best.as_ref().map_or(usize::MAX, |((bp, bd), _)| bp + bd);
        // A split larger than the best one found cannot beat it: stepping
        // down past it skips only such splits.
        if p + d > known || probe((p, d), &mut probes, &mut best)? {
            d -= 1;
        } else {
            p += 1;
        }
    }
    let (_, run) = best.expect("the equal split met the objective");
    Ok((run, probes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet_sim::report::Outcomes;
    use crate::fleet_sim::stats::LogHistogram;

    fn result(n: usize, ttft: f64) -> RunResult {
        RunResult::new(
            "p",
            n,
            1,
            Outcomes::default(),
            &mut [ttft],
            &mut [ttft],
            &LogHistogram::default(),
            vec![1; n],
            1.0,
            2.0,
            1,
            0.0,
        )
    }

    #[test]
    fn objective_parses() {
        let o: Objective = "p99_ttft=2s,p50_itl=50ms".parse().unwrap();
        assert_eq!(o.0.len(), 2);
        assert_eq!(o.0[1].metric, Metric::Itl);
        assert_eq!(o.0[1].max_s, 0.05);
        for bad in ["", "p99=2s", "p75_ttft=1s", "p99_tpot=1s", "p99_ttft=soon"] {
            assert!(bad.parse::<Objective>().is_err(), "{bad}");
        }
    }

    #[test]
    fn finds_the_smallest_fleet_by_doubling_then_bisecting() {
        let o: Objective = "p99_ttft=1s".parse().unwrap();
        // TTFT falls as the fleet grows; 37 replicas is the first under 1 s.
        let (r, probes) = find(&o, 4, 1000, |n| Ok(result(n, 37.0 / n as f64))).unwrap();
        assert_eq!(r.replicas, 37);
        assert_eq!(probes.first(), Some(&(4, false)));
        assert!(probes.contains(&(64, true)));
        assert!(probes.contains(&(36, false)));
        assert!(probes.len() <= 12, "{probes:?}");
        assert!(find(&o, 4, 16, |n| Ok(result(n, 37.0 / n as f64))).is_err());
        let mut failing = result(100, 0.1);
        failing.outcomes.timeout = 1;
        assert!(!o.met_by(&failing));
    }
}

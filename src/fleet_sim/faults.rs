//! Faults on the virtual clock, one `--fault` flag each:
//!
//! ```text
//! slow:replica=3,at=60s,factor=3     replica 3 takes 3x as long per step from t = 60 s
//! kill:replica=3,at=60s              replica 3 dies: its requests fail, connections are refused
//! hang:replica=3,at=60s              replica 3 stops answering but keeps its connections
//! zone:replicas=0-63,at=10m          replicas 0..=63 die at once (a zone lost)
//! ```
//!
//! Replicas are numbered 0..N in fleet order (`r0`, `r1`, ... in a generated
//! fleet; config order with `--config`). `replicas` takes `A-B` ranges and
//! single numbers joined by `;` (`0-3;8;10-11`). Times are durations from
//! the start of the workload (`90s`, `5m`, `1500ms`).

use std::str::FromStr;

/// What happens to the replicas.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultKind {
    Slow(f64),
    Kill,
    Hang,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Fault {
    pub kind: FaultKind,
    pub replicas: Vec<usize>,
    /// Seconds from the start.
    pub at: f64,
}

impl Fault {
    /// A replica number beyond the fleet, if any.
    pub fn out_of_range(&self, fleet: usize) -> Option<usize> {
        self.replicas.iter().copied().find(|&r| r >= fleet)
    }
}

impl FromStr for Fault {
    type Err = String;

    fn from_str(s: &str) -> Result<Fault, String> {
        let (kind, rest) = s
            .split_once(':')
            .ok_or_else(|| format!("fault {s:?}: expected KIND:key=value,..."))?;
        let mut replicas = None;
        let mut at = None;
        let mut factor = None;
        for kv in rest.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| format!("fault {s:?}: {kv:?} is not key=value"))?;
            match k {
                "replica" | "replicas" => replicas = Some(parse_set(v)?),
                "at" => {
                    at = Some(
                        humantime::parse_duration(v)
                            .map_err(|e| format!("fault {s:?}: at={v}: {e}"))?
                            .as_secs_f64(),
                    )
                }
                "factor" => {
                    factor = Some(
                        v.parse::<f64>()
                            .ok()
                            .filter(|f| f.is_finite() && *f > 0.0)
                            .ok_or_else(|| {
                                format!("fault {s:?}: factor must be a positive number")
                            })?,
                    )
                }
                _ => return Err(format!("fault {s:?}: unknown key {k:?}")),
            }
        }
        let replicas = replicas.ok_or_else(|| format!("fault {s:?}: replica=N is required"))?;
        let at = at.ok_or_else(|| format!("fault {s:?}: at=DURATION is required"))?;
        let kind = match (kind, factor) {
            ("slow", Some(f)) => FaultKind::Slow(f),
            ("slow", None) => return Err(format!("fault {s:?}: slow needs factor=X")),
            (_, Some(_)) => return Err(format!("fault {s:?}: factor applies to slow only")),
            ("kill" | "zone", None) => FaultKind::Kill,
            ("hang", None) => FaultKind::Hang,
            (k, None) => {
                return Err(format!(
                    "fault {s:?}: unknown kind {k:?} (slow, kill, hang, zone)"
                ));
            }
        };
        Ok(Fault { kind, replicas, at })
    }
}

/// `0-3;8` → [0, 1, 2, 3, 8].
fn parse_set(v: &str) -> Result<Vec<usize>, String> {
    let num = |x: &str| {
        x.trim()
            .parse::<usize>()
            .map_err(|_| format!("replica {x:?} is not a number"))
    };
    let mut out = Vec::new();
    for part in v.split(';').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if b < a || b - a > 1_000_000 {
                    return Err(format!("bad replica range {part:?}"));
                }
                out.extend(a..=b);
            }
            None => out.push(num(part)?),
        }
    }
    if out.is_empty() {
        return Err("no replica named".into());
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_parse() {
        assert_eq!(
            "slow:replica=3,at=60s,factor=3".parse::<Fault>(),
            Ok(Fault {
                kind: FaultKind::Slow(3.0),
                replicas: vec![3],
                at: 60.0
            })
        );
        let z: Fault = "zone:replicas=0-2;8,at=10m".parse().unwrap();
        assert_eq!(
            (z.kind.clone(), z.replicas.clone(), z.at),
            (FaultKind::Kill, vec![0, 1, 2, 8], 600.0)
        );
        assert_eq!(z.out_of_range(8), Some(8));
        assert_eq!(
            "hang:replica=1,at=1500ms".parse::<Fault>().unwrap().kind,
            FaultKind::Hang
        );
        for bad in [
            "slow:replica=1,at=1s",
            "kill:at=1s",
            "kill:replica=1",
            "melt:replica=1,at=1s",
            "kill:replica=x,at=1s",
            "kill:replica=1,at=1s,factor=2",
            "kill",
        ] {
            assert!(bad.parse::<Fault>().is_err(), "{bad}");
        }
    }
}

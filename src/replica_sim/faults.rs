//! Live fault state of one replica, read on every request and changed by
//! `POST /sim/fault`. Plain atomics: no lock on the request path.
//!
//! Error draws are deterministic: draw `k` is a hash of the seed and `k`,
//! so a seeded run fails the same requests in the same order.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use serde::Deserialize;

use super::config::FaultConfig;
use super::engine::kv_cache::mix64;

const NO_LIMIT: u64 = u64::MAX;

#[derive(Debug)]
pub struct Faults {
    initial: FaultConfig,
    seed: u64,
    error_rate: AtomicU64,
    hang: AtomicBool,
    slowdown: AtomicU64,
    max_waiting: AtomicU64,
    draws: AtomicU64,
    refusals: AtomicU64,
}

/// A `POST /sim/fault` body: every field optional, `reset` applied first.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultPatch {
    #[serde(default)]
    pub reset: bool,
    pub error_rate: Option<f64>,
    pub hang: Option<bool>,
    pub slowdown: Option<f64>,
    /// A number sets the limit; `null` removes it.
    #[serde(default, deserialize_with = "some_or_null")]
    pub max_waiting: Option<Option<usize>>,
}

fn some_or_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Option<usize>>, D::Error> {
    Option::<usize>::deserialize(d).map(Some)
}

impl Faults {
    pub fn new(initial: FaultConfig, seed: u64) -> Faults {
        let f = Faults {
            initial: initial.clone(),
            seed,
            error_rate: AtomicU64::new(0),
            hang: AtomicBool::new(false),
            slowdown: AtomicU64::new(0),
            max_waiting: AtomicU64::new(NO_LIMIT),
            draws: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
        };
        f.store(&initial);
        f
    }

    fn store(&self, c: &FaultConfig) {
        self.error_rate
            .store(c.error_rate.to_bits(), Ordering::Relaxed);
        self.hang.store(c.hang, Ordering::Relaxed);
        self.slowdown.store(c.slowdown.to_bits(), Ordering::Relaxed);
        self.max_waiting.store(
            c.max_waiting.map_or(NO_LIMIT, |m| m as u64),
            Ordering::Relaxed,
        );
    }

    /// The current state.
    pub fn snapshot(&self) -> FaultConfig {
        let m = self.max_waiting.load(Ordering::Relaxed);
        FaultConfig {
            error_rate: f64::from_bits(self.error_rate.load(Ordering::Relaxed)),
            hang: self.hang.load(Ordering::Relaxed),
            slowdown: f64::from_bits(self.slowdown.load(Ordering::Relaxed)),
            max_waiting: (m != NO_LIMIT).then_some(m as usize),
        }
    }

    /// Applies a patch atomically per field; the whole patch is validated first.
    pub fn apply(&self, patch: &FaultPatch) -> Result<FaultConfig, String> {
        let mut next = if patch.reset {
            self.initial.clone()
        } else {
            self.snapshot()
        };
        if let Some(r) = patch.error_rate {
            next.error_rate = r;
        }
        if let Some(h) = patch.hang {
            next.hang = h;
        }
        if let Some(s) = patch.slowdown {
            next.slowdown = s;
        }
        if let Some(m) = patch.max_waiting {
            next.max_waiting = m;
        }
        next.validate()?;
        self.store(&next);
        Ok(next)
    }

    pub fn hang(&self) -> bool {
        self.hang.load(Ordering::Relaxed)
    }

    pub fn slowdown(&self) -> f64 {
        f64::from_bits(self.slowdown.load(Ordering::Relaxed))
    }

    pub fn max_waiting(&self) -> Option<usize> {
        let m = self.max_waiting.load(Ordering::Relaxed);
        (m != NO_LIMIT).then_some(m as usize)
    }

    /// Counts a request refused because the queue held `max_waiting`.
    pub fn record_refusal(&self) {
        self.refusals.fetch_add(1, Ordering::Relaxed);
    }

    /// Requests refused by the queue limit so far.
    pub fn refusals(&self) -> u64 {
        self.refusals.load(Ordering::Relaxed)
    }

    /// Whether this request should fail (one deterministic draw).
    pub fn draw_error(&self) -> bool {
        let rate = f64::from_bits(self.error_rate.load(Ordering::Relaxed));
        if rate <= 0.0 {
            return false;
        }
        let k = self.draws.fetch_add(1, Ordering::Relaxed);
        let u = (mix64(self.seed ^ mix64(k)) >> 11) as f64 / (1u64 << 53) as f64;
        u < rate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_combines_fields_and_reset_restores_start() {
        let start = FaultConfig {
            max_waiting: Some(4),
            ..FaultConfig::default()
        };
        let f = Faults::new(start.clone(), 1);
        let p: FaultPatch = serde_json::from_str(r#"{"error_rate":0.5,"slowdown":4.0}"#).unwrap();
        let s = f.apply(&p).unwrap();
        assert_eq!(
            (s.error_rate, s.slowdown, s.max_waiting),
            (0.5, 4.0, Some(4))
        );
        let p: FaultPatch = serde_json::from_str(r#"{"max_waiting":null,"hang":true}"#).unwrap();
        let s = f.apply(&p).unwrap();
        assert!(s.hang && s.max_waiting.is_none());
        let p: FaultPatch = serde_json::from_str(r#"{"reset":true}"#).unwrap();
        assert_eq!(f.apply(&p).unwrap(), start);
        assert_eq!(f.snapshot(), start);
    }

    #[test]
    fn invalid_patch_changes_nothing() {
        let f = Faults::new(FaultConfig::default(), 1);
        let p: FaultPatch = serde_json::from_str(r#"{"hang":true,"error_rate":3}"#).unwrap();
        assert!(f.apply(&p).is_err());
        assert!(!f.hang());
        assert!(serde_json::from_str::<FaultPatch>(r#"{"hung":true}"#).is_err());
    }

    #[test]
    fn error_draws_follow_the_rate_deterministically() {
        let cfg = FaultConfig {
            error_rate: 0.25,
            ..FaultConfig::default()
        };
        let a = Faults::new(cfg.clone(), 9);
        let b = Faults::new(cfg, 9);
        let da: Vec<bool> = (0..4000).map(|_| a.draw_error()).collect();
        let db: Vec<bool> = (0..4000).map(|_| b.draw_error()).collect();
        assert_eq!(da, db);
        let n = da.iter().filter(|&&x| x).count();
        assert!((850..1150).contains(&n), "{n}");
        assert!(!Faults::new(FaultConfig::default(), 9).draw_error());
    }
}

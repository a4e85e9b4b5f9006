//! Passive health by outlier ejection, in Envoy's manner.
//!
//! Every answered request reports its outcome. `consecutive_failures` failures
//! in a row (connect errors, timeouts, 5xx other than 503) eject the replica
//! for `cooldown × n`, where `n` counts its ejections in a row, capped at
//! `max_ejection_time`. When the time is up the replica is readmitted on its
//! own; after it has served successfully for one more `cooldown` its
//! ejection count is forgiven. A 503 means "full" (vLLM rejects queued work
//! with it) and counts as neither failure nor success.
//!
//! How many replicas of a pool may be ejected at once is decided by the pool
//! (see [`ejection_allowed`]; refused connections are exempt from the share,
//! see `routing::Pool::record_failure`); this type only keeps one replica's
//! state, in atomics, with the clock passed in so tests control time.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::config::OutlierConfig;

#[derive(Debug, Default)]
pub struct Outlier {
    consecutive: AtomicU32,
    ejections: AtomicU32,
    /// Process-clock milliseconds until which the replica is ejected (0 = never was).
    ejected_until_ms: AtomicU64,
}

/// What one outcome did to the replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing changed state.
    Counted,
    /// The replica was ejected now, for this long.
    Ejected(Duration),
    /// The threshold was reached but the pool may not eject more replicas.
    EjectionRefused,
}

impl Outlier {
    pub fn is_ejected_at(&self, now_ms: u64) -> bool {
        self.ejected_until_ms.load(Ordering::Relaxed) > now_ms
    }

    /// Milliseconds of ejection left.
    pub fn remaining_ms(&self, now_ms: u64) -> u64 {
        self.ejected_until_ms
            .load(Ordering::Relaxed)
            .saturating_sub(now_ms)
    }

    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive.load(Ordering::Relaxed)
    }

    pub fn ejection_count(&self) -> u32 {
        self.ejections.load(Ordering::Relaxed)
    }

    /// A request got a good answer.
    pub fn on_success(&self, now_ms: u64, cfg: &OutlierConfig) {
        self.on_success_at(|| now_ms, cfg);
    }

    /// [`Self::on_success`] reading the time (`now_ms`) only when it
    /// matters: for a replica ejected before, whose count may be forgiven.
    pub fn on_success_at(&self, now_ms: impl FnOnce() -> u64, cfg: &OutlierConfig) {
        self.consecutive.store(0, Ordering::Relaxed);
        let until = self.ejected_until_ms.load(Ordering::Relaxed);
        if self.ejections.load(Ordering::Relaxed) > 0
            && now_ms() >= until.saturating_add(cfg.cooldown.as_millis() as u64)
        {
            self.ejections.store(0, Ordering::Relaxed);
        }
    }

    /// A request failed. `allowed` says whether the pool may eject one more
    /// replica now; it is asked only when the threshold is reached.
    pub fn on_failure(
        &self,
        now_ms: u64,
        cfg: &OutlierConfig,
        allowed: impl FnOnce() -> bool,
    ) -> Outcome {
        if self.is_ejected_at(now_ms) {
            // A request that was already on its way when the replica was ejected.
            return Outcome::Counted;
        }
        let n = self.consecutive.fetch_add(1, Ordering::Relaxed) + 1;
        if n < cfg.consecutive_failures {
            return Outcome::Counted;
        }
        if !allowed() {
            return Outcome::EjectionRefused;
        }
        let count = self.ejections.fetch_add(1, Ordering::Relaxed) + 1;
        let time = cfg
            .cooldown
            .saturating_mul(count)
            .min(cfg.max_ejection_time);
        self.ejected_until_ms
            .store(now_ms + time.as_millis() as u64, Ordering::Relaxed);
        self.consecutive.store(0, Ordering::Relaxed);
        Outcome::Ejected(time)
    }
}

/// Whether a pool of `pool_size` with `ejected` replicas out may eject one
/// more: at most `max_percent` of the pool, but at least one replica.
pub fn ejection_allowed(pool_size: usize, ejected: usize, max_percent: u32) -> bool {
    if max_percent == 0 {
        return false;
    }
    let cap = (pool_size * max_percent as usize / 100).max(1);
    ejected < cap
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> OutlierConfig {
        OutlierConfig {
            consecutive_failures: 3,
            cooldown: Duration::from_secs(10),
            max_ejection_time: Duration::from_secs(25),
            max_ejection_percent: 50,
        }
    }

    #[test]
    fn ejects_after_threshold_for_growing_times() {
        let o = Outlier::default();
        let c = cfg();
        assert_eq!(o.on_failure(0, &c, || true), Outcome::Counted);
        assert_eq!(o.on_failure(0, &c, || true), Outcome::Counted);
        assert_eq!(
            o.on_failure(0, &c, || true),
            Outcome::Ejected(Duration::from_secs(10))
        );
        assert!(o.is_ejected_at(9_999));
        assert!(!o.is_ejected_at(10_000));
        // Readmitted, still failing: 2 × base.
        for _ in 0..2 {
            o.on_failure(10_000, &c, || true);
        }
        assert_eq!(
            o.on_failure(10_000, &c, || true),
            Outcome::Ejected(Duration::from_secs(20))
        );
        // Third time: capped at 25 s.
        for _ in 0..2 {
            o.on_failure(30_000, &c, || true);
        }
        assert_eq!(
            o.on_failure(30_000, &c, || true),
            Outcome::Ejected(Duration::from_secs(25))
        );
        assert_eq!(o.ejection_count(), 3);
    }

    #[test]
    fn success_resets_streak_and_later_forgives() {
        let o = Outlier::default();
        let c = cfg();
        o.on_failure(0, &c, || true);
        o.on_failure(0, &c, || true);
        o.on_success(0, &c);
        assert_eq!(o.on_failure(0, &c, || true), Outcome::Counted);
        o.on_failure(0, &c, || true);
        o.on_failure(0, &c, || true);
        assert_eq!(o.ejection_count(), 1);
        o.on_success(15_000, &c); // readmitted, not yet a full cooldown of good service
        assert_eq!(o.ejection_count(), 1);
        o.on_success(20_000, &c);
        assert_eq!(o.ejection_count(), 0);
    }

    #[test]
    fn success_reads_the_clock_only_after_an_ejection() {
        let o = Outlier::default();
        let c = cfg();
        o.on_failure(0, &c, || true);
        o.on_success_at(|| unreachable!("never ejected: no clock"), &c);
        for _ in 0..3 {
            o.on_failure(0, &c, || true);
        }
        assert_eq!(o.ejection_count(), 1);
        let mut read = false;
        o.on_success_at(
            || {
                read = true;
                20_000
            },
            &c,
        );
        assert!(read);
        assert_eq!(o.ejection_count(), 0);
    }

    #[test]
    fn refused_when_pool_share_exhausted() {
        let o = Outlier::default();
        let c = cfg();
        o.on_failure(0, &c, || false);
        o.on_failure(0, &c, || false);
        assert_eq!(o.on_failure(0, &c, || false), Outcome::EjectionRefused);
        assert!(!o.is_ejected_at(1));
    }

    #[test]
    fn pool_share() {
        assert!(ejection_allowed(2, 0, 10)); // at least one
        assert!(!ejection_allowed(2, 1, 10));
        assert!(ejection_allowed(10, 4, 50));
        assert!(!ejection_allowed(10, 5, 50));
        assert!(!ejection_allowed(10, 0, 0));
        assert!(ejection_allowed(1, 0, 100));
    }
}

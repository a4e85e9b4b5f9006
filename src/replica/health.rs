//! One replica's active-health state, HAProxy style: `fall` failed checks in
//! a row take an up replica down, `rise` good checks in a row bring a down
//! replica back. A replica starts up (traffic flows before the first check);
//! only the checker task writes, request paths read one atomic.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

#[derive(Debug)]
pub struct ActiveHealth {
    up: AtomicBool,
    /// Failures in a row while up, or successes in a row while down.
    streak: AtomicU32,
    /// Checks done so far (0 = never checked).
    checks: AtomicU64,
}

impl Default for ActiveHealth {
    fn default() -> Self {
        ActiveHealth {
            up: AtomicBool::new(true),
            streak: AtomicU32::new(0),
            checks: AtomicU64::new(0),
        }
    }
}

/// A change of state caused by one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    WentDown,
    CameUp,
}

impl ActiveHealth {
    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    pub fn checks(&self) -> u64 {
        self.checks.load(Ordering::Relaxed)
    }

    /// Records one check result; returns the transition it caused, if any.
    pub fn record(&self, ok: bool, fall: u32, rise: u32) -> Option<Transition> {
        self.checks.fetch_add(1, Ordering::Relaxed);
        let up = self.is_up();
        if ok == up {
            // Good check while up, or failed check while down: streak broken.
            self.streak.store(0, Ordering::Relaxed);
            return None;
        }
        let n = self.streak.fetch_add(1, Ordering::Relaxed) + 1;
        let threshold = if up { fall } else { rise };
        if n < threshold.max(1) {
            return None;
        }
        self.streak.store(0, Ordering::Relaxed);
        self.up.store(!up, Ordering::Relaxed);
        Some(if up {
            Transition::WentDown
        } else {
            Transition::CameUp
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fall_three_rise_two() {
        let h = ActiveHealth::default();
        assert!(h.is_up());
        assert_eq!(h.record(false, 3, 2), None);
        assert_eq!(h.record(false, 3, 2), None);
        assert_eq!(h.record(true, 3, 2), None); // streak broken
        assert_eq!(h.record(false, 3, 2), None);
        assert_eq!(h.record(false, 3, 2), None);
        assert_eq!(h.record(false, 3, 2), Some(Transition::WentDown));
        assert!(!h.is_up());
        assert_eq!(h.record(true, 3, 2), None);
        assert_eq!(h.record(false, 3, 2), None);
        assert_eq!(h.record(true, 3, 2), None);
        assert_eq!(h.record(true, 3, 2), Some(Transition::CameUp));
        assert!(h.is_up());
        assert_eq!(h.checks(), 10);
    }
}

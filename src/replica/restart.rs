//! Restart detection from a replica's scrapes: its cumulative
//! `prefix_cache_queries` counter going down between two scrapes means the
//! process started again (counters begin at zero), so whatever llmlb knew
//! of its prefix cache is void.
//!
//! The scrape loop feeds every good scrape's reading; a scrape without the
//! counter changes nothing (the last reading stays the reference). Each
//! restart bumps a count that readers compare with the count they last saw
//! (the routing stage's prefix indexes clear themselves on a change), so
//! nothing on the request path detects, logs or counts restarts.
//!
//! Cost: two atomic operations per scrape; lock-free for readers.

use std::sync::atomic::{AtomicU64, Ordering};

/// Stands for "no reading yet" (a NaN pattern no counter takes).
const NO_READING: u64 = u64::MAX;

/// One replica's restart count and the last counter reading it came from.
#[derive(Debug)]
pub struct RestartWatch {
    last: AtomicU64,
    restarts: AtomicU64,
}

impl Default for RestartWatch {
    fn default() -> Self {
        RestartWatch {
            last: AtomicU64::new(NO_READING),
            restarts: AtomicU64::new(0),
        }
    }
}

impl RestartWatch {
    /// Feeds a scrape's counter reading: whether it went down (a restart,
    /// now counted). `None` changes nothing.
    pub fn observe(&self, reading: Option<f64>) -> bool {
        let Some(v) = reading else {
            return false;
        };
        let last = self.last.swap(v.to_bits(), Ordering::AcqRel);
        let restarted = last != NO_READING && v < f64::from_bits(last);
        if restarted {
            self.restarts.fetch_add(1, Ordering::AcqRel);
        }
        restarted
    }

    /// How many restarts were seen so far.
    pub fn restarts(&self) -> u64 {
        self.restarts.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_lower_reading_is_a_restart() {
        let w = RestartWatch::default();
        assert!(!w.observe(Some(100.0)));
        assert!(!w.observe(None));
        assert!(!w.observe(Some(250.0)));
        assert_eq!(w.restarts(), 0);
        assert!(w.observe(Some(3.0)));
        assert!(!w.observe(Some(3.0)));
        assert_eq!(w.restarts(), 1);
    }
}

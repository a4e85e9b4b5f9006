//! Token buckets for per-key request and token rate limits.
//!
//! A bucket holds up to `capacity` units (the per-minute limit) and refills
//! continuously at `capacity / 60` units per second, so a key may burst to its
//! whole minute's allowance and is then held to the average rate. Charges that
//! were estimates (tokens before the response says how many were used) can be
//! settled later with [`TokenBucket::adjust`].
//!
//! Clock-injected (`now` is passed in) so tests control time.

use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct TokenBucket {
    capacity: f64,
    per_second: f64,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    level: f64,
    at: Instant,
}

/// How a bucket stands after a charge attempt, for the `x-ratelimit-*` headers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketStatus {
    pub limit: u64,
    pub remaining: u64,
    /// Time until the bucket is full again.
    pub reset: Duration,
}

impl TokenBucket {
    pub fn per_minute(limit: u32, now: Instant) -> TokenBucket {
        let capacity = f64::from(limit);
        TokenBucket {
            capacity,
            per_second: capacity / 60.0,
            state: Mutex::new(State {
                level: capacity,
                at: now,
            }),
        }
    }

    fn refill(&self, s: &mut State, now: Instant) {
        let dt = now.saturating_duration_since(s.at).as_secs_f64();
        s.level = (s.level + dt * self.per_second).min(self.capacity);
        s.at = now;
    }

    fn status(&self, s: &State) -> BucketStatus {
        let missing = (self.capacity - s.level).max(0.0);
        BucketStatus {
            limit: self.capacity as u64,
            remaining: s.level.max(0.0).floor() as u64,
            reset: Duration::from_secs_f64(missing / self.per_second),
        }
    }

    /// Takes `n` units if available. On refusal, returns how long until `n`
    /// units will be there (a charge larger than the capacity waits for a full
    /// bucket).
    pub fn try_take(&self, n: u64, now: Instant) -> Result<BucketStatus, (BucketStatus, Duration)> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.refill(&mut s, now);
        let need = (n as f64).min(self.capacity);
        if s.level >= need {
            s.level -= n as f64;
            Ok(self.status(&s))
        } else {
            let wait = Duration::from_secs_f64((need - s.level) / self.per_second);
            Err((self.status(&s), wait))
        }
    }

    /// Gives back (`delta > 0`) or charges more (`delta < 0`) after the fact;
    /// the level may go negative, which delays the next admission.
    pub fn adjust(&self, delta: i64, now: Instant) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.refill(&mut s, now);
        s.level = (s.level + delta as f64).min(self.capacity);
    }

    pub fn peek(&self, now: Instant) -> BucketStatus {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.refill(&mut s, now);
        self.status(&s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_to_capacity_then_refills() {
        let t0 = Instant::now();
        let b = TokenBucket::per_minute(60, t0);
        for i in 0..60 {
            let st = b.try_take(1, t0).unwrap();
            assert_eq!(st.remaining, 59 - i);
        }
        let (st, wait) = b.try_take(1, t0).unwrap_err();
        assert_eq!(st.remaining, 0);
        assert!((wait.as_secs_f64() - 1.0).abs() < 1e-6, "{wait:?}");
        assert!((st.reset.as_secs_f64() - 60.0).abs() < 1e-6);
        // One unit per second comes back.
        assert!(b.try_take(1, t0 + Duration::from_millis(1001)).is_ok());
        assert_eq!(b.peek(t0 + Duration::from_secs(600)).remaining, 60);
    }

    #[test]
    fn settlement_refunds_and_overcharges() {
        let t0 = Instant::now();
        let b = TokenBucket::per_minute(1000, t0);
        b.try_take(800, t0).unwrap();
        b.adjust(500, t0); // used 300, not 800
        assert_eq!(b.peek(t0).remaining, 700);
        b.adjust(-900, t0); // used far more than estimated
        assert_eq!(b.peek(t0).remaining, 0);
        assert!(b.try_take(1, t0).is_err());
    }

    #[test]
    fn oversized_charge_waits_for_full_bucket() {
        let t0 = Instant::now();
        let b = TokenBucket::per_minute(100, t0);
        b.try_take(50, t0).unwrap();
        let (_, wait) = b.try_take(500, t0).unwrap_err();
        assert!((wait.as_secs_f64() - 30.0).abs() < 1e-6, "{wait:?}");
    }
}

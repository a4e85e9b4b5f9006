//! What a pool queue predicts for a newcomer, and when it refuses one: the
//! drain rate it measures, the wait it estimates from it, and the deadline
//! test of levels with a `ttft_objective`.
//!
//! Units: seconds (s), requests, requests per second (req/s).
//!
//! ```text
//! service time  S  (s)      exponentially weighted mean of how long a permit
//!                           was held by a request a replica answered with a
//!                           success status (weight SERVICE_EWMA_WEIGHT)
//! drain rate    r  (req/s)  = capacity ÷ S
//! n             (requests)  = waiters at the newcomer's level or above, + 1
//!
//! max_wait test:     estimated wait  n ÷ r  > max_wait            → 429
//! ttft_objective:    predicted TTFT  w + placement  > objective   → 429
//!   w  (s)      = (n + Z·√n) ÷ r_L       (0 when a slot is free now)
//!   r_L (req/s) = r × max(1 − above_L, MIN_LEFT): the rate left to level L
//!                 once the levels above it take their share, above_L being
//!                 the share of recent grants that went to those levels
//!                 (exponentially weighted over grants, weight SHARE_WEIGHT)
//!   placement (s) the predicted TTFT on the best replica once dispatched:
//!                 wait for a batch slot there + prefill of the uncached
//!                 prompt tokens at the replica's learned (else prior)
//!                 prefill rate, computed by routing's cost model before the
//!                 request queues (`routing::placement_ttft`)
//! Retry-After (s)   = (all waiters + 1) ÷ r: the backlog's drain time
//! ```
//!
//! The deadline test is meant to hold at a high percentile, not on
//! average: if the slots free as a Poisson stream at rate `r_L`, the time
//! for `n` of them is Gamma-distributed with mean `n ÷ r_L` and standard
//! deviation `√n ÷ r_L`, so `Z = 2` standard deviations cover about 98 % of
//! waits. The priority share matters for the low levels: a free request
//! counted 60th in line waits for those 60 *and* for every paid request
//! that arrives meanwhile and goes first.
//!
//! Only requests a replica answered teach `S` ([`super::Permit::served`]):
//! a fast failure (connect refused, 5xx at once), a request refused
//! downstream, or a client that went away before its answer started frees
//! its slot without making the fleet look faster than it is. With no served
//! request yet there is no rate and the wait counts as zero (its lower
//! bound): only the depth bound, and a placement alone beyond the objective,
//! refuse anything.
//!
//! Cost: O(levels) float operations per decision, under the queue's mutex.

use std::time::Duration;

/// Weight of the newest hold time in the mean service time.
const SERVICE_EWMA_WEIGHT: f64 = 0.2;
/// Weight of the newest grant in the per-level grant shares.
const SHARE_WEIGHT: f64 = 0.05;
/// The least share of the drain rate a level is assumed to keep (aging
/// moves its waiters up even when the levels above take everything).
const MIN_LEFT: f64 = 0.1;
/// Standard deviations of the wait a deadline prediction adds.
const Z: f64 = 2.0;

/// The mean service time after a request held its slot `held` seconds
/// (an exponentially weighted mean; the first sample is the mean).
pub fn service_mean(mean: Option<f64>, held: f64) -> f64 {
    match mean {
        Some(m) => m + SERVICE_EWMA_WEIGHT * (held - m),
        None => held,
    }
}

/// What the queue has measured: its service time and who got the slots.
#[derive(Debug, Clone, Default)]
pub struct Drain {
    /// Mean time a served request held its permit, in seconds.
    pub service_mean: Option<f64>,
    /// Per level, its share of recent grants (sums to 1 once any grant).
    shares: Vec<f64>,
}

impl Drain {
    /// A served request held its slot `held` seconds.
    pub fn served(&mut self, held: f64) {
        self.service_mean = Some(service_mean(self.service_mean, held));
    }

    /// A slot went to a request at `level`.
    pub fn granted(&mut self, level: usize) {
        if self.shares.len() <= level {
            self.shares.resize(level + 1, 0.0);
        }
        for (l, s) in self.shares.iter_mut().enumerate() {
            let hit = if l == level { 1.0 } else { 0.0 };
            *s += SHARE_WEIGHT * (hit - *s);
        }
    }

    /// Requests per second the whole pool drains (`None`: nothing served yet).
    pub fn rate(&self, capacity: usize) -> Option<f64> {
        let mean = self.service_mean?;
        (mean > 0.0 && capacity > 0).then(|| capacity as f64 / mean)
    }

    /// The drain rate left to `level` after the levels above it.
    pub fn rate_for(&self, level: usize, capacity: usize) -> Option<f64> {
        let above: f64 = self.shares.iter().take(level).sum();
        Some(self.rate(capacity)? * (1.0 - above).max(MIN_LEFT))
    }

    /// Time to drain `queued` waiters and one more (1 s without a rate).
    pub fn backlog(&self, queued: usize, capacity: usize) -> Duration {
        let secs = self.rate(capacity).map_or(1.0, |r| (queued + 1) as f64 / r);
        Duration::from_secs_f64(secs)
    }
}

/// A newcomer as the deadline test sees it.
#[derive(Debug, Clone, Copy)]
pub struct Newcomer {
    pub level: usize,
    /// Waiters at its level or above (0 with `now`).
    pub ahead: usize,
    /// A slot is free and nobody waits: it is dispatched at once.
    pub now: bool,
    /// Predicted TTFT once dispatched.
    pub placement: Duration,
}

/// The newcomer's predicted time to first token, in seconds: its queue
/// wait at the high-percentile estimate (zero while no rate is known) plus
/// its placement.
pub fn predicted_ttft(drain: &Drain, capacity: usize, c: Newcomer) -> f64 {
    let n = (c.ahead + 1) as f64;
    let wait = match drain.rate_for(c.level, capacity) {
        Some(rate) if !c.now => (n + Z * n.sqrt()) / rate,
        _ => 0.0,
    };
    wait + c.placement.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(mean: f64) -> Drain {
        let mut d = Drain::default();
        d.served(mean);
        d
    }

    fn newcomer(level: usize, ahead: usize, placement_ms: u64) -> Newcomer {
        Newcomer {
            level,
            ahead,
            now: false,
            placement: Duration::from_millis(placement_ms),
        }
    }

    #[test]
    fn predicted_ttft_is_the_high_percentile_wait_plus_the_placement() {
        // 4 slots held 2 s each: 2 req/s. Eight ahead: n = 9, wait
        // (9 + 2·3) ÷ 2 = 7.5 s, plus a 0.25 s placement.
        let d = drain(2.0);
        let t = predicted_ttft(&d, 4, newcomer(0, 8, 250));
        assert!((t - 7.75).abs() < 1e-9, "{t}");
        // Dispatched at once: the placement alone.
        let now = Newcomer {
            now: true,
            ..newcomer(0, 0, 250)
        };
        assert_eq!(predicted_ttft(&d, 4, now), 0.25);
        // No served request yet: the wait counts as zero, its lower bound.
        let cold = Drain::default();
        assert_eq!(predicted_ttft(&cold, 4, newcomer(0, 8, 250)), 0.25);
        assert_eq!(predicted_ttft(&cold, 4, now), 0.25);
    }

    #[test]
    fn the_wait_grows_with_position_and_shrinks_with_capacity() {
        let d = drain(1.0);
        let at = |ahead, capacity| predicted_ttft(&d, capacity, newcomer(0, ahead, 0));
        for ahead in 0..50 {
            assert!(at(ahead + 1, 8) > at(ahead, 8));
            assert!(at(ahead, 16) < at(ahead, 8));
        }
        // Relative margin over the mean shrinks as the line grows (√n ÷ n).
        let margin = |ahead: usize| at(ahead, 8) / ((ahead + 1) as f64 / 8.0);
        assert!(margin(99) < margin(9) && margin(9) < margin(0));
    }

    #[test]
    fn a_lower_level_drains_at_what_the_levels_above_leave() {
        let mut d = drain(1.0);
        // A quarter of the slots go to level 0, the rest to level 1.
        for i in 0..400 {
            d.granted(if i % 4 == 0 { 0 } else { 1 });
        }
        let top = d.rate_for(0, 20).unwrap();
        let low = d.rate_for(1, 20).unwrap();
        assert_eq!(top, 20.0);
        assert!((low - 15.0).abs() < 0.5, "{low}");
        let t0 = predicted_ttft(&d, 20, newcomer(0, 30, 0));
        let t1 = predicted_ttft(&d, 20, newcomer(1, 30, 0));
        assert!((t1 / t0 - top / low).abs() < 1e-9);
        // Levels above taking everything leave the floor, not zero.
        let mut starved = drain(1.0);
        for _ in 0..400 {
            starved.granted(0);
        }
        let floor = starved.rate_for(1, 20).unwrap();
        assert!((floor - 20.0 * MIN_LEFT).abs() < 0.1, "{floor}");
    }

    #[test]
    fn backlog_is_the_whole_line_at_the_measured_rate() {
        assert_eq!(Drain::default().backlog(10, 4), Duration::from_secs(1));
        let d = drain(2.0);
        assert_eq!(d.backlog(9, 4), Duration::from_secs(5));
    }
}

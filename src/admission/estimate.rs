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
//! ttft_objective:    predicted TTFT  w + placement + wave  > objective → 429
//!   k (requests) = n ÷ max(1 − above_L, MIN_LEFT): the slot releases the
//!                 newcomer waits for once the levels above take their share,
//!                 above_L being the share of recent grants that went to
//!                 those levels (exponentially weighted over grants, weight
//!                 SHARE_WEIGHT: about a hundred grants, several turnovers
//!                 of the slots, so the burst of grants after a wave of
//!                 releases does not swing it)
//!   k' (requests) = ⌈k + Z·√k⌉: k with a margin for its uncertainty
//!   w  (s)       = t_k'                  (0 when a slot is free now)
//!   t_k (s)      = when the k-th slot release comes if every request holds
//!                 its slot S in all: slot i frees at rᵢ, rᵢ + S, rᵢ + 2S, …
//!                 with rᵢ = max(S − age of the request holding it, 0), and
//!                 0 for a slot free now
//!   placement (s) the predicted TTFT on the best replica once dispatched:
//!                 wait for a batch slot there + prefill of the uncached
//!                 prompt tokens at the replica's learned (else prior)
//!                 prefill rate, computed by routing's cost model before the
//!                 request queues (`routing::placement_ttft`)
//!   wave (s)     = j ÷ replicas × own prefill: j, the releases within
//!                 WAVE·S before t_k' (the same wave), are dispatched with
//!                 the newcomer, spread over the replicas, and their
//!                 prompts are prefilled in the same engine steps as its
//!                 own (a placement priced before dispatch does not see
//!                 them)
//!   no S yet:     a newcomer that would wait has no prediction → 429
//! Retry-After (s)   = (all waiters + 1) ÷ r: the backlog's drain time
//! ```
//!
//! Why a schedule rather than `k ÷ r`: requests of similar length that
//! started together (an overload that builds at once fills every slot in
//! a moment) end together, so slots free in waves a service time apart,
//! and each refill starts the next wave. `k ÷ r` averages over a wave and
//! misses the wait of a request that just missed one by up to a whole
//! service time; the ages of the requests in service do not. When the ages
//! are spread evenly the schedule comes back to about `k ÷ r`.
//!
//! The deadline test is meant to hold at a high percentile, not on
//! average. The margin is on the count: how many releases the newcomer
//! needs is uncertain (the higher levels' arrivals meanwhile are a Poisson
//! count, standard deviation about `√k`), and `Z = 2.33` of them cover
//! 99 % (one-sided): the objective is meant to hold for the 99th percentile
//! of admitted requests. Mapped through the schedule, a margin that crosses into the next
//! wave costs a whole wave, as it does in fact; with releases spread evenly
//! it is `Z·√k ÷ r` of time. The priority share matters for the low levels:
//! a free request counted 60th in line waits for those 60 *and* for every
//! paid request that arrives meanwhile and goes first.
//!
//! Only requests a replica answered teach `S` ([`super::Permit::served`]):
//! a fast failure (connect refused, 5xx at once), a request the replica
//! refused as bad (4xx), a request refused downstream, or a client that
//! went away before its answer started frees its slot without making the
//! fleet look faster than it is. (A client that leaves mid-stream after a
//! success status does count, with the shorter hold it had.) Before any
//! request was served there is no `S` and no rate for `max_wait`; the
//! deadline test then refuses a newcomer that would wait: every slot is
//! held by a request that has not finished, and nothing says when one
//! will. (Taking the oldest age as `S`, a lower bound, admitted requests
//! that then waited for a whole first wave of long requests to end: on the
//! virtual clock they made the p99 of an overload that builds at once 3.6
//! times the objective.) It costs refusals only while every slot is taken
//! before the first answer ends.
//!
//! Cost, under the queue's mutex: O(levels) for the `max_wait` test; the
//! deadline test also reads each slot's age and bisects the release
//! schedule, O(60 × capacity) float operations.

use std::time::Duration;

/// Weight of the newest hold time in the mean service time.
const SERVICE_EWMA_WEIGHT: f64 = 0.2;
/// Weight of the newest grant in the per-level grant shares.
const SHARE_WEIGHT: f64 = 0.01;
/// The least share of the drain rate a level is assumed to keep (aging
/// moves its waiters up even when the levels above take everything).
const MIN_LEFT: f64 = 0.1;
/// Standard deviations of the release count a deadline prediction adds
/// (one-sided 99 %).
const Z: f64 = 2.33;
/// Releases this close together (a share of the service time) form one
/// wave: their waiters are dispatched together.
const WAVE: f64 = 0.02;

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

/// A newcomer's predicted time to first token once dispatched, as the
/// routing stage prices it before it queues.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Placement {
    /// On the best replica now.
    pub ttft: Duration,
    /// Its own prefill there: what each request dispatched to the same
    /// replica in the same wave of releases, before it, adds.
    pub prefill: Duration,
    /// Replicas that may take it (a wave spreads over them).
    pub replicas: usize,
}

impl From<Duration> for Placement {
    /// A placement known only as a time.
    fn from(ttft: Duration) -> Placement {
        Placement {
            ttft,
            ..Placement::default()
        }
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
    pub placement: Placement,
}

/// The newcomer's predicted time to first token, in seconds: its queue
/// wait at the high-percentile estimate plus its placement. `ages`: how
/// long each request holding a slot has held it, in seconds. `None` when it
/// would wait and no request has been served yet: nothing says when a slot
/// frees.
pub fn predicted_ttft(drain: &Drain, capacity: usize, ages: &[f64], c: Newcomer) -> Option<f64> {
    let placement = c.placement.ttft.as_secs_f64();
    if c.now || ages.is_empty() {
        return Some(placement);
    }
    let service = drain.service_mean.filter(|s| *s > 0.0)?;
    let above: f64 = drain.shares.iter().take(c.level).sum();
    let k = (c.ahead + 1) as f64 / (1.0 - above).max(MIN_LEFT);
    let k = (k + Z * k.sqrt()).ceil() as usize;
    let mut remaining: Vec<f64> = ages.iter().map(|a| (service - a).max(0.0)).collect();
    remaining.resize(remaining.len().max(capacity), 0.0);
    let at = kth_release(&remaining, service, k);
    // Released in the same wave before it: dispatched with it, their
    // prefills share its replicas' next steps.
    let before_wave = releases_by(&remaining, service, at - WAVE * service);
    let with_it = k.saturating_sub(before_wave + 1) as f64;
    let wave = with_it / c.placement.replicas.max(1) as f64 * c.placement.prefill.as_secs_f64();
    Some(at + placement + wave)
}

/// How many slot releases come by `t` seconds from now: slot `i` frees at
/// `remaining[i]` and every `service` seconds after.
fn releases_by(remaining: &[f64], service: f64, t: f64) -> usize {
    remaining
        .iter()
        .filter(|r| **r <= t)
        .map(|r| ((t - r) / service) as usize + 1)
        .sum()
}

/// When the `k`-th slot release comes, in seconds from now: slot `i` frees
/// at `remaining[i]` and every `service` seconds after. Bisection on the
/// count of releases by a time; O(slots) per step, 60 steps.
pub fn kth_release(remaining: &[f64], service: f64, k: usize) -> f64 {
    if remaining.is_empty() || k == 0 || service <= 0.0 {
        return 0.0;
    }
    let releases = |t: f64| releases_by(remaining, service, t);
    let latest = remaining.iter().copied().fold(0.0, f64::max);
    let (mut lo, mut hi) = (
        0.0,
        latest + service * (k as f64 / remaining.len() as f64 + 1.0),
    );
    for _ in 0..60 {
        let mid = (lo + hi) / 2.0;
        if releases(mid) >= k {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    // The release at or just before `hi` is the k-th itself.
    remaining
        .iter()
        .filter(|r| **r <= hi)
        .map(|r| r + ((hi - r) / service).floor() * service)
        .fold(0.0, f64::max)
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
            placement: Duration::from_millis(placement_ms).into(),
        }
    }

    /// Ages spread evenly over one service time: one release every
    /// `service ÷ slots`, the first one now.
    fn spread(slots: usize, service: f64) -> Vec<f64> {
        (0..slots)
            .map(|i| service * (slots - i) as f64 / slots as f64)
            .collect()
    }

    #[test]
    fn predicted_ttft_is_the_high_percentile_wait_plus_the_placement() {
        // 4 slots held 2 s each (2 req/s), their requests' ages spread
        // evenly: releases at 0, 0.5, 1, 1.5, 2, ... s. Eight ahead: k = 9,
        // k' = ⌈9 + 2.33·√9⌉ = 16, the 16th release at 7.5 s, plus a 0.25 s
        // placement.
        let d = drain(2.0);
        let ages = spread(4, 2.0);
        let t = predicted_ttft(&d, 4, &ages, newcomer(0, 8, 250)).unwrap();
        assert!((t - 7.75).abs() < 1e-6, "{t}");
        // Dispatched at once: the placement alone.
        let now = Newcomer {
            now: true,
            ..newcomer(0, 0, 250)
        };
        assert_eq!(predicted_ttft(&d, 4, &ages, now), Some(0.25));
        // No served request yet: a newcomer that would wait has no
        // prediction, one dispatched at once has its placement.
        let cold = Drain::default();
        assert_eq!(predicted_ttft(&cold, 4, &ages, newcomer(0, 8, 250)), None);
        assert_eq!(predicted_ttft(&cold, 4, &ages, now), Some(0.25));
        // Nothing in service and nothing served: no wait to predict.
        assert_eq!(
            predicted_ttft(&cold, 4, &[], newcomer(0, 8, 250)),
            Some(0.25)
        );
    }

    #[test]
    fn requests_released_in_one_wave_share_the_prefill() {
        // Two replicas, 0.1 s of prefill for this prompt, 0.25 s placement.
        let placement = Placement {
            ttft: Duration::from_millis(250),
            prefill: Duration::from_millis(100),
            replicas: 2,
        };
        let c = Newcomer {
            placement,
            ..newcomer(0, 0, 0)
        };
        let d = drain(2.0);
        // Four requests of 2 s started together 0.5 s ago: all four slots
        // free at 1.5 s. The newcomer needs k' = ⌈1 + 2.33⌉ = 4 releases:
        // the last of the wave, with three dispatched at the same moment,
        // half of them on its replica: 1.5 + 0.25 + 1.5 × 0.1 s.
        let t = predicted_ttft(&d, 4, &[0.5; 4], c).unwrap();
        assert!((t - 1.9).abs() < 1e-6, "{t}");
        // The same releases spread over the service time: the fourth comes
        // alone, nothing shares its prefill.
        let t = predicted_ttft(&d, 4, &spread(4, 2.0), c).unwrap();
        let alone = predicted_ttft(&d, 4, &spread(4, 2.0), newcomer(0, 0, 250)).unwrap();
        assert!((t - alone).abs() < 1e-6, "{t} vs {alone}");
    }

    #[test]
    fn slots_that_started_together_free_in_waves() {
        // Four requests of 2 s started together 0.5 s ago: nothing frees
        // for 1.5 s, then all four at once, then again 2 s later.
        let wave = [0.5; 4];
        let remaining: Vec<f64> = wave.iter().map(|a| 2.0 - a).collect();
        for k in 1..=4 {
            assert!((kth_release(&remaining, 2.0, k) - 1.5).abs() < 1e-6);
        }
        for k in 5..=8 {
            assert!((kth_release(&remaining, 2.0, k) - 3.5).abs() < 1e-6);
        }
        // The first in line needs k' = ⌈1 + 2.33⌉ = 4 releases: the wave at
        // 1.5 s. The second needs ⌈2 + 2.33·√2⌉ = 6: the next wave, at 3.5 s,
        // a second more than k' ÷ r (3 s) says. With the ages spread,
        // releases come every 0.5 s from now and the sixth is at 2.5 s.
        let d = drain(2.0);
        let wait =
            |ages: &[f64], ahead| predicted_ttft(&d, 4, ages, newcomer(0, ahead, 0)).unwrap();
        assert!((wait(&wave, 0) - 1.5).abs() < 1e-6);
        assert!((wait(&wave, 1) - 3.5).abs() < 1e-6, "{}", wait(&wave, 1));
        assert!((wait(&spread(4, 2.0), 1) - 2.5).abs() < 1e-6);
        // Free slots release at once; a request older than the service
        // time is due now.
        assert_eq!(kth_release(&[0.0, 0.0], 1.0, 2), 0.0);
        let overdue = predicted_ttft(&drain(1.0), 2, &[5.0, 5.0], newcomer(0, 0, 0)).unwrap();
        assert!((overdue - 1.0).abs() < 1e-6, "{overdue}");
    }

    #[test]
    fn the_wait_grows_with_position_and_shrinks_with_capacity() {
        let d = drain(1.0);
        let at = |ahead, capacity| {
            predicted_ttft(&d, capacity, &spread(capacity, 1.0), newcomer(0, ahead, 0)).unwrap()
        };
        for ahead in 0..50 {
            assert!(at(ahead + 1, 8) >= at(ahead, 8));
            assert!(at(ahead + 4, 8) > at(ahead, 8));
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
        // Thirty in line at level 1 wait for about 40 releases (30 ÷ 0.75).
        let ages = spread(20, 1.0);
        let t0 = predicted_ttft(&d, 20, &ages, newcomer(0, 29, 0)).unwrap();
        let t1 = predicted_ttft(&d, 20, &ages, newcomer(1, 29, 0)).unwrap();
        let k1 = 30.0 / (1.0 - d.shares[0]);
        assert!((39.0..41.0).contains(&k1), "{k1}");
        // Releases every 0.05 s from now: the k'-th at (k' − 1) ÷ 20 s.
        let expect = |k: f64| ((k + Z * k.sqrt()).ceil() - 1.0) / 20.0;
        assert!((t0 - expect(30.0)).abs() < 1e-6, "{t0}");
        assert!((t1 - expect(k1)).abs() < 1e-6, "{t1}");
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

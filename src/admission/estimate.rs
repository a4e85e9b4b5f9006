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
//!   a  (share)   = above_L = A ÷ G, capped at 1 − MIN_LEFT: how many
//!                 requests the levels above the newcomer's ask for per
//!                 slot handed out. A: admitted arrivals at those levels,
//!                 G: grants, both counted over the same recent window
//!                 (exponentially decayed, time constant the longer of
//!                 DEMAND_WINDOW and DEMAND_SERVICES·S); with `[fleet]`,
//!                 summed over this instance and the others' last
//!                 reports ([`Drain::with_others`])
//!   k (requests) = n ÷ (1 − a): the slot releases the newcomer waits for
//!                 once the levels above take theirs
//!   k' (requests) = ⌈k + Z·σ⌉, σ = √(k·(1 + a)) ÷ (1 − a): k with a
//!                 margin for its uncertainty
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
//! average: `Z = 2.33` standard deviations cover 99 % (one-sided), so the
//! objective is meant to hold for the 99th percentile of admitted
//! requests. The newcomer's turn comes when the slot releases, less the
//! requests of higher levels that arrive meanwhile and go first, reach
//! its `n`. Taking both as Poisson counts (releases at rate r, higher
//! arrivals at a·r), their difference is a walk with drift (1 − a)·r and
//! variance (1 + a)·r per second; its first passage to `n`, counted in
//! releases, has mean `k = n ÷ (1 − a)` and variance
//! `n·(1 + a) ÷ (1 − a)³ = k·(1 + a) ÷ (1 − a)²`. Without levels above
//! (a = 0) the margin is `Z·√k`; with them it grows fast: each higher
//! arrival that comes early delays the newcomer, which lets more of them
//! arrive before it. At a = 0.5 it is 2.4 times `Z·√k`. Mapped through the
//! schedule, a margin that crosses into the next wave costs a whole wave,
//! as it does in fact; with releases spread evenly it is `Z·σ ÷ r` of time.
//!
//! Why the share is demand per grant and not the share of past grants:
//! what delays a free request counted 60th in line is every paid request
//! that arrives while it waits. The grants of the recent past say that
//! only while both levels were queued throughout; after a spell without a
//! queue (the start of an overload, when every request was granted at
//! once) they give the arrival mix, half the paid share of the overload
//! that follows, and a mean over grants started at zero undercounts every
//! level until about a hundred grants (three times that many with three
//! instances, each counting its own). Arrivals against grants over the
//! same window need neither: in a steady overload the ratio is the higher
//! levels' arrival rate over the drain rate, and with no queue it is their
//! share of the arrivals. Several instances in front of one pool
//! (`[fleet]`) each see a part of the arrivals and a part of the grants,
//! and the two parts differ: an instance's grants follow its slot leases
//! and the shared order's hold-back, not its arrivals. One instance's ratio
//! then missed the fleet's (median 0.32–0.41 against 0.49 in the scenario
//! below), so each prices with the fleet's sums: its own counts plus the
//! ones the others report every refresh. Measured in the
//! demo's priority scenario (`scripts/fleet-priority-lab.sh`, free level
//! with a 4 s objective): admitted free requests that missed it had been
//! priced with a paid share of 0.06–0.25 at the first waves of the
//! overload, against 0.5 in fact (`docs/lab/deadline-admission.md`).
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
/// Shortest time constant, in seconds, of the counts of arrivals and
/// grants behind the higher levels' share.
const DEMAND_WINDOW: f64 = 10.0;
/// Their time constant in service times, when that is longer.
const DEMAND_SERVICES: f64 = 4.0;
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

/// What the queue has measured: its service time, and how many requests
/// each level asked for against the slots handed out.
#[derive(Debug, Clone, Default)]
pub struct Drain {
    /// Mean time a served request held its permit, in seconds.
    pub service_mean: Option<f64>,
    /// Per level, admitted arrivals, and the slots handed out, decayed
    /// over the demand window.
    counts: Counts,
    /// When the counts were last decayed (seconds, the caller's clock).
    at: f64,
}

impl Drain {
    /// A served request held its slot `held` seconds.
    pub fn served(&mut self, held: f64) {
        self.service_mean = Some(service_mean(self.service_mean, held));
    }

    /// A request at `level` was admitted (dispatched or queued) at `now`
    /// seconds.
    pub fn arrived(&mut self, level: usize, now: f64) {
        self.decay(now);
        let demand = &mut self.counts.demand;
        if demand.len() <= level {
            demand.resize(level + 1, 0.0);
        }
        demand[level] += 1.0;
    }

    /// A slot was handed out at `now` seconds.
    pub fn granted(&mut self, now: f64) {
        self.decay(now);
        self.counts.grants += 1.0;
    }

    /// Ages the counts to `now` (never backwards).
    fn decay(&mut self, now: f64) {
        if now <= self.at {
            return;
        }
        let keep = self.keep(now - self.at);
        self.counts.scale(keep);
        self.at = now;
    }

    /// What is left of a count after `age` seconds of decay.
    fn keep(&self, age: f64) -> f64 {
        let window = DEMAND_WINDOW.max(DEMAND_SERVICES * self.service_mean.unwrap_or(0.0));
        (-age.max(0.0) / window).exp()
    }

    /// The decayed counts as they stand at `now`: what an instance reports
    /// to the others.
    pub fn counts(&self, now: f64) -> Counts {
        self.counts.scaled(self.keep(now - self.at))
    }

    /// This drain with the other instances' counts (`others`, reported
    /// `age` seconds ago) added to its own at `now`: the fleet's admitted
    /// arrivals per level and grants, so that the share of the levels
    /// above is the fleet's ratio, whatever part of the grants this
    /// instance gets.
    pub fn with_others(&self, others: &Counts, age: f64, now: f64) -> Drain {
        let mut fleet = self.clone();
        fleet.decay(now);
        fleet.counts.add(&others.scaled(self.keep(age)));
        fleet
    }

    /// The share of slot releases the levels above `level` take: their
    /// admitted arrivals per grant, at most `1 − MIN_LEFT` (0 before any
    /// grant).
    pub fn above(&self, level: usize) -> f64 {
        let Counts { demand, grants } = &self.counts;
        let asked: f64 = demand.iter().take(level).sum();
        if *grants <= 0.0 {
            return 0.0;
        }
        (asked / grants).min(1.0 - MIN_LEFT)
    }

    /// Requests per second the whole pool drains (`None`: nothing served yet).
    pub fn rate(&self, capacity: usize) -> Option<f64> {
        let mean = self.service_mean?;
        (mean > 0.0 && capacity > 0).then(|| capacity as f64 / mean)
    }

    /// The drain rate left to `level` after the levels above it.
    pub fn rate_for(&self, level: usize, capacity: usize) -> Option<f64> {
        Some(self.rate(capacity)? * (1.0 - self.above(level)))
    }

    /// Time to drain `queued` waiters and one more (1 s without a rate).
    pub fn backlog(&self, queued: usize, capacity: usize) -> Duration {
        let secs = self.rate(capacity).map_or(1.0, |r| (queued + 1) as f64 / r);
        Duration::from_secs_f64(secs)
    }
}

/// Admitted arrivals per level and grants, decayed over the demand window:
/// one instance's, or several instances' summed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counts {
    /// Per level, highest first.
    pub demand: Vec<f64>,
    pub grants: f64,
}

impl Counts {
    /// Multiplies these counts by `k` (what is left of them after a decay).
    fn scale(&mut self, k: f64) {
        self.demand.iter_mut().for_each(|d| *d *= k);
        self.grants *= k;
    }

    /// These counts times `k`.
    fn scaled(&self, k: f64) -> Counts {
        let mut c = self.clone();
        c.scale(k);
        c
    }

    /// Adds `other` to these counts.
    pub fn add(&mut self, other: &Counts) {
        if self.demand.len() < other.demand.len() {
            self.demand.resize(other.demand.len(), 0.0);
        }
        for (d, o) in self.demand.iter_mut().zip(&other.demand) {
            *d += o;
        }
        self.grants += other.grants;
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
    let above = drain.above(c.level);
    let left = 1.0 - above;
    let k = (c.ahead + 1) as f64 / left;
    let sigma = (k * (1.0 + above)).sqrt() / left;
    let k = (k + Z * sigma).ceil() as usize;
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
        // 20 grants a second for 20 s; level 0 asks for 5 a second, level
        // 1 for 15.
        for i in 0..400 {
            let t = i as f64 * 0.05;
            d.arrived(if i % 4 == 0 { 0 } else { 1 }, t);
            d.granted(t);
        }
        let top = d.rate_for(0, 20).unwrap();
        let low = d.rate_for(1, 20).unwrap();
        assert_eq!(top, 20.0);
        assert!((low - 15.0).abs() < 0.5, "{low}");
        // Thirty in line at level 1 wait for about 40 releases (30 ÷ 0.75),
        // and their count varies by √(k·(1 + a)) ÷ (1 − a).
        let ages = spread(20, 1.0);
        let t0 = predicted_ttft(&d, 20, &ages, newcomer(0, 29, 0)).unwrap();
        let t1 = predicted_ttft(&d, 20, &ages, newcomer(1, 29, 0)).unwrap();
        let a = d.above(1);
        let k1 = 30.0 / (1.0 - a);
        assert!((39.0..41.0).contains(&k1), "{k1}");
        // Releases every 0.05 s from now: the k'-th at (k' − 1) ÷ 20 s.
        let expect = |k: f64, sd: f64| ((k + Z * sd).ceil() - 1.0) / 20.0;
        assert!((t0 - expect(30.0, 30f64.sqrt())).abs() < 1e-6, "{t0}");
        let sd = (k1 * (1.0 + a)).sqrt() / (1.0 - a);
        assert!((t1 - expect(k1, sd)).abs() < 1e-6, "{t1}");
        // Levels above asking for every slot leave the floor, not zero.
        let mut starved = drain(1.0);
        for i in 0..400 {
            starved.arrived(0, i as f64 * 0.05);
            starved.granted(i as f64 * 0.05);
        }
        let floor = starved.rate_for(1, 20).unwrap();
        assert!((floor - 20.0 * MIN_LEFT).abs() < 0.1, "{floor}");
    }

    #[test]
    fn the_higher_share_is_what_they_ask_for_not_what_they_were_given() {
        // An overload that builds at once: 32 slots granted at 0 s to the
        // arrival mix (one in six at level 0), then 2.4 s without a free
        // slot while level 0 keeps asking for 7 a second. A sixth of the
        // grants so far went to level 0 (a mean over grants started at zero
        // said 0.06); it asked for about 0.7 of them (23 in all, the late
        // ones weighing more).
        let mut d = Drain::default();
        for i in 0..32 {
            d.arrived(usize::from(i % 6 != 0), 0.0);
            d.granted(0.0);
        }
        for i in 1..=17 {
            d.arrived(0, i as f64 / 7.0);
        }
        d.served(2.4);
        let a = d.above(1);
        assert!((0.7..0.85).contains(&a), "{a}");
        // A ratio of two counts over one window: the same after 10
        // grants as after 1,000 of the same mix, with no warm-up.
        let mix = |grants: usize| {
            let mut d = Drain::default();
            for i in 0..grants {
                let t = i as f64 * 0.1;
                if i % 2 == 0 {
                    d.arrived(0, t);
                }
                d.granted(t);
            }
            d.above(1)
        };
        assert!((mix(10) - 0.5).abs() < 0.05, "{}", mix(10));
        assert!((mix(1_000) - 0.5).abs() < 0.01, "{}", mix(1_000));
        // Nothing granted yet: no share; nothing is above level 0.
        assert_eq!(Drain::default().above(1), 0.0);
        assert_eq!(d.above(0), 0.0);
    }

    #[test]
    fn with_other_instances_the_share_is_the_fleets_ratio() {
        // Two instances each admit 100 level-0 requests over 10 s, but
        // leases give the first 300 grants and the second 100: alone they
        // price 0.33 and 0.9 (the cap); the fleet asks for 200 of 400.
        let (mut a, mut b) = (drain(1.0), drain(1.0));
        for i in 0..100 {
            let t = i as f64 * 0.1;
            a.arrived(0, t);
            b.arrived(0, t);
            b.granted(t);
            for _ in 0..3 {
                a.granted(t);
            }
        }
        let now = 10.0;
        assert!((a.above(1) - 1.0 / 3.0).abs() < 0.01, "{}", a.above(1));
        assert_eq!(b.above(1), 1.0 - MIN_LEFT);
        let fleet_a = a.with_others(&b.counts(now), 0.0, now).above(1);
        let fleet_b = b.with_others(&a.counts(now), 0.0, now).above(1);
        assert!((fleet_a - 0.5).abs() < 0.01, "{fleet_a}");
        assert!((fleet_b - 0.5).abs() < 0.01, "{fleet_b}");
        // The counts decay over the window (10 s here): a report read
        // 10 s late weighs 1/e of one read at once.
        let c = a.counts(now);
        let later = a.counts(now + 10.0);
        assert!((later.grants / c.grants - (-1f64).exp()).abs() < 1e-9);
        let stale = Drain::default().with_others(&c, 10.0, now);
        assert!((stale.counts(now).grants / c.grants - (-1f64).exp()).abs() < 1e-9);
        // Nothing from the others: this instance's own ratio.
        let alone = a.with_others(&Counts::default(), 0.0, now).above(1);
        assert!((alone - a.above(1)).abs() < 1e-12);
    }

    #[test]
    fn higher_arrivals_widen_the_margin() {
        // 20 slots, releases every 0.05 s; 9 in line at level 1 (n = 10).
        // Level 0 asks for half the grants: k = 20 releases, σ =
        // √(20 · 1.5) ÷ 0.5 ≈ 11 (√20 ≈ 4.5 with no level above).
        let mut d = drain(1.0);
        for i in 0..200 {
            let t = i as f64 * 0.05;
            if i % 2 == 0 {
                d.arrived(0, t);
            }
            d.granted(t);
        }
        let a = d.above(1);
        let ages = spread(20, 1.0);
        let t = predicted_ttft(&d, 20, &ages, newcomer(1, 9, 0)).unwrap();
        let k = 10.0 / (1.0 - a);
        let k_prime = (k + Z * (k * (1.0 + a)).sqrt() / (1.0 - a)).ceil();
        assert!((t - (k_prime - 1.0) / 20.0).abs() < 1e-6, "{t}");
        assert!((45.0..48.0).contains(&k_prime), "{k_prime}");
    }

    #[test]
    fn backlog_is_the_whole_line_at_the_measured_rate() {
        assert_eq!(Drain::default().backlog(10, 4), Duration::from_secs(1));
        let d = drain(2.0);
        assert_eq!(d.backlog(9, 4), Duration::from_secs(5));
    }
}

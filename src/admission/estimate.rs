//! What a pool queue predicts for a newcomer, and when it refuses one: the
//! drain rate it measures, the wait it estimates from it, and the deadline
//! test of levels with a `ttft_objective`.
//!
//! Units: seconds (s), requests, requests per second (req/s).
//!
//! ```text
//! service time  S  (s)      exponentially weighted mean of how long a permit
//!                           was held by a request a replica answered with a
//!                           success status (weight SERVICE_EWMA_WEIGHT);
//!                           in the deadline test, while fewer requests
//!                           were served than the pool has slots, at least
//!                           the age of the oldest request holding one
//! drain rate    r  (req/s)  = capacity ÷ S
//! n             (requests)  = waiters at the newcomer's level or above, + 1
//!
//! max_wait test:     estimated wait  n ÷ r  > max_wait            → 429
//! ttft_objective:    predicted TTFT  w + placement + wave  > objective → 429
//!   a  (share)   = λ_above ÷ r, capped at 1 − MIN_LEFT: the share of the
//!                 slot releases the levels above the newcomer's take.
//!                 λ_above: their admitted arrivals per second, counted
//!                 over a recent window (exponentially decayed, time
//!                 constant the longer of DEMAND_WINDOW and
//!                 DEMAND_SERVICES·S) and divided by the time that window
//!                 has covered; with `[fleet]`, this instance's plus the
//!                 rates the others last reported ([`Drain::with_others`]),
//!                 taken Z standard deviations up: a rate counted from m
//!                 arrivals is uncertain by √m ÷ the time it covers
//!   k (requests) = n ÷ (1 − a): the slot releases the newcomer waits for
//!                 once the levels above take theirs
//!   k' (requests) = ⌈k + Z·σ⌉, σ = √(k·(1 + a)) ÷ (1 − a): k with a
//!                 margin for its uncertainty
//!   w  (s)       = t_k'                  (0 when a slot is free now)
//!   t_k (s)      = when the k-th slot release comes if every request holds
//!                 its slot S in all: slot i frees at rᵢ, then at fᵢ + S,
//!                 fᵢ + 2S, … with rᵢ = max(S − age of the request holding
//!                 it, 0) (0 for a slot free now) and fᵢ the latest release
//!                 within REFILL·S after rᵢ: the requests dispatched into
//!                 slots freed close together end together, with the last
//!                 of them
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
//! Why the share is an arrival rate over the drain rate: what delays a
//! free request counted 60th in line is every paid request that arrives
//! while it waits, per slot release. The grants of the recent past say
//! that only while both levels were queued throughout. A ratio of
//! admitted arrivals to grants over one window (the rule before this one)
//! counts, at the start of an overload, the first instant's grants (every
//! slot filled at once) as drain as well as the first wave of releases
//! after them: in the demo's priority scenario it priced the paid share
//! at 0.25–0.39 at the first waves, where paid asked for about half the
//! releases, and admitted free requests that then missed their objective.
//! An arrival rate over `r = capacity ÷ S` has no such start: it needs
//! only `S`, which the deadline test needs anyway. Several instances in
//! front of one pool (`[fleet]`) each see a part of the arrivals; each
//! reports its rate every refresh and prices with the fleet's sum, over
//! the pool's whole capacity. Measured on the virtual clock
//! (`docs/lab/deadline-admission.md`): free admitted p99 within its 4 s
//! objective in 10 of 10 seeds through one instance (9 before) and 7 of 10
//! through three (5 before); 10 of 10 through three once later rounds of
//! releases come with their refill waves (`REFILL`).
//!
//! Why the two bounds (the oldest age in `S`, the share's count): with
//! answers of varied length (64–192 output tokens, the demo's mean) the
//! free tier's admitted p99 was 3.5–8.5 s against its 4 s objective on
//! the virtual clock, most misses at the start of an overload. The first
//! answers served are the shortest of those that started first, so their
//! mean said 1.7 s where the holds were 2.7 s; and the few paid arrivals
//! counted in the first seconds priced the paid share at half what it
//! then asked. With both bounds: 1.6–3.2 s (seeds 7–12, one instance and
//! three), at 3–5 % fewer free requests admitted; with 128 output tokens
//! 2.2–2.6 s, 4–5 % fewer (`docs/lab/fleet-instances.md`, "Answers of
//! varied length").
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
/// wave: their waiters are dispatched together and prefilled in the same
/// engine steps. Waves narrow as an overload goes on (requests prefilled
/// in one step and of one length end in one step), so the window is wider
/// than the spread of the slots' ages suggests. In the demo's priority
/// scenario on the virtual clock (10 seeds, free objective 4 s): at 0.02
/// the free p99 missed at 3 seeds through three instances and reached
/// 3.55–3.86 s at 3 through one; at 0.05 it missed at 2 (4.15, 4.26 s)
/// and reached 2.97 s at most through one.
const WAVE: f64 = 0.05;
/// The waiters dispatched into slots freed within this share of the
/// service time after one another end together, with the last of them:
/// their prompts are prefilled in the same engine steps, which hold back
/// the decode of the first ones until the last ones join them. In the
/// demo's priority scenario on the virtual clock (seed 9), a wave of 32
/// releases spread over 0.1 S ended within 0.01 S. At 0.05 and 0.1 the
/// free p99 through three instances still missed its 4 s objective at two
/// seeds of ten (4.25/4.07 s, 4.02/4.07 s); at 0.15 at none (3.80 s at
/// most), with at most 3 more free refusals per seed (of about 700).
const REFILL: f64 = 0.15;

/// The mean service time after a request held its slot `held` seconds
/// (an exponentially weighted mean; the first sample is the mean).
pub fn service_mean(mean: Option<f64>, held: f64) -> f64 {
    match mean {
        Some(m) => m + SERVICE_EWMA_WEIGHT * (held - m),
        None => held,
    }
}

/// What the queue has measured: its service time, and how many requests
/// each level asked for per second.
#[derive(Debug, Clone, Default)]
pub struct Drain {
    /// Mean time a served request held its permit, in seconds.
    pub service_mean: Option<f64>,
    /// How many served requests taught `service_mean`.
    served: usize,
    /// Per level, admitted arrivals, decayed over the demand window.
    counts: Vec<f64>,
    /// When the counts were last decayed (seconds, the caller's clock).
    at: f64,
    /// When the first arrival was counted: the decay has covered the time
    /// since (`None`: nothing counted yet).
    origin: Option<f64>,
    /// The other instances' admitted arrival rates ([`Drain::with_others`]).
    others: Arrivals,
}

impl Drain {
    /// A served request held its slot `held` seconds.
    pub fn served(&mut self, held: f64) {
        self.service_mean = Some(service_mean(self.service_mean, held));
        self.served += 1;
    }

    /// The service time a deadline prediction uses: the mean, and while
    /// fewer requests were served than the pool has slots, at least the
    /// age of the oldest request holding one (`ages`). The first requests
    /// served are the shortest of those that started first, so their mean
    /// is low; every one still running has held its slot at least its age.
    fn service_for(&self, capacity: usize, ages: &[f64]) -> Option<f64> {
        let mean = self.service_mean.filter(|s| *s > 0.0)?;
        if self.served >= capacity {
            return Some(mean);
        }
        Some(ages.iter().copied().fold(mean, f64::max))
    }

    /// A request at `level` was admitted (dispatched or queued) at `now`
    /// seconds.
    pub fn arrived(&mut self, level: usize, now: f64) {
        self.origin.get_or_insert(now);
        self.decay(now);
        if self.counts.len() <= level {
            self.counts.resize(level + 1, 0.0);
        }
        self.counts[level] += 1.0;
    }

    /// Ages the counts to `now` (never backwards).
    fn decay(&mut self, now: f64) {
        if now <= self.at {
            return;
        }
        let keep = self.keep(now - self.at);
        self.counts.iter_mut().for_each(|c| *c *= keep);
        self.at = now;
    }

    /// What is left of a count after `age` seconds of decay.
    fn keep(&self, age: f64) -> f64 {
        (-age.max(0.0) / self.window()).exp()
    }

    /// The counts' time constant, in seconds.
    fn window(&self) -> f64 {
        DEMAND_WINDOW.max(DEMAND_SERVICES * self.service_mean.unwrap_or(0.0))
    }

    /// This instance's admitted arrivals per level and second at `now`: the
    /// decayed counts over the time the decay has covered since the first
    /// one, `w·(1 − e^(−t/w))`, at least one service time (so a burst at
    /// the start is not read as an unbounded rate). What an instance
    /// reports to the others.
    pub fn arrivals(&self, now: f64) -> Arrivals {
        let Some(origin) = self.origin else {
            return Arrivals::default();
        };
        let now = now.max(self.at);
        let covered = self.covered(origin, now);
        if covered <= 0.0 {
            return Arrivals::default();
        }
        let keep = self.keep(now - self.at);
        Arrivals {
            rates: self.counts.iter().map(|c| c * keep / covered).collect(),
        }
    }

    /// The time the counts cover at `now`, from the first arrival at
    /// `origin`, in seconds.
    fn covered(&self, origin: f64, now: f64) -> f64 {
        let window = self.window();
        let covered = window * (1.0 - (-(now - origin) / window).exp());
        covered.max(self.service_mean.unwrap_or(0.0))
    }

    /// This drain with the other instances' admitted arrival rates added to
    /// its own: the fleet's, so that the share of the levels above is what
    /// the whole fleet asks of the pool's slots. Each instance's rate is
    /// over its own window, so one that joined late prices with the
    /// others' long windows, not its short one.
    pub fn with_others(&self, others: &Arrivals) -> Drain {
        let mut fleet = self.clone();
        fleet.others.add(others);
        fleet
    }

    /// The share of slot releases the levels above `level` take: their
    /// admitted arrival rate (this instance's at its last count, with the
    /// others' added) over the drain rate of `capacity` slots, at most
    /// `1 − MIN_LEFT`; 0 before a request was served.
    pub fn above(&self, level: usize, capacity: usize) -> f64 {
        self.share(level, capacity, 0.0)
    }

    /// [`Drain::above`] at its high-percentile bound: the higher levels'
    /// rate is a count of `m` arrivals over the time the counts cover, and
    /// a count varies by `√m`, so the rate is taken `Z` standard
    /// deviations up. Early in an overload the count is a few arrivals and
    /// the bound well above the point estimate; it closes in as the count
    /// grows (about +28 % at 70 arrivals).
    pub fn above_bound(&self, level: usize, capacity: usize) -> f64 {
        self.share(level, capacity, Z)
    }

    /// The share of the levels above `level`, their rate taken `z`
    /// standard deviations of its count up. The fleet's rate is counted
    /// over this instance's window.
    fn share(&self, level: usize, capacity: usize, z: f64) -> f64 {
        let Some(drain) = self.rate(capacity) else {
            return 0.0;
        };
        let mut fleet = self.arrivals(self.at);
        fleet.add(&self.others);
        let mut asked: f64 = fleet.rates.iter().take(level).sum();
        if let Some(origin) = self.origin.filter(|_| z > 0.0) {
            let covered = self.covered(origin, self.at);
            if covered > 0.0 {
                asked += z * (asked / covered).sqrt();
            }
        }
        (asked / drain).min(1.0 - MIN_LEFT)
    }

    /// Requests per second the whole pool drains (`None`: nothing served yet).
    pub fn rate(&self, capacity: usize) -> Option<f64> {
        let mean = self.service_mean?;
        (mean > 0.0 && capacity > 0).then(|| capacity as f64 / mean)
    }

    /// The drain rate left to `level` after the levels above it.
    pub fn rate_for(&self, level: usize, capacity: usize) -> Option<f64> {
        Some(self.rate(capacity)? * (1.0 - self.above(level, capacity)))
    }

    /// Time to drain `queued` waiters and one more (1 s without a rate).
    pub fn backlog(&self, queued: usize, capacity: usize) -> Duration {
        let secs = self.rate(capacity).map_or(1.0, |r| (queued + 1) as f64 / r);
        Duration::from_secs_f64(secs)
    }
}

/// Admitted arrivals per level and second: one instance's, or several
/// instances' summed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Arrivals {
    /// Per level, highest first.
    pub rates: Vec<f64>,
}

impl Arrivals {
    /// Adds `other` to these rates.
    pub fn add(&mut self, other: &Arrivals) {
        if self.rates.len() < other.rates.len() {
            self.rates.resize(other.rates.len(), 0.0);
        }
        for (r, o) in self.rates.iter_mut().zip(&other.rates) {
            *r += o;
        }
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
    let service = drain.service_for(capacity, ages)?;
    let above = drain.above_bound(c.level, capacity);
    let left = 1.0 - above;
    let k = (c.ahead + 1) as f64 / left;
    let sigma = (k * (1.0 + above)).sqrt() / left;
    let k = (k + Z * sigma).ceil() as usize;
    let mut remaining: Vec<f64> = ages.iter().map(|a| (service - a).max(0.0)).collect();
    remaining.resize(remaining.len().max(capacity), 0.0);
    let schedule = Schedule::new(remaining, service);
    let at = schedule.kth(k);
    // Released in the same wave before it: dispatched with it, their
    // prefills share its replicas' next steps.
    let before_wave = schedule.releases_by(at - WAVE * service);
    let with_it = k.saturating_sub(before_wave + 1) as f64;
    let wave = with_it / c.placement.replicas.max(1) as f64 * c.placement.prefill.as_secs_f64();
    Some(at + placement + wave)
}

/// The release schedule of a pool's slots, in seconds from now: slot `i`
/// frees first at `first[i]`, then every `service` seconds from `refill[i]`,
/// the last release within `REFILL·S` after its own. The waiters
/// dispatched into slots freed close together are prefilled in the same
/// engine steps and then decode side by side, so they end together, with
/// the last of them, not spread as their slots were freed.
struct Schedule {
    first: Vec<f64>,
    refill: Vec<f64>,
    service: f64,
}

impl Schedule {
    fn new(first: Vec<f64>, service: f64) -> Schedule {
        let mut sorted = first.clone();
        sorted.sort_by(f64::total_cmp);
        let refill = (first.iter())
            .map(|&r| {
                let end = r + REFILL * service;
                let i = sorted.partition_point(|&x| x <= end);
                sorted[..i].last().copied().unwrap_or(r).max(r)
            })
            .collect();
        Schedule {
            first,
            refill,
            service,
        }
    }

    /// How many slot releases come by `t`.
    fn releases_by(&self, t: f64) -> usize {
        (self.first.iter().zip(&self.refill))
            .filter(|(first, _)| **first <= t)
            .map(|(_, refill)| 1 + ((t - refill) / self.service).max(0.0) as usize)
            .sum()
    }

    /// The latest release of any slot at or before `t`.
    fn last_by(&self, t: f64) -> f64 {
        (self.first.iter().zip(&self.refill))
            .filter(|(first, _)| **first <= t)
            .map(|(first, refill)| {
                let later = ((t - refill) / self.service).floor();
                if later >= 1.0 {
                    refill + later * self.service
                } else {
                    *first
                }
            })
            .fold(0.0, f64::max)
    }

    /// When the `k`-th release comes. Bisection on the count of releases by
    /// a time; O(slots) per step, 60 steps.
    fn kth(&self, k: usize) -> f64 {
        if self.first.is_empty() || k == 0 || self.service <= 0.0 {
            return 0.0;
        }
        let latest = self.refill.iter().copied().fold(0.0, f64::max);
        let rounds = k as f64 / self.first.len() as f64 + 1.0;
        let (mut lo, mut hi) = (0.0, latest + self.service * rounds);
        for _ in 0..60 {
            let mid = (lo + hi) / 2.0;
            if self.releases_by(mid) >= k {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        // The release at or just before `hi` is the k-th itself.
        self.last_by(hi)
    }
}

/// When the `k`-th slot release comes, in seconds from now: slot `i` frees
/// at `remaining[i]`, then every `service` seconds with the slots freed in
/// the same wave ([`Schedule`]).
pub fn kth_release(remaining: &[f64], service: f64, k: usize) -> f64 {
    Schedule::new(remaining.to_vec(), service).kth(k)
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
        // Free slots release at once; once as many requests were served as
        // there are slots, a request older than the service time is due now.
        assert_eq!(kth_release(&[0.0, 0.0], 1.0, 2), 0.0);
        let mut d = drain(1.0);
        d.served(1.0);
        let overdue = predicted_ttft(&d, 2, &[5.0, 5.0], newcomer(0, 0, 0)).unwrap();
        assert!((overdue - 1.0).abs() < 1e-6, "{overdue}");
    }

    #[test]
    fn until_a_slot_count_is_served_the_oldest_age_bounds_the_service_time() {
        // Eight slots filled together 2.5 s ago; the two shortest answers
        // (1.5 s) have ended, six are still running. Their holds are at
        // least 2.5 s: a mean of 1.5 s would free all six now and refill
        // them every 1.5 s.
        let mut d = drain(1.5);
        d.served(1.5);
        let ages = [2.5; 6];
        let c = newcomer(0, 7, 0);
        let early = predicted_ttft(&d, 8, &ages, c).unwrap();
        let remaining = [0.0; 8];
        let k = (8.0 + Z * 8f64.sqrt()).ceil() as usize;
        assert!(
            (early - kth_release(&remaining, 2.5, k)).abs() < 1e-6,
            "{early}"
        );
        // Once eight were served the mean speaks alone.
        for _ in 0..6 {
            d.served(1.5);
        }
        let later = predicted_ttft(&d, 8, &ages, c).unwrap();
        assert!(
            (later - kth_release(&remaining, 1.5, k)).abs() < 1e-6,
            "{later}"
        );
        assert!(later < early);
    }

    #[test]
    fn slots_refilled_together_free_together_with_the_last() {
        // Four slots of a 2 s service free at 1.0, 1.1, 1.2 and 1.9 s. The
        // first three are refilled in one wave (within 0.15 × 2 s of each
        // other): their waiters are prefilled together and end together,
        // with the last of them, at 1.2 + 2 s. The fourth is alone: 3.9 s.
        let remaining = [1.0, 1.1, 1.2, 1.9];
        let kth = |k| kth_release(&remaining, 2.0, k);
        let expected = [1.0, 1.1, 1.2, 1.9, 3.2, 3.2, 3.2, 3.9, 5.2];
        for (k, want) in expected.iter().enumerate() {
            assert!(
                (kth(k + 1) - want).abs() < 1e-6,
                "k = {}: {}",
                k + 1,
                kth(k + 1)
            );
        }
        // Spread a service time apart, no slot waits for another.
        let spread = [0.0, 0.5, 1.0, 1.5];
        assert!((kth_release(&spread, 2.0, 5) - 2.0).abs() < 1e-6);
        assert!((kth_release(&spread, 2.0, 6) - 2.5).abs() < 1e-6);
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
        // 20 slots held 1 s each drain 20 a second; over 20 s level 0 asks
        // for 5 a second, level 1 for 15.
        let mut d = drain(1.0);
        for i in 0..400 {
            let t = i as f64 * 0.05;
            d.arrived(if i % 4 == 0 { 0 } else { 1 }, t);
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
        assert!((39.0..41.0).contains(&(30.0 / (1.0 - d.above(1, 20)))));
        // The prediction takes the share at its bound.
        let a = d.above_bound(1, 20);
        assert!(a > d.above(1, 20) + 0.05, "{a}");
        let k1 = 30.0 / (1.0 - a);
        // The k'-th release of the schedule (every 0.05 s from now in the
        // first round, the later rounds with their refill waves).
        let remaining: Vec<f64> = ages.iter().map(|a| 1.0 - a).collect();
        let expect = |k: f64, sd: f64| kth_release(&remaining, 1.0, (k + Z * sd).ceil() as usize);
        assert!((t0 - expect(30.0, 30f64.sqrt())).abs() < 1e-6, "{t0}");
        let sd = (k1 * (1.0 + a)).sqrt() / (1.0 - a);
        assert!((t1 - expect(k1, sd)).abs() < 1e-6, "{t1}");
        // Levels above asking for every slot leave the floor, not zero.
        let mut starved = drain(1.0);
        for i in 0..400 {
            starved.arrived(0, i as f64 * 0.05);
        }
        let floor = starved.rate_for(1, 20).unwrap();
        assert!((floor - 20.0 * MIN_LEFT).abs() < 0.1, "{floor}");
    }

    #[test]
    fn the_higher_share_is_their_arrival_rate_over_the_drain_rate() {
        // An overload that builds at once: 32 slots filled at 0 s by the
        // arrival mix (one in six at level 0), then level 0 asks for 7 a
        // second; slots are held 2.3 s, so the pool drains 13.9 a second
        // and level 0 takes about half of it. At 3.5 s (the first wave of
        // releases) a ratio of its arrivals to the 32 + 16 grants so far
        // said 0.5 only by luck of the timing, and less a moment earlier
        // (the first instant's grants count as drain); a rate has no such
        // start (the burst of level-0 arrivals at 0 s lifts it a little).
        let mut d = Drain::default();
        for i in 0..32 {
            d.arrived(usize::from(i % 6 != 0), 0.0);
        }
        for i in 1..=24 {
            d.arrived(0, i as f64 / 7.0);
        }
        d.served(2.3);
        let a = d.above(1, 32);
        assert!((0.5..0.65).contains(&a), "{a}");
        // The same at 10 arrivals as at 1,000 of the same rate: the decayed
        // count over the time it covered needs no warm-up.
        let steady = |arrivals: usize| {
            let mut d = drain(1.0);
            for i in 0..arrivals {
                d.arrived(0, i as f64 * 0.2);
            }
            d.above(1, 10)
        };
        assert!((steady(10) - 0.5).abs() < 0.1, "{}", steady(10));
        assert!((steady(1_000) - 0.5).abs() < 0.02, "{}", steady(1_000));
        // Nothing served yet: no drain rate, no share; nothing is above
        // level 0.
        let mut cold = Drain::default();
        cold.arrived(0, 0.0);
        assert_eq!(cold.above(1, 32), 0.0);
        assert_eq!(d.above(0, 32), 0.0);
    }

    #[test]
    fn with_other_instances_the_share_is_the_fleets_rate() {
        // 30 slots held 1 s: the pool drains 30 a second. Instance a admits
        // 10 level-0 requests a second, b 5: alone they price 1/3 and 1/6,
        // the fleet asks for half.
        let (mut a, mut b) = (drain(1.0), drain(1.0));
        for i in 0..100 {
            let t = i as f64 * 0.1;
            a.arrived(0, t);
            if i % 2 == 0 {
                b.arrived(0, t);
            }
        }
        let now = 10.0;
        assert!(
            (a.above(1, 30) - 1.0 / 3.0).abs() < 0.02,
            "{}",
            a.above(1, 30)
        );
        assert!(
            (b.above(1, 30) - 1.0 / 6.0).abs() < 0.02,
            "{}",
            b.above(1, 30)
        );
        let fleet_a = a.with_others(&b.arrivals(now)).above(1, 30);
        let fleet_b = b.with_others(&a.arrivals(now)).above(1, 30);
        assert!((fleet_a - 0.5).abs() < 0.03, "{fleet_a}");
        assert!((fleet_b - 0.5).abs() < 0.03, "{fleet_b}");
        // An instance that joined two seconds ago with 1 a second: each
        // rate is over its own instance's window, so its short one does not
        // inflate the others' (the fleet asks for 16 of 30).
        let mut late = drain(1.0);
        late.arrived(0, 8.0);
        late.arrived(0, 9.0);
        let mut others = a.arrivals(now);
        others.add(&b.arrivals(now));
        let joined = late.with_others(&others).above(1, 30);
        assert!((joined - 16.0 / 30.0).abs() < 0.05, "{joined}");
        // Nothing from the others: this instance's own share.
        let alone = a.with_others(&Arrivals::default()).above(1, 30);
        assert!((alone - a.above(1, 30)).abs() < 1e-12);
    }

    #[test]
    fn higher_arrivals_widen_the_margin() {
        // 20 slots, releases every 0.05 s; 9 in line at level 1 (n = 10).
        // Level 0 asks for half the releases: k = 20 releases, σ =
        // √(20 · 1.5) ÷ 0.5 ≈ 11 (√20 ≈ 4.5 with no level above).
        let mut d = drain(1.0);
        for i in 0..100 {
            d.arrived(0, i as f64 * 0.1);
        }
        let a = d.above(1, 20);
        assert!((a - 0.5).abs() < 0.02, "{a}");
        let k_prime = |a: f64| {
            let k = 10.0 / (1.0 - a);
            (k + Z * (k * (1.0 + a)).sqrt() / (1.0 - a)).ceil()
        };
        assert!((45.0..48.0).contains(&k_prime(a)), "{}", k_prime(a));
        // The prediction takes the share at its bound (100 arrivals counted).
        let bound = d.above_bound(1, 20);
        assert!((0.55..0.7).contains(&bound), "{bound}");
        let ages = spread(20, 1.0);
        let t = predicted_ttft(&d, 20, &ages, newcomer(1, 9, 0)).unwrap();
        let remaining: Vec<f64> = ages.iter().map(|a| 1.0 - a).collect();
        let at = kth_release(&remaining, 1.0, k_prime(bound) as usize);
        assert!((t - at).abs() < 1e-6, "{t}");
    }

    #[test]
    fn the_bound_on_the_higher_share_closes_in_as_arrivals_are_counted() {
        // Level 0 at 5 a second against a drain of 10: a share of half.
        // Ten arrivals in 2 s leave the rate uncertain by about a third; a
        // thousand by the count the 10 s window keeps (about 50: a seventh).
        let at_rate = |arrivals: usize| {
            let mut d = drain(1.0);
            for i in 0..arrivals {
                d.arrived(0, i as f64 * 0.2);
            }
            (d.above(1, 10), d.above_bound(1, 10))
        };
        let (few, few_bound) = at_rate(10);
        let (many, many_bound) = at_rate(1_000);
        assert!((few - 0.5).abs() < 0.1 && (many - 0.5).abs() < 0.02);
        assert!(few_bound - few > 0.3, "{few} {few_bound}");
        assert!(
            (0.1..0.25).contains(&(many_bound - many)),
            "{many} {many_bound}"
        );
        // Nothing above level 0 at any bound.
        let mut d = drain(1.0);
        d.arrived(0, 0.0);
        assert_eq!(d.above_bound(0, 10), 0.0);
    }

    #[test]
    fn backlog_is_the_whole_line_at_the_measured_rate() {
        assert_eq!(Drain::default().backlog(10, 4), Duration::from_secs(1));
        let d = drain(2.0);
        assert_eq!(d.backlog(9, 4), Duration::from_secs(5));
    }
}

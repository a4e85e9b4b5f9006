//! When requests start: an open loop with Gamma-distributed gaps, a closed
//! loop with a fixed number of clients, or a trace's own timestamps.
//!
//! Open-loop gaps follow `vllm bench serve`: Gamma(shape = burstiness,
//! scale = 1 / (rate × burstiness)), so the mean gap is always `1 / rate` and
//! the squared coefficient of variation is `1 / burstiness`: burstiness 1 is
//! a Poisson process, below 1 burstier, above 1 more regular.
//!
//! Gamma draws use Marsaglia and Tsang's squeeze method ("A simple method for
//! generating gamma variables", 2000) on Box–Muller normals, with the
//! `U^(1/shape)` boost for shapes below 1; all from a seeded SplitMix64
//! stream, so a seed fixes the schedule. A few dozen ns per gap.

use std::time::Duration;

use super::text::{SplitMix, mix};

/// The arrival process of a run.
#[derive(Clone, Debug, PartialEq)]
pub enum Arrivals {
    /// New conversations start at `rate` per second with Gamma gaps.
    Open { rate: f64, burstiness: f64 },
    /// `concurrency` clients, each sending its next request when the last
    /// one finished.
    Closed { concurrency: usize },
    /// Start each conversation at the time the workload gives (a trace).
    Timestamps,
}

impl Arrivals {
    pub fn describe(&self) -> String {
        match self {
            Arrivals::Open { rate, burstiness } => {
                format!("open loop, {rate} req/s, burstiness {burstiness}")
            }
            Arrivals::Closed { concurrency } => format!("closed loop, concurrency {concurrency}"),
            Arrivals::Timestamps => "trace timestamps".into(),
        }
    }
}

/// Seeded Gamma gap generator.
pub struct GapSampler {
    rng: SplitMix,
    shape: f64,
    scale: f64,
}

impl GapSampler {
    /// Gaps for `rate` requests/s (must be > 0) and `burstiness` (> 0).
    pub fn new(rate: f64, burstiness: f64, seed: u64) -> Self {
        GapSampler {
            rng: SplitMix::new(mix(seed, 0x6761_7073)),
            shape: burstiness,
            scale: 1.0 / (rate * burstiness),
        }
    }

    /// The next gap, in seconds.
    pub fn next_secs(&mut self) -> f64 {
        gamma(&mut self.rng, self.shape) * self.scale
    }

    pub fn next_gap(&mut self) -> Duration {
        Duration::from_secs_f64(self.next_secs())
    }
}

/// Uniform in (0, 1), never 0 or 1.
pub(crate) fn uniform(rng: &mut SplitMix) -> f64 {
    ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

fn normal(rng: &mut SplitMix) -> f64 {
    let (u1, u2) = (uniform(rng), uniform(rng));
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// One Gamma(shape, 1) draw.
fn gamma(rng: &mut SplitMix, shape: f64) -> f64 {
    if shape < 1.0 {
        let boost = uniform(rng).powf(1.0 / shape);
        return gamma(rng, shape + 1.0) * boost;
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = normal(rng);
        let v = 1.0 + c * x;
        if v <= 0.0 {
            continue;
        }
        let v = v * v * v;
        let u = uniform(rng);
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn moments(rate: f64, burstiness: f64) -> (f64, f64) {
        let mut g = GapSampler::new(rate, burstiness, 42);
        let xs: Vec<f64> = (0..40_000).map(|_| g.next_secs()).collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        (mean, var / (mean * mean))
    }

    #[test]
    fn mean_gap_is_one_over_rate_and_cv2_is_one_over_burstiness() {
        for (rate, b) in [(10.0, 1.0), (4.0, 0.25), (50.0, 4.0)] {
            let (mean, cv2) = moments(rate, b);
            assert!(
                (mean * rate - 1.0).abs() < 0.03,
                "rate {rate} b {b}: mean {mean}"
            );
            assert!((cv2 * b - 1.0).abs() < 0.1, "rate {rate} b {b}: cv2 {cv2}");
        }
    }

    #[test]
    fn deterministic_for_a_seed() {
        let take = |seed| {
            let mut g = GapSampler::new(5.0, 0.5, seed);
            (0..100).map(|_| g.next_gap()).collect::<Vec<_>>()
        };
        assert_eq!(take(1), take(1));
        assert_ne!(take(1), take(2));
    }
}

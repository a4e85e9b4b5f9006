//! Latency accounting for a run: exact samples where there are few (one per
//! request: TTFT, end-to-end) and a log-bucketed histogram where there are
//! many (one per output token: inter-token latency), so millions of tokens
//! cost one increment each and no allocation.

use crate::bench::stats::percentile;

/// Buckets 1 % wide on a log scale from 1 µs to about 10^4 s; percentiles
/// come back as the geometric middle of their bucket (within 0.5 %).
#[derive(Debug, Clone)]
pub struct LogHistogram {
    counts: Vec<u64>,
    total: u64,
}

const LOW: f64 = 1e-6;
const RATIO_LN: f64 = 0.009_950_330_853_168_083; // ln(1.01)
const BUCKETS: usize = 2_320;

impl Default for LogHistogram {
    fn default() -> Self {
        LogHistogram {
            counts: vec![0; BUCKETS],
            total: 0,
        }
    }
}

impl LogHistogram {
    pub fn observe(&mut self, v: f64) {
        let i = if v > LOW {
            (((v / LOW).ln() / RATIO_LN) as usize + 1).min(BUCKETS - 1)
        } else {
            0
        };
        self.counts[i] += 1;
        self.total += 1;
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    /// The `p`-th percentile (0..=100); 0 when empty.
    pub fn percentile(&self, p: f64) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        let rank = ((p / 100.0).clamp(0.0, 1.0) * self.total as f64)
            .ceil()
            .max(1.0) as u64;
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return if i == 0 {
                    LOW
                } else {
                    LOW * ((i as f64 - 0.5) * RATIO_LN).exp()
                };
            }
        }
        LOW * (BUCKETS as f64 * RATIO_LN).exp()
    }
}

/// p50, p90, p99 and max of samples, in seconds.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Quantiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Quantiles {
    pub fn of(values: &mut [f64]) -> Quantiles {
        values.sort_by(f64::total_cmp);
        Quantiles {
            p50: percentile(values, 50.0),
            p90: percentile(values, 90.0),
            p99: percentile(values, 99.0),
            max: values.last().copied().unwrap_or(0.0),
        }
    }

    pub fn of_histogram(h: &LogHistogram) -> Quantiles {
        Quantiles {
            p50: h.percentile(50.0),
            p90: h.percentile(90.0),
            p99: h.percentile(99.0),
            max: h.percentile(100.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_percentiles_within_a_bucket() {
        let mut h = LogHistogram::default();
        for i in 1..=1000 {
            h.observe(i as f64 / 1000.0);
        }
        assert_eq!(h.count(), 1000);
        for (p, want) in [(50.0, 0.5), (99.0, 0.99), (100.0, 1.0)] {
            let got = h.percentile(p);
            assert!((got / want - 1.0).abs() < 0.011, "p{p}: {got} vs {want}");
        }
        h.observe(0.0);
        assert!(h.percentile(0.0) <= 1e-6);
    }

    #[test]
    fn exact_quantiles() {
        let mut v = vec![3.0, 1.0, 2.0];
        let q = Quantiles::of(&mut v);
        assert_eq!((q.p50, q.max), (2.0, 3.0));
    }
}

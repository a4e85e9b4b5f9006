//! Figures computed from request records: distributions, TPOT, throughput,
//! goodput, errors and the spread over replicas.
//!
//! Definitions follow `vllm bench serve` so numbers compare:
//! - percentiles interpolate linearly between order statistics (numpy's
//!   default): p of n sorted values sits at rank p/100 × (n − 1);
//! - TPOT of a request = (e2e − TTFT) / (output tokens − 1), defined only
//!   when it produced at least two tokens;
//! - ITL pools every gap between content chunks of completed requests;
//! - throughputs count completed requests and their tokens over the run's
//!   wall time, from the first request sent to the last one finished;
//! - goodput counts completed requests that met every set SLO.
//!
//! Latency distributions cover completed requests only; failures are counted
//! by kind in `errors`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::record::{Outcome, RequestRecord};
use super::spec::Slo;

/// A distribution in milliseconds; all zero when `count` is zero.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub count: usize,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub min: f64,
    pub max: f64,
}

/// The `p`-th percentile (0..=100) of ascending `sorted`, interpolated.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        1 => sorted[0],
        n => {
            let rank = (p / 100.0).clamp(0.0, 1.0) * (n - 1) as f64;
            let lo = rank.floor() as usize;
            let hi = rank.ceil() as usize;
            sorted[lo] + (sorted[hi] - sorted[lo]) * (rank - lo as f64)
        }
    }
}

impl Summary {
    pub fn of(mut values: Vec<f64>) -> Summary {
        if values.is_empty() {
            return Summary::default();
        }
        values.sort_by(f64::total_cmp);
        Summary {
            count: values.len(),
            mean: values.iter().sum::<f64>() / values.len() as f64,
            p50: percentile(&values, 50.0),
            p90: percentile(&values, 90.0),
            p99: percentile(&values, 99.0),
            min: values[0],
            max: values[values.len() - 1],
        }
    }
}

/// TPOT of one request in ms, `None` below two output tokens or without TTFT.
pub fn tpot(r: &RequestRecord) -> Option<f64> {
    let ttft = r.ttft_ms?;
    (r.output_tokens >= 2).then(|| (r.e2e_ms - ttft) / (r.output_tokens - 1) as f64)
}

/// Whether a completed request met every set bound of `slo`.
pub fn meets(r: &RequestRecord, slo: &Slo) -> bool {
    if !r.outcome.is_ok() {
        return false;
    }
    let within = |bound: Option<f64>, value: Option<f64>| match (bound, value) {
        (None, _) => true,
        (Some(b), Some(v)) => v <= b,
        (Some(_), None) => false,
    };
    let tpot_ok = match (slo.tpot_ms, tpot(r)) {
        (Some(bound), Some(t)) => t <= bound,
        _ => true,
    };
    within(slo.ttft_ms, r.ttft_ms) && within(slo.e2e_ms, Some(r.e2e_ms)) && tpot_ok
}

/// Every figure of a run, computed from its records.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Figures {
    /// Wall time of the run in seconds.
    pub duration_s: f64,
    pub sent: u64,
    pub completed: u64,
    pub failed: u64,
    /// Failed requests by kind: HTTP status, `timeout`, `transport`, `stream`.
    pub errors: BTreeMap<String, u64>,
    pub rejected_429: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Completed requests per second.
    pub request_throughput: f64,
    /// Output tokens of completed requests per second.
    pub output_throughput: f64,
    /// Input plus output tokens of completed requests per second.
    pub total_token_throughput: f64,
    pub ttft_ms: Summary,
    pub tpot_ms: Summary,
    pub itl_ms: Summary,
    pub e2e_ms: Summary,
    pub slo: Slo,
    /// Completed requests that met the SLO (`None` without an SLO).
    pub good_requests: Option<u64>,
    /// `good_requests` per second.
    pub goodput: Option<f64>,
    /// Requests per replica (`x-llmlb-replica`), empty when absent.
    pub replicas: BTreeMap<String, u64>,
    /// Busiest replica's count over the mean count (1 = perfectly even).
    pub replica_max_over_mean: Option<f64>,
    /// Extra percentiles asked for with `--metric-percentiles`, by metric
    /// (`ttft_ms`, `tpot_ms`, `itl_ms`, `e2e_ms`) then `pN`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub percentiles: BTreeMap<String, BTreeMap<String, f64>>,
}

/// The label of percentile `p` (`p50`, `p99.9`).
pub fn percentile_label(p: f64) -> String {
    format!("p{p}")
}

impl Figures {
    pub fn compute(records: &[RequestRecord], duration_s: f64, slo: &Slo) -> Figures {
        let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.outcome.is_ok()).collect();
        let mut errors = BTreeMap::new();
        for r in records.iter().filter(|r| !r.outcome.is_ok()) {
            *errors.entry(r.outcome.label()).or_insert(0) += 1;
        }
        let rejected_429 = records
            .iter()
            .filter(|r| r.outcome == Outcome::Http { status: 429 })
            .count() as u64;
        let per_s = |n: f64| {
            if duration_s > 0.0 {
                n / duration_s
            } else {
                0.0
            }
        };
        let input_tokens: u64 = ok.iter().map(|r| r.input_tokens as u64).sum();
        let output_tokens: u64 = ok.iter().map(|r| r.output_tokens).sum();
        let good = slo
            .is_set()
            .then(|| ok.iter().filter(|r| meets(r, slo)).count() as u64);
        let mut replicas = BTreeMap::new();
        for r in records {
            if let Some(name) = &r.replica {
                *replicas.entry(name.clone()).or_insert(0) += 1;
            }
        }
        let replica_max_over_mean = (!replicas.is_empty()).then(|| {
            let max = *replicas.values().max().unwrap_or(&0) as f64;
            let mean = replicas.values().sum::<u64>() as f64 / replicas.len() as f64;
            max / mean
        });
        Figures {
            duration_s,
            sent: records.len() as u64,
            completed: ok.len() as u64,
            failed: (records.len() - ok.len()) as u64,
            errors,
            rejected_429,
            input_tokens,
            output_tokens,
            request_throughput: per_s(ok.len() as f64),
            output_throughput: per_s(output_tokens as f64),
            total_token_throughput: per_s((input_tokens + output_tokens) as f64),
            ttft_ms: Summary::of(ok.iter().filter_map(|r| r.ttft_ms).collect()),
            tpot_ms: Summary::of(ok.iter().filter_map(|r| tpot(r)).collect()),
            itl_ms: Summary::of(ok.iter().flat_map(|r| r.itl_ms.iter().copied()).collect()),
            e2e_ms: Summary::of(ok.iter().map(|r| r.e2e_ms).collect()),
            slo: *slo,
            good_requests: good,
            goodput: good.map(|g| per_s(g as f64)),
            replicas,
            replica_max_over_mean,
            percentiles: BTreeMap::new(),
        }
    }

    /// Adds the percentiles `ps` (0..=100) of each latency metric.
    pub fn add_percentiles(&mut self, records: &[RequestRecord], ps: &[f64]) {
        let ok: Vec<&RequestRecord> = records.iter().filter(|r| r.outcome.is_ok()).collect();
        let metrics: [(&str, Vec<f64>); 4] = [
            ("ttft_ms", ok.iter().filter_map(|r| r.ttft_ms).collect()),
            ("tpot_ms", ok.iter().filter_map(|r| tpot(r)).collect()),
            (
                "itl_ms",
                ok.iter().flat_map(|r| r.itl_ms.iter().copied()).collect(),
            ),
            ("e2e_ms", ok.iter().map(|r| r.e2e_ms).collect()),
        ];
        for (name, mut values) in metrics {
            values.sort_by(f64::total_cmp);
            let row = self.percentiles.entry(name.into()).or_default();
            for &p in ps {
                row.insert(percentile_label(p), percentile(&values, p));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(ttft: f64, e2e: f64, out: u64, outcome: Outcome) -> RequestRecord {
        RequestRecord {
            start_ms: 0.0,
            ttft_ms: Some(ttft),
            e2e_ms: e2e,
            itl_ms: Vec::new(),
            input_tokens: 10,
            output_tokens: out,
            outcome,
            replica: None,
            error: None,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        // numpy.percentile(range(1, 11), [50, 90, 99]) == [5.5, 9.1, 9.91]
        assert!(close(percentile(&v, 50.0), 5.5));
        assert!(close(percentile(&v, 90.0), 9.1));
        assert!(close(percentile(&v, 99.0), 9.91));
        assert!(close(percentile(&v, 0.0), 1.0));
        assert!(close(percentile(&v, 100.0), 10.0));
        assert_eq!(percentile(&[], 50.0), 0.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        let s = Summary::of(vec![3.0, 1.0, 2.0, 4.0]);
        assert!(close(s.mean, 2.5) && close(s.p50, 2.5) && s.min == 1.0 && s.max == 4.0);
        assert_eq!(Summary::of(Vec::new()), Summary::default());
    }

    #[test]
    fn tpot_excludes_the_first_token() {
        // 100 ms to the first token, then 9 more tokens over 450 ms.
        assert!(close(
            tpot(&rec(100.0, 550.0, 10, Outcome::Ok)).unwrap(),
            50.0
        ));
        assert_eq!(tpot(&rec(100.0, 100.0, 1, Outcome::Ok)), None);
    }

    #[test]
    fn goodput_counts_requests_within_every_slo() {
        let records = vec![
            rec(100.0, 550.0, 10, Outcome::Ok),  // tpot 50: good
            rec(300.0, 750.0, 10, Outcome::Ok),  // ttft too high
            rec(100.0, 1000.0, 10, Outcome::Ok), // tpot 100: too high
            rec(50.0, 50.0, 1, Outcome::Ok),     // no tpot: good
            rec(10.0, 20.0, 10, Outcome::Http { status: 429 }),
            rec(10.0, 20.0, 10, Outcome::Timeout),
        ];
        let slo: Slo = "ttft=200,tpot=60".parse().unwrap();
        let f = Figures::compute(&records, 2.0, &slo);
        assert_eq!((f.sent, f.completed, f.failed), (6, 4, 2));
        assert_eq!(f.good_requests, Some(2));
        assert!(close(f.goodput.unwrap(), 1.0));
        assert!(close(f.request_throughput, 2.0));
        assert_eq!(f.output_tokens, 31);
        assert!(close(f.output_throughput, 15.5));
        assert!(close(f.total_token_throughput, (31.0 + 40.0) / 2.0));
        assert_eq!(f.rejected_429, 1);
        assert_eq!(f.errors.get("429"), Some(&1));
        assert_eq!(f.errors.get("timeout"), Some(&1));
        // TTFT over the 4 completed: 50, 100, 100, 300.
        assert!(close(f.ttft_ms.mean, 137.5));
        assert!(close(f.ttft_ms.p50, 100.0));
        // TPOT over the 3 with two tokens or more: 50, 50, 100.
        assert_eq!(f.tpot_ms.count, 3);
        assert!(close(f.tpot_ms.p50, 50.0));
        assert!(close(f.tpot_ms.p99, 99.0));
        let none = Figures::compute(&records, 2.0, &Slo::default());
        assert_eq!((none.good_requests, none.goodput), (None, None));
    }

    #[test]
    fn e2e_slo_and_failed_requests_are_never_good() {
        let slo: Slo = "e2e=600".parse().unwrap();
        assert!(meets(&rec(100.0, 550.0, 10, Outcome::Ok), &slo));
        assert!(!meets(&rec(100.0, 650.0, 10, Outcome::Ok), &slo));
        assert!(!meets(&rec(1.0, 2.0, 10, Outcome::Timeout), &slo));
    }

    #[test]
    fn itl_pools_gaps_and_replicas_are_counted() {
        let mut a = rec(10.0, 40.0, 3, Outcome::Ok);
        a.itl_ms = vec![10.0, 20.0];
        a.replica = Some("r1".into());
        let mut b = rec(10.0, 40.0, 3, Outcome::Ok);
        b.itl_ms = vec![30.0];
        b.replica = Some("r1".into());
        let mut c = rec(10.0, 40.0, 3, Outcome::Ok);
        c.replica = Some("r2".into());
        let f = Figures::compute(&[a, b, c], 1.0, &Slo::default());
        assert_eq!(f.itl_ms.count, 3);
        assert!(close(f.itl_ms.mean, 20.0));
        assert_eq!(f.replicas.get("r1"), Some(&2));
        assert!(close(f.replica_max_over_mean.unwrap(), 2.0 / 1.5));
    }
}

//! What a run does: target, workload, arrival process, limits and SLOs.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::arrivals::Arrivals;
use super::error::BenchError;
use super::workload::WorkloadSpec;

/// Most requests one run may send, whatever the flags say.
pub const HARD_MAX_REQUESTS: u64 = 1_000_000;
/// Longest a run may issue requests, whatever the flags say.
pub const HARD_MAX_DURATION: Duration = Duration::from_secs(4 * 3600);
/// Requests sent when neither a count nor a duration is given and the
/// workload is infinite.
pub const DEFAULT_REQUESTS: u64 = 200;

/// Everything one run needs.
#[derive(Clone, Debug)]
pub struct BenchSpec {
    /// Base URL of an OpenAI-compatible server, e.g. `http://127.0.0.1:8080`
    /// (a trailing `/v1` is accepted).
    pub target: String,
    pub model: String,
    pub workload: WorkloadSpec,
    pub arrivals: Arrivals,
    pub limits: Limits,
    pub seed: u64,
    /// Extra request headers.
    pub headers: Vec<(String, String)>,
    /// Sent as `Authorization: Bearer ...`.
    pub api_key: Option<String>,
    pub slo: Slo,
    /// Allow a target that is not on this machine.
    pub allow_remote: bool,
    /// Show a progress bar on stderr when it is a terminal.
    pub progress: bool,
}

impl BenchSpec {
    /// A spec with defaults around a workload: closed loop of 1, the
    /// workload's natural size or [`DEFAULT_REQUESTS`], seed 0, no SLO.
    pub fn new(
        target: impl Into<String>,
        model: impl Into<String>,
        workload: WorkloadSpec,
    ) -> Self {
        BenchSpec {
            target: target.into(),
            model: model.into(),
            workload,
            arrivals: Arrivals::Closed { concurrency: 1 },
            limits: Limits::default(),
            seed: 0,
            headers: Vec::new(),
            api_key: None,
            slo: Slo::default(),
            allow_remote: false,
            progress: false,
        }
    }
}

/// How long and how much.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Requests to send (each chat turn counts as one).
    pub num_requests: Option<u64>,
    /// Stop issuing requests after this long; in-flight ones may finish.
    pub duration: Option<Duration>,
    /// Per request, from sending the request to the end of its stream.
    pub request_timeout: Duration,
    /// Most requests in flight at once in an open loop (later arrivals wait).
    pub max_in_flight: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            num_requests: None,
            duration: None,
            request_timeout: Duration::from_secs(300),
            max_in_flight: 1024,
        }
    }
}

impl Limits {
    pub(crate) fn validate(&self) -> Result<(), BenchError> {
        if self.num_requests == Some(0) {
            return Err(BenchError::InvalidSpec(
                "--requests must be at least 1".into(),
            ));
        }
        if self.num_requests.is_some_and(|n| n > HARD_MAX_REQUESTS) {
            return Err(BenchError::InvalidSpec(format!(
                "--requests is capped at {HARD_MAX_REQUESTS}"
            )));
        }
        if self
            .duration
            .is_some_and(|d| d.is_zero() || d > HARD_MAX_DURATION)
        {
            return Err(BenchError::InvalidSpec(format!(
                "--duration must be above zero and at most {}",
                humantime::format_duration(HARD_MAX_DURATION)
            )));
        }
        if self.request_timeout.is_zero() || self.max_in_flight == 0 {
            return Err(BenchError::InvalidSpec(
                "--timeout and --max-in-flight must be above zero".into(),
            ));
        }
        Ok(())
    }
}

/// Service-level objectives for goodput; a request meets them when every set
/// bound holds (a request with one output token has no TPOT and meets any
/// TPOT bound, as in `vllm bench serve`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2e_ms: Option<f64>,
}

impl Slo {
    pub fn is_set(&self) -> bool {
        self.ttft_ms.is_some() || self.tpot_ms.is_some() || self.e2e_ms.is_some()
    }
}

impl std::str::FromStr for Slo {
    type Err = String;

    /// `ttft=MS,tpot=MS,e2e=MS`, any subset, in any order.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut slo = Slo::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value) = part
                .split_once(['=', ':'])
                .ok_or_else(|| format!("`{part}`: expected KEY=MS"))?;
            let ms: f64 = value
                .trim()
                .trim_end_matches("ms")
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v > 0.0)
                .ok_or_else(|| format!("`{part}`: {value} is not a positive number of ms"))?;
            match key.trim() {
                "ttft" => slo.ttft_ms = Some(ms),
                "tpot" => slo.tpot_ms = Some(ms),
                "e2e" | "e2el" => slo.e2e_ms = Some(ms),
                other => return Err(format!("unknown SLO `{other}` (ttft, tpot, e2e)")),
            }
        }
        Ok(slo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slo_parses() {
        let s: Slo = "ttft=200,tpot=50ms".parse().unwrap();
        assert_eq!(s.ttft_ms, Some(200.0));
        assert_eq!(s.tpot_ms, Some(50.0));
        assert_eq!(s.e2e_ms, None);
        assert!("ttft=-1".parse::<Slo>().is_err());
        assert!("speed=3".parse::<Slo>().is_err());
        assert!(!"".parse::<Slo>().unwrap().is_set());
    }

    #[test]
    fn limits_are_bounded() {
        let mut l = Limits::default();
        assert!(l.validate().is_ok());
        l.num_requests = Some(HARD_MAX_REQUESTS + 1);
        assert!(l.validate().is_err());
        l.num_requests = None;
        l.duration = Some(HARD_MAX_DURATION * 2);
        assert!(l.validate().is_err());
    }
}

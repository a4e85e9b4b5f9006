//! Whether one request of a disaggregated pool is prefilled on the prefill
//! pool or on its decode replica, and what the pool learns from the
//! requests it disaggregated.
//!
//! Disaggregating costs a hop: the prefill replica's answer, the transfer
//! of the prompt's KV cache and the decode replica's first step come
//! before the first token. It pays when the decode replica would otherwise
//! spend longer prefilling (stalling every request decoding beside it), so
//! under `when = "auto"` a request is disaggregated when its prompt's
//! uncached tokens on the best decode replica (the candidate predicted to
//! hold most of it; all of it uncached without a prefix mode) are at least
//! `min_uncached_tokens` and their local prefill, at the decode replica's
//! learned prefill rate (else the pool's prior), would take at least the
//! hop's measured cost (the mean time from sending to a decode replica to
//! its first byte, over the requests disaggregated so far: transfer, queue
//! and first step). A short or mostly cached prompt stays on the decode
//! replica. Independently, when even the least busy decode candidate has
//! `busy_prefills` requests waiting for their first token, the request is
//! disaggregated whatever its size: the decode replicas are saturated by
//! prefills.
//!
//! Cost per request: O(candidates) over the decision's predictions and the
//! replicas' counters; no lock (the learned cost is one atomic).

use std::sync::atomic::{AtomicU64, Ordering};

use super::Pool;
use crate::balancing::RequestInfo;
use crate::config::{DisaggregateWhen, DisaggregationConfig};
use crate::replica::ReplicaView;
use crate::routing::Decision;

/// Why a request was or was not disaggregated (the `branch` label of
/// `llmlb_disaggregation_decisions_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitBranch {
    /// Uncached tokens above the threshold.
    Long,
    /// The decode replicas are busy prefilling.
    BusyDecode,
    /// `when = "always"`.
    Always,
    /// Below the threshold: the decode replica prefills.
    Short,
    /// `when = "never"`.
    Never,
    /// Meant for the prefill pool, which had no replica to take it.
    NoPrefillReplica,
    /// The prefill failed on every attempt; the decode replica prefilled.
    Fallback,
}

impl SplitBranch {
    pub const ALL: [SplitBranch; 7] = [
        SplitBranch::Long,
        SplitBranch::BusyDecode,
        SplitBranch::Always,
        SplitBranch::Short,
        SplitBranch::Never,
        SplitBranch::NoPrefillReplica,
        SplitBranch::Fallback,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            SplitBranch::Long => "long",
            SplitBranch::BusyDecode => "busy_decode",
            SplitBranch::Always => "always",
            SplitBranch::Short => "short",
            SplitBranch::Never => "never",
            SplitBranch::NoPrefillReplica => "no_prefill_replica",
            SplitBranch::Fallback => "fallback",
        }
    }

    /// Whether the request goes to the prefill pool first.
    pub fn disaggregates(self) -> bool {
        matches!(
            self,
            SplitBranch::Long | SplitBranch::BusyDecode | SplitBranch::Always
        )
    }
}

/// A disaggregated pool's settings and what it has learned.
#[derive(Debug)]
pub struct Disaggregation {
    pub config: DisaggregationConfig,
    pub protocol: &'static dyn crate::kv_transfer::Protocol,
    /// Mean seconds from sending to a decode replica to its first byte
    /// over the disaggregated requests (an exponential mean, f64 bits; 0
    /// until the first one).
    hop_seconds: AtomicU64,
}

/// Weight of each new measurement in the hop's mean.
const HOP_WEIGHT: f64 = 0.1;

impl Disaggregation {
    pub fn new(config: DisaggregationConfig) -> Disaggregation {
        Disaggregation {
            protocol: crate::kv_transfer::by_name(config.protocol),
            config,
            hop_seconds: AtomicU64::new(0f64.to_bits()),
        }
    }

    /// The same settings, keeping what `old` learned (a reload).
    pub fn carrying(config: DisaggregationConfig, old: Option<&Disaggregation>) -> Disaggregation {
        let new = Disaggregation::new(config);
        if let Some(old) = old {
            new.hop_seconds
                .store(old.hop_seconds.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        new
    }

    /// The hop's learned cost in seconds (0 before any measurement).
    pub fn hop_seconds(&self) -> f64 {
        f64::from_bits(self.hop_seconds.load(Ordering::Relaxed))
    }

    /// Notes one disaggregated request's time from sending to its decode
    /// replica to the first byte.
    pub fn observe_hop(&self, seconds: f64) {
        if !seconds.is_finite() || seconds < 0.0 {
            return;
        }
        let _ = self
            .hop_seconds
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                let old = f64::from_bits(bits);
                let new = if old == 0.0 {
                    seconds
                } else {
                    old + HOP_WEIGHT * (seconds - old)
                };
                Some(new.to_bits())
            });
    }

    /// Decides one request routed within `pool` (the decode pool) by
    /// `decision`, at `now_ms`.
    pub fn decide(
        &self,
        pool: &Pool,
        decision: &Decision,
        info: &RequestInfo<'_>,
        now_ms: u64,
    ) -> SplitBranch {
        let c = &self.config;
        match c.when {
            DisaggregateWhen::Always => return SplitBranch::Always,
            DisaggregateWhen::Never => return SplitBranch::Never,
            DisaggregateWhen::Auto => {}
        }
        let candidates = decision.narrow(pool.eligible_at(now_ms));
        if candidates.is_empty() {
            // The forwarder answers that case; nothing to gain by a prefill.
            return SplitBranch::Short;
        }
        let prompt = u64::from(info.prompt_tokens);
        let best = candidates
            .iter()
            .max_by_key(|r| {
                (
                    decision.predicted_for(r.id).unwrap_or(0),
                    std::cmp::Reverse(r.prefilling()),
                )
            })
            .expect("candidates is not empty");
        let uncached = prompt.saturating_sub(decision.predicted_for(best.id).unwrap_or(0));
        if c.busy_prefills > 0
            && uncached > 0
            && candidates.iter().map(|r| r.prefilling()).min().unwrap_or(0) >= c.busy_prefills
        {
            return SplitBranch::BusyDecode;
        }
        if uncached < c.min_uncached_tokens {
            return SplitBranch::Short;
        }
        let view = ReplicaView::at(best, now_ms);
        let local = pool.router.cost.prefill_seconds(&view.rates, uncached);
        if local >= self.hop_seconds() {
            SplitBranch::Long
        } else {
            SplitBranch::Short
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::test_fleet::pool_of;

    fn config(when: &str, extra: &str) -> DisaggregationConfig {
        let text = format!(
            "[[pools]]\nname = \"d\"\nmodels = [\"m\"]\n[pools.disaggregation]\nprefill_pool = \"p\"\nwhen = \"{when}\"\n{extra}\n[[pools.replicas]]\nurl = \"http://127.0.0.1:1\"\n[[pools]]\nname = \"p\"\nrole = \"prefill\"\n[[pools.replicas]]\nurl = \"http://127.0.0.1:2\"\n"
        );
        crate::config::parse(&text).unwrap().pools[0]
            .disaggregation
            .clone()
            .unwrap()
    }

    fn info(prompt_tokens: u32) -> RequestInfo<'static> {
        RequestInfo {
            model: "m",
            prompt_tokens,
            max_tokens: Some(16),
            user: None,
        }
    }

    #[test]
    fn auto_splits_long_prompts_and_keeps_short_ones() {
        let t = pool_of("", 2);
        let pool = &t.pools()[0];
        let d = Disaggregation::new(config("auto", "min_uncached_tokens = 1000"));
        let decision = Decision::default();
        assert_eq!(d.decide(pool, &decision, &info(999), 0), SplitBranch::Short);
        assert_eq!(d.decide(pool, &decision, &info(4000), 0), SplitBranch::Long);
        // A hop measured at 1 s outweighs a 4,000-token prefill at the
        // pool's prior of 10,000 tokens/s (0.4 s).
        d.observe_hop(1.0);
        assert_eq!(
            d.decide(pool, &decision, &info(4000), 0),
            SplitBranch::Short
        );
        assert_eq!(
            d.decide(pool, &decision, &info(20_000), 0),
            SplitBranch::Long
        );
    }

    #[test]
    fn a_cached_prompt_stays_and_busy_decoders_split_short_ones() {
        let t = pool_of("", 2);
        let pool = &t.pools()[0];
        let d = Disaggregation::new(config(
            "auto",
            "min_uncached_tokens = 1000\nbusy_prefills = 2",
        ));
        let ids: Vec<_> = pool.replicas.iter().map(|r| r.id).collect();
        let decision = Decision::predicting(vec![(ids[0], 3500), (ids[1], 0)]);
        // 3,500 of 4,000 tokens cached on the first replica: 500 uncached.
        assert_eq!(
            d.decide(pool, &decision, &info(4000), 0),
            SplitBranch::Short
        );
        let _busy: Vec<_> = pool
            .replicas
            .iter()
            .flat_map(|r| [r.acquire(), r.acquire()])
            .collect();
        assert_eq!(
            d.decide(pool, &decision, &info(4000), 0),
            SplitBranch::BusyDecode
        );
        assert_eq!(
            d.decide(pool, &Decision::default(), &info(50), 0),
            SplitBranch::BusyDecode
        );
    }

    #[test]
    fn always_and_never_do_not_look() {
        let t = pool_of("", 1);
        let always = Disaggregation::new(config("always", ""));
        let never = Disaggregation::new(config("never", ""));
        let decision = Decision::default();
        assert_eq!(
            always.decide(&t.pools()[0], &decision, &info(1), 0),
            SplitBranch::Always
        );
        assert_eq!(
            never.decide(&t.pools()[0], &decision, &info(100_000), 0),
            SplitBranch::Never
        );
        assert!(SplitBranch::Always.disaggregates() && !SplitBranch::Fallback.disaggregates());
    }

    #[test]
    fn the_hop_is_an_exponential_mean_kept_across_a_reload() {
        let d = Disaggregation::new(config("auto", ""));
        assert_eq!(d.hop_seconds(), 0.0);
        d.observe_hop(1.0);
        d.observe_hop(2.0);
        assert!((d.hop_seconds() - 1.1).abs() < 1e-12);
        d.observe_hop(f64::NAN);
        let kept = Disaggregation::carrying(config("auto", ""), Some(&d));
        assert!((kept.hop_seconds() - 1.1).abs() < 1e-12);
    }
}

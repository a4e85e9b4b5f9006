//! KV-cache-aware: prefer the replica with the most free KV-cache headroom
//! after this request, and avoid replicas whose cache would pass a usage
//! threshold, where admitting a long prompt forces the replica to preempt
//! (evict and later recompute) running requests.
//!
//! For each candidate, projected usage = scraped usage
//! (`vllm:kv_cache_usage_perc`, or `gpu_cache_usage_perc` before vLLM 0.9.2)
//! plus (tokens dispatched since that scrape plus this request's prompt and
//! expected output) divided by the KV capacity in tokens
//! ([`KvRoom::projected_usage`](crate::replica::view::KvRoom::projected_usage), the
//! same KV model cache-aware routing reads free tokens from). The capacity comes
//! from the replica's `vllm:cache_config_info` (`num_gpu_blocks × block_size`),
//! else the pool's `kv_capacity_tokens`. Candidates at or under
//! `kv_threshold` win by lowest projected usage, then shortest queue (branch
//! `kv_aware`); if all are over, the shortest queue wins (branch
//! `kv_saturated`). The saturation idea follows llm-d's endpoint picker (KV
//! above 0.8 is saturated) and Dynamo's KV router (cost in blocks a request adds).
//!
//! Weights are not applied: usage is already a fraction of each replica's
//! own cache. Tokens dispatched since the scrape are all counted as still
//! held, which overestimates slightly until the next scrape.
//!
//! Cost per pick: O(n). When any candidate lacks a fresh usage figure, all
//! are compared by this proxy's outstanding tokens (branch
//! `fallback_stale_metrics`).

use super::load::{Load, Scan};
use super::{BalancerParams, Branch, RequestInfo};
use crate::replica::ReplicaView;

/// KV-aware: every candidate compared by [`KvHeadroom`].
pub type KvAware = Scan<KvHeadroom>;

/// KV-aware's measure, smaller is better: `(over threshold, primary,
/// secondary)`. Under the threshold the primary is the projected usage and
/// the secondary the queue; over it, the other way round. Locally:
/// `(outstanding tokens, in flight)`.
#[derive(Debug, Clone, Copy)]
pub struct KvHeadroom {
    pub params: BalancerParams,
}

impl Load for KvHeadroom {
    type Metric = (bool, f64, f64);
    type Local = (u64, u64);

    fn load(&self, v: &ReplicaView, req: &RequestInfo<'_>) -> Option<(bool, f64, f64)> {
        let p = &self.params;
        let l = v.fresh_load(p.max_age_ms)?;
        let projected = l
            .kv_room(Some(p.kv_capacity_tokens))?
            .projected_usage(req.expected_tokens(p.default_max_tokens));
        let queue = l.queue_now().unwrap_or(0) as f64;
        Some(if projected <= p.kv_threshold {
            (false, projected, queue)
        } else {
            (true, queue, projected)
        })
    }

    fn local(&self, v: &ReplicaView) -> (u64, u64) {
        (v.outstanding_tokens, v.in_flight)
    }

    fn branch(&self, winner: &(bool, f64, f64)) -> Branch {
        if winner.0 {
            Branch::KvSaturated
        } else {
            Branch::KvAware
        }
    }

    fn name(&self) -> &'static str {
        "kv_aware"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancing::{Balancer, Pick};
    use crate::replica::ScrapedLoad;

    fn view(id: u64, usage: f64, waiting: u64, age_ms: u64) -> ReplicaView {
        ReplicaView {
            id,
            weight: 1,
            in_flight: 0,
            outstanding_tokens: 0,
            prefilling: 0,
            uncached_prefill: 0,
            decoding_output: 0,
            load: Some(ScrapedLoad {
                kv_usage: Some(usage),
                waiting: Some(waiting),
                running: Some(0),
                kv_capacity_tokens: Some(10_000),
                age_ms,
                ..ScrapedLoad::default()
            }),
            rates: Default::default(),
        }
    }

    fn kv() -> KvAware {
        Scan::new(KvHeadroom {
            params: BalancerParams {
                max_age_ms: 1_000,
                kv_threshold: 0.8,
                default_max_tokens: 100,
                ..BalancerParams::default()
            },
        })
    }

    fn req(prompt: u32) -> RequestInfo<'static> {
        RequestInfo {
            prompt_tokens: prompt,
            max_tokens: Some(100),
            ..RequestInfo::default()
        }
    }

    #[test]
    fn most_headroom_wins() {
        let v = [
            view(1, 0.6, 0, 10),
            view(2, 0.2, 3, 10),
            view(3, 0.4, 0, 10),
        ];
        let p = kv().pick(&req(100), &v).unwrap();
        assert_eq!(
            p,
            Pick {
                index: 1,
                branch: Branch::KvAware
            }
        );
    }

    #[test]
    fn long_prompt_avoids_replica_it_would_overfill() {
        // 0.5 + 3,100/10,000 = 0.81 > 0.8 on replica 0; replica 1 has its own
        // tokens dispatched since scrape but stays under.
        let mut v = [view(1, 0.5, 0, 10), view(2, 0.55, 5, 10)];
        v[1].load.as_mut().unwrap().kv_capacity_tokens = Some(100_000);
        let p = kv().pick(&req(3_000), &v).unwrap();
        assert_eq!(
            p,
            Pick {
                index: 1,
                branch: Branch::KvAware
            }
        );
    }

    #[test]
    fn all_saturated_goes_to_shortest_queue() {
        let v = [
            view(1, 0.95, 7, 10),
            view(2, 0.99, 1, 10),
            view(3, 0.9, 4, 10),
        ];
        let p = kv().pick(&req(10), &v).unwrap();
        assert_eq!(
            p,
            Pick {
                index: 1,
                branch: Branch::KvSaturated
            }
        );
    }

    #[test]
    fn tokens_since_scrape_count_against_headroom() {
        let mut v = [view(1, 0.1, 0, 10), view(2, 0.2, 0, 10)];
        v[0].load.as_mut().unwrap().tokens_since = 2_000; // 0.1 + 0.2 + ...
        assert_eq!(kv().pick(&req(100), &v).unwrap().index, 1);
    }

    #[test]
    fn stale_usage_falls_back_to_local_tokens() {
        let mut v = [view(1, 0.1, 0, 10), view(2, 0.9, 0, 10)];
        v[0].outstanding_tokens = 5_000;
        v[1].outstanding_tokens = 10;
        v[1].load.as_mut().unwrap().age_ms = 60_000;
        let p = kv().pick(&req(10), &v).unwrap();
        assert_eq!(
            p,
            Pick {
                index: 1,
                branch: Branch::FallbackStaleMetrics
            }
        );
    }
}

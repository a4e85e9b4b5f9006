//! Join-the-shortest-queue: the candidate whose internal waiting queue is
//! shortest, as the replica itself reports it (`vllm:num_requests_waiting`,
//! `sglang:num_queue_reqs`), corrected by what this proxy has dispatched and
//! seen finish since that scrape, so a burst that arrives between two scrapes
//! spreads out instead of herding onto the replica that looked emptiest.
//! Ties (typically all queues empty) go to the fewest requests in the replica
//! (running + waiting), then the fewest in flight from this proxy.
//!
//! JSQ is the classic policy for parallel servers (Winston 1977; Gupta et al.
//! 2007 for processor sharing); the waiting queue is the signal llm-d's
//! endpoint picker and the SGLang gateway score on.
//!
//! Cost per pick: O(n). When any candidate's scrape is missing, lacks the
//! queue metric or is older than the pool's `scrape.staleness`, all
//! candidates are compared by this proxy's in-flight counts instead (branch
//! `fallback_stale_metrics`): scraped and local units are never mixed.

use super::load::{Load, Scan};
use super::{BalancerParams, Branch, RequestInfo};
use crate::replica::ReplicaView;

/// JSQ: every candidate compared by [`QueueLength`].
pub type JoinShortestQueue = Scan<QueueLength>;

/// JSQ's measure: `(queue, in system, in flight)` per unit of weight from a
/// fresh scrape; locally, `(in flight, outstanding tokens)` per unit of weight.
#[derive(Debug, Clone, Copy)]
pub struct QueueLength {
    max_age_ms: u64,
}

impl QueueLength {
    pub fn new(params: BalancerParams) -> QueueLength {
        QueueLength {
            max_age_ms: params.max_age_ms,
        }
    }
}

impl Load for QueueLength {
    type Metric = (f64, f64, f64);
    type Local = (f64, f64);

    fn load(&self, v: &ReplicaView, _req: &RequestInfo<'_>) -> Option<(f64, f64, f64)> {
        let l = v.fresh_load(self.max_age_ms)?;
        let w = f64::from(v.weight.max(1));
        Some((
            l.queue_now()? as f64 / w,
            l.in_system_now().unwrap_or(0) as f64 / w,
            v.in_flight as f64 / w,
        ))
    }

    fn local(&self, v: &ReplicaView) -> (f64, f64) {
        let w = f64::from(v.weight.max(1));
        (v.in_flight as f64 / w, v.outstanding_tokens as f64 / w)
    }

    fn branch(&self, _winner: &(f64, f64, f64)) -> Branch {
        Branch::Jsq
    }

    fn name(&self) -> &'static str {
        "jsq"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancing::{Balancer, Pick};
    use crate::replica::ScrapedLoad;

    fn view(id: u64, waiting: u64, running: u64, age_ms: u64, in_flight: u64) -> ReplicaView {
        ReplicaView {
            id,
            weight: 1,
            in_flight,
            outstanding_tokens: 0,
            prefilling: 0,
            uncached_prefill: 0,
            decoding_output: 0,
            load: Some(ScrapedLoad {
                waiting: Some(waiting),
                running: Some(running),
                age_ms,
                ..ScrapedLoad::default()
            }),
            rates: Default::default(),
        }
    }

    fn jsq() -> JoinShortestQueue {
        Scan::new(QueueLength::new(BalancerParams {
            max_age_ms: 1_000,
            ..BalancerParams::default()
        }))
    }

    #[test]
    fn shortest_scraped_queue_wins() {
        let v = [
            view(1, 12, 8, 10, 0),
            view(2, 0, 8, 10, 3),
            view(3, 4, 8, 10, 0),
        ];
        let p = jsq().pick(&RequestInfo::default(), &v).unwrap();
        assert_eq!(
            p,
            Pick {
                index: 1,
                branch: Branch::Jsq
            }
        );
    }

    #[test]
    fn dispatches_since_scrape_count() {
        let mut v = [view(1, 2, 8, 10, 0), view(2, 0, 8, 10, 0)];
        // Three sent to replica 2 since its scrape, none finished: queue 3 > 2.
        v[1].load.as_mut().unwrap().dispatched_since = 3;
        assert_eq!(jsq().pick(&RequestInfo::default(), &v).unwrap().index, 0);
        // Two of them finished: queue 1 < 2.
        v[1].load.as_mut().unwrap().completed_since = 2;
        assert_eq!(jsq().pick(&RequestInfo::default(), &v).unwrap().index, 1);
    }

    #[test]
    fn empty_queues_tie_break_on_running() {
        let v = [view(1, 0, 9, 10, 0), view(2, 0, 2, 10, 0)];
        assert_eq!(jsq().pick(&RequestInfo::default(), &v).unwrap().index, 1);
    }

    #[test]
    fn one_stale_candidate_sends_all_to_local_counts() {
        // Replica 1 looks idle by its (stale) scrape; replica 0 has the
        // shorter local count. Local counts decide for both.
        let v = [view(1, 50, 8, 10, 1), view(2, 0, 0, 5_000, 4)];
        let p = jsq().pick(&RequestInfo::default(), &v).unwrap();
        assert_eq!(
            p,
            Pick {
                index: 0,
                branch: Branch::FallbackStaleMetrics
            }
        );
    }

    #[test]
    fn never_scraped_or_missing_metric_falls_back() {
        let mut v = [view(1, 0, 0, 10, 5), view(2, 0, 0, 10, 1)];
        v[0].load.as_mut().unwrap().waiting = None;
        let p = jsq().pick(&RequestInfo::default(), &v).unwrap();
        assert_eq!(
            p,
            Pick {
                index: 1,
                branch: Branch::FallbackStaleMetrics
            }
        );
        v[0].load = None;
        assert_eq!(
            jsq().pick(&RequestInfo::default(), &v).unwrap().branch,
            Branch::FallbackStaleMetrics
        );
    }
}

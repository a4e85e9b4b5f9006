//! Cache-aware scoring: the expected time to first token of a request on
//! each candidate replica, in seconds,
//!
//! ```text
//! ttft = requests ahead × seconds_per_request_ahead
//!      + uncached prompt tokens ÷ prefill_tokens_per_second
//! ```
//!
//! and the lowest wins. A warm replica (most of the prompt cached) loses to
//! a cold idle one exactly when its queue costs more than the prefill the
//! cache would save. This is what keeps one dominant system prompt from
//! melting one replica: its first replica takes requests until the queue
//! there is worth a full prefill elsewhere, then a second replica warms up,
//! and so on until the prefix lives on as many replicas as its load needs.
//! (The same trade-off as Dynamo's KV router cost and llm-d's weighted
//! prefix and queue scorers, expressed in seconds so the two terms share a
//! unit.)
//!
//! "Requests ahead" is the replica's scraped running + waiting count,
//! corrected by what llmlb sent and saw finish since the scrape, when that
//! is fresh for *every* candidate; otherwise llmlb's own in-flight count for
//! every candidate. The two are never compared with each other.
//!
//! Ties (an empty index, even load) go to the earliest replica in the
//! prefix's rendezvous order, so independent llmlb instances agree.
//!
//! Cost: O(candidates), no allocation besides the `ahead` vector.

use crate::balancing::ReplicaView;

/// The cost model's two rates.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    pub prefill_tokens_per_second: f64,
    pub seconds_per_request_ahead: f64,
}

impl CostModel {
    /// Expected time to first token, in seconds.
    pub fn expected_ttft(&self, ahead: u64, uncached_tokens: u64) -> f64 {
        ahead as f64 * self.seconds_per_request_ahead
            + uncached_tokens as f64 / self.prefill_tokens_per_second
    }
}

/// Requests ahead of a new one on each candidate, and whether they come from
/// scraped metrics (fresh for all) rather than local counts.
pub fn requests_ahead(views: &[ReplicaView], max_age_ms: u64) -> (Vec<u64>, bool) {
    let scraped: Option<Vec<u64>> = views
        .iter()
        .map(|v| v.fresh_load(max_age_ms).and_then(|l| l.in_system_now()))
        .collect();
    match scraped {
        Some(s) if !views.is_empty() => (s, true),
        _ => (views.iter().map(|v| v.in_flight).collect(), false),
    }
}

/// One candidate as the scorer sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// Requests ahead of this one on the replica.
    pub ahead: u64,
    /// Prompt tokens the replica probably has cached.
    pub cached_tokens: u64,
    /// Position in the prefix's rendezvous order (tie-break, 0 first).
    pub rank: usize,
}

/// Index of the candidate with the lowest expected TTFT, with that TTFT.
pub fn best(model: &CostModel, prompt_tokens: u64, cands: &[Candidate]) -> Option<(usize, f64)> {
    let mut best: Option<(usize, f64)> = None;
    for (i, c) in cands.iter().enumerate() {
        let uncached = prompt_tokens.saturating_sub(c.cached_tokens);
        let t = model.expected_ttft(c.ahead, uncached);
        let wins = match best {
            None => true,
            Some((b, bt)) => t < bt || (t == bt && c.rank < cands[b].rank),
        };
        if wins {
            best = Some((i, t));
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    const MODEL: CostModel = CostModel {
        prefill_tokens_per_second: 10_000.0,
        seconds_per_request_ahead: 0.02,
    };

    #[test]
    fn warm_but_busy_loses_exactly_when_slower() {
        // 2,050-token prompt, 2,000 cached on the warm replica: the cache
        // saves 0.2 s, each request ahead costs 0.02 s, so the warm replica
        // wins with up to 9 ahead and loses from 10 on.
        for ahead in 0..20u64 {
            let cands = [
                Candidate {
                    ahead,
                    cached_tokens: 2_000,
                    rank: 1,
                },
                Candidate {
                    ahead: 0,
                    cached_tokens: 0,
                    rank: 0,
                },
            ];
            let (i, _) = best(&MODEL, 2_050, &cands).unwrap();
            let warm_ttft = MODEL.expected_ttft(ahead, 50);
            let cold_ttft = MODEL.expected_ttft(0, 2_050);
            assert_eq!(i == 0, warm_ttft < cold_ttft, "ahead {ahead}");
        }
    }

    #[test]
    fn ties_follow_rendezvous_rank() {
        let c = |rank| Candidate {
            ahead: 1,
            cached_tokens: 0,
            rank,
        };
        assert_eq!(best(&MODEL, 100, &[c(2), c(0), c(1)]).unwrap().0, 1);
        assert_eq!(best(&MODEL, 100, &[]), None);
    }

    #[test]
    fn scraped_load_only_when_fresh_for_all() {
        use crate::balancing::ScrapedLoad;
        let fresh = |w| {
            Some(ScrapedLoad {
                running: Some(1),
                waiting: Some(w),
                ..ScrapedLoad::default()
            })
        };
        let mut views = vec![
            ReplicaView {
                in_flight: 7,
                load: fresh(3),
                ..ReplicaView::default()
            },
            ReplicaView {
                in_flight: 2,
                load: fresh(0),
                ..ReplicaView::default()
            },
        ];
        assert_eq!(requests_ahead(&views, 1_000), (vec![4, 1], true));
        views[1].load = None;
        assert_eq!(requests_ahead(&views, 1_000), (vec![7, 2], false));
    }

    /// One dominant system prompt, 8 replicas, every request lasting the
    /// time of 80 arrivals (10 in flight per replica on average). With the
    /// cache-aware score, no replica ever holds more than 1.5× the mean
    /// in-flight load once the fleet is warm, and each serves within ±25 %
    /// of the mean count. Sending every hit to its warm replica would put
    /// everything on one.
    #[test]
    fn dominant_prompt_spreads_instead_of_melting_one_replica() {
        const N: usize = 8;
        const DURATION: usize = 80;
        let prompt = 2_050u64;
        let system = 2_000u64;
        let mut warm = [false; N];
        let mut in_flight = [0u64; N];
        let mut served = [0u64; N];
        let mut finishing: VecDeque<(usize, usize)> = VecDeque::new();
        let mut worst_ratio: f64 = 0.0;
        for t in 0..4_000usize {
            while finishing.front().is_some_and(|(end, _)| *end <= t) {
                let (_, r) = finishing.pop_front().unwrap();
                in_flight[r] -= 1;
            }
            let cands: Vec<Candidate> = (0..N)
                .map(|r| Candidate {
                    ahead: in_flight[r],
                    cached_tokens: if warm[r] { system } else { 0 },
                    rank: r,
                })
                .collect();
            let (r, _) = best(&MODEL, prompt, &cands).unwrap();
            warm[r] = true;
            in_flight[r] += 1;
            served[r] += 1;
            finishing.push_back((t + DURATION, r));
            if t >= 2 * DURATION {
                let mean = in_flight.iter().sum::<u64>() as f64 / N as f64;
                let max = *in_flight.iter().max().unwrap() as f64;
                worst_ratio = worst_ratio.max(max / mean);
            }
        }
        assert!(
            warm.iter().all(|w| *w),
            "the prefix spread to every replica"
        );
        assert!(worst_ratio <= 1.5, "max/mean in flight {worst_ratio}");
        let mean = served.iter().sum::<u64>() as f64 / N as f64;
        for s in served {
            assert!(
                (s as f64) <= 1.25 * mean && (s as f64) >= 0.75 * mean,
                "{served:?}"
            );
        }
    }
}

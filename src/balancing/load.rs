//! Load measures apart from selection: a [`Load`] says how loaded one
//! candidate is, as a comparable key; a selection ([`scan`] here, or two
//! random choices in [`super::p2c`]) decides which candidates to compare.
//! A balancer is one of each (the split of tower's `load::Load` and
//! `balance::p2c`, and of Pingora's weighted selection over a metric).
//!
//! A measure that rests on scraped data has no key for a candidate whose
//! scrape is missing, incomplete or older than the pool's staleness bound.
//! Then every candidate of that pick is compared by the measure's local key
//! (this proxy's own counts) instead, and the pick records
//! `fallback_stale_metrics`: scraped and local units are never mixed.
//! Measures built only on local counts always have a key.
//!
//! Cost of a scan: one key per candidate (O(n)) and one small vector.

use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Balancer, Branch, Pick, RequestInfo};
use crate::replica::ReplicaView;

/// How loaded a candidate is; smaller keys are less loaded.
pub trait Load: std::fmt::Debug + Send + Sync {
    /// The measure's key for a candidate with the data it needs.
    type Metric: PartialOrd;
    /// The key from this proxy's own counts, for the stale-data fallback.
    type Local: PartialOrd;

    /// The key of `view` for placing `req`; `None` when the scraped data the
    /// measure needs is missing or stale.
    fn load(&self, view: &ReplicaView, req: &RequestInfo<'_>) -> Option<Self::Metric>;

    /// The local key, compared for every candidate when any lacks a [`Load::load`].
    fn local(&self, view: &ReplicaView) -> Self::Local;

    /// The branch a scan records when `winner`'s key decided.
    fn branch(&self, winner: &Self::Metric) -> Branch;

    /// The balancer's name when this measure is scanned.
    fn name(&self) -> &'static str;
}

/// The balancer that compares every candidate by one measure ([`scan`]),
/// starting each scan one candidate further so ties rotate.
#[derive(Debug, Default)]
pub struct Scan<L> {
    load: L,
    cursor: AtomicUsize,
}

impl<L: Load> Scan<L> {
    pub fn new(load: L) -> Scan<L> {
        Scan {
            load,
            cursor: AtomicUsize::new(0),
        }
    }
}

impl<L: Load> Balancer for Scan<L> {
    fn name(&self) -> &'static str {
        self.load.name()
    }

    fn pick(&self, req: &RequestInfo<'_>, replicas: &[ReplicaView]) -> Option<Pick> {
        let start = self.cursor.fetch_add(1, Ordering::Relaxed);
        scan(&self.load, req, replicas, start)
    }
}

/// Compares every candidate by `load` and picks the smallest key; ties go
/// to the first met when scanning from `start` (wrapping), so a rotating
/// `start` spreads ties. `None` only when `views` is empty.
pub fn scan<L: Load>(
    load: &L,
    req: &RequestInfo<'_>,
    views: &[ReplicaView],
    start: usize,
) -> Option<Pick> {
    let n = views.len();
    let keys: Option<Vec<L::Metric>> = views.iter().map(|v| load.load(v, req)).collect();
    Some(match keys {
        Some(keys) => {
            let index = argmin_from(n, start, |i| &keys[i])?;
            Pick {
                index,
                branch: load.branch(&keys[index]),
            }
        }
        None => Pick {
            index: argmin_from(n, start, |i| load.local(&views[i]))?,
            branch: Branch::FallbackStaleMetrics,
        },
    })
}

/// Index of the smallest key, scanning from `start` and wrapping, so ties go
/// to a rotating replica instead of always the first.
pub(crate) fn argmin_from<K: PartialOrd>(
    n: usize,
    start: usize,
    key: impl Fn(usize) -> K,
) -> Option<usize> {
    if n == 0 {
        return None;
    }
    let start = start % n;
    let mut best = start;
    let mut best_key = key(start);
    for step in 1..n {
        let i = (start + step) % n;
        let k = key(i);
        if k < best_key {
            best = i;
            best_key = k;
        }
    }
    Some(best)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waiting requests when scraped, else in flight.
    #[derive(Debug)]
    struct Waiting;

    impl Load for Waiting {
        type Metric = u64;
        type Local = u64;
        fn load(&self, v: &ReplicaView, _: &RequestInfo<'_>) -> Option<u64> {
            v.load?.waiting
        }
        fn local(&self, v: &ReplicaView) -> u64 {
            v.in_flight
        }
        fn branch(&self, _: &u64) -> Branch {
            Branch::Jsq
        }
        fn name(&self) -> &'static str {
            "waiting"
        }
    }

    fn view(waiting: Option<u64>, in_flight: u64) -> ReplicaView {
        ReplicaView {
            in_flight,
            load: waiting.map(|w| crate::replica::ScrapedLoad {
                waiting: Some(w),
                ..Default::default()
            }),
            ..ReplicaView::default()
        }
    }

    #[test]
    fn fresh_keys_decide_and_one_missing_sends_all_to_local() {
        let req = RequestInfo::default();
        let v = [view(Some(5), 0), view(Some(1), 9)];
        assert_eq!(
            scan(&Waiting, &req, &v, 0),
            Some(Pick {
                index: 1,
                branch: Branch::Jsq
            })
        );
        let v = [view(Some(5), 0), view(None, 9)];
        assert_eq!(
            scan(&Waiting, &req, &v, 0),
            Some(Pick {
                index: 0,
                branch: Branch::FallbackStaleMetrics
            })
        );
        assert_eq!(scan(&Waiting, &req, &[], 0), None);
    }

    #[test]
    fn ties_go_to_the_first_from_start() {
        let v = [view(Some(0), 0), view(Some(0), 0), view(Some(0), 0)];
        let picks: Vec<usize> = (0..3)
            .map(|s| {
                scan(&Waiting, &RequestInfo::default(), &v, s)
                    .unwrap()
                    .index
            })
            .collect();
        assert_eq!(picks, [0, 1, 2]);
    }
}

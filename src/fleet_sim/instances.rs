//! Several llmlb instances in front of one fleet, with or without a shared
//! `[fleet]` store (`fleet-sim --instances N`).
//!
//! Each simulated instance is its own [`Decider`](super::decide::Decider):
//! its own replicas' in-flight counts, its own `cache`/`hash` prefix index,
//! its own balancer state. Requests go to the instances in turn (as a
//! Kubernetes Service spreads connections). `exact` reads the replicas' KV
//! events, which every instance subscribes to, so it shares one view anyway.
//!
//! - **Without the store** each instance applies a replica's whole
//!   `max_inflight` to what it dispatched itself, so a replica can run
//!   N × `max_inflight`, and routes on the 1/N of the traffic it saw.
//! - **With the store** ([`Leases`]) each instance holds a lease of each
//!   replica's `max_inflight`, renewed every `refresh` of virtual time (the
//!   instances' refreshes spread over the interval) and at once when a
//!   request starts waiting for a slot, as `serve`'s refresh loop is woken:
//!   the lease rule of the store's script (max-min fair share of the limit
//!   among the instances' wants, in flight + waiting; what no one wants
//!   goes in turn to those with demand; never more than the limit minus the
//!   others' leases). The cap is set on the instance's
//!   [`Replica`](crate::replica::Replica) as `serve` sets it, and its pickers
//!   read it there. Dispatch records go through `serve`'s own outbox and are
//!   folded into the other instances' indexes every
//!   [`POLL`](crate::fleet::prefixes::POLL), as the store's stream is read.
//!   One queue order: a waiter takes no slot, and counts as no demand,
//!   while a waiter on another instance goes first (a higher effective
//!   level, or the same one and older by more than two refreshes), the
//!   rule of `serve`'s shared order; each instance sees the others'
//!   waiters at once (`serve` sees them one refresh late). An instance
//!   whose waiter is held back renews at once (its lease shrinks to what
//!   it runs), and that renewal wakes the other instances to renew at
//!   once, as `serve`'s hand-back and the store's wake channel do.
//!
//! Not modelled: the store's round trip (a refresh answers at once) and
//! its failures (no fallback to a share of the limit). Admission
//! (`max_wait`, `ttft_objective`) counts every instance's waiters with and
//! without a store (the run keeps one queue model for the pool); without
//! one, `serve`'s instances would each count only their own. Each
//! instance measures its own drain (service time, admitted arrivals per
//! level, grants); with a store the deadline test prices the higher
//! levels' share with every instance's counts, as `serve` reads them from
//! the others' queue reports.

use std::time::Duration;

/// How many instances, and whether they share a store.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Instances {
    pub count: usize,
    pub store: bool,
    /// The store's lease refresh (`[fleet] refresh`).
    pub refresh: Duration,
}

impl Instances {
    /// One instance: what `fleet-sim` runs without `--instances`.
    pub fn one() -> Instances {
        Instances {
            count: 1,
            store: false,
            refresh: Duration::from_millis(50),
        }
    }

    /// Whether the run models several instances or a store.
    pub fn several(&self) -> bool {
        self.count > 1 || self.store
    }

    /// The run's label suffix: ` x3`, ` x3+store`.
    pub fn label(&self) -> String {
        match (self.several(), self.store) {
            (false, _) => String::new(),
            (true, false) => format!(" x{}", self.count),
            (true, true) => format!(" x{}+store", self.count),
        }
    }
}

/// The store's record of every instance's lease and want on each replica.
#[derive(Debug)]
pub struct Leases {
    /// Per replica, per instance: (lease, want).
    table: Vec<Vec<(u32, u32)>>,
}

impl Leases {
    pub fn new(replicas: usize, instances: usize) -> Leases {
        Leases {
            table: vec![vec![(0, 0); instances]; replicas],
        }
    }

    /// Instance `me` renews its lease of replica `at` (limit `limit`),
    /// holding `held` requests there and wanting `want` slots (in flight +
    /// waiting); `spin` turns the order in which uneven units go round.
    /// Returns its new cap.
    pub fn renew(
        &mut self,
        at: usize,
        me: usize,
        limit: u32,
        held: u32,
        want: u32,
        spin: usize,
    ) -> u32 {
        let row = &mut self.table[at];
        row[me].1 = want;
        let others: u32 = (row.iter().enumerate())
            .filter(|(k, _)| *k != me)
            .map(|(_, (lease, _))| lease)
            .sum();
        let wants: Vec<u32> = row.iter().map(|(_, w)| *w).collect();
        let fair = fair_shares(limit, &wants, spin)[me];
        let cap = fair.min(limit.saturating_sub(others));
        row[me].0 = cap.max(held);
        cap
    }
}

/// Max-min fair shares of `limit` among `wants` (the store script's
/// rule): even shares up to each want; units that do not divide evenly go
/// round starting at `spin`; what no one wants goes round to those with
/// any demand.
pub fn fair_shares(limit: u32, wants: &[u32], spin: usize) -> Vec<u32> {
    let n = wants.len();
    let mut give = vec![0u32; n];
    let mut left = limit;
    if n == 0 {
        return give;
    }
    while left > 0 {
        let unmet = (0..n).filter(|&k| give[k] < wants[k]).count() as u32;
        if unmet == 0 {
            break;
        }
        let even = left / unmet;
        if even == 0 {
            for k in 0..n {
                let j = (k + spin) % n;
                if left > 0 && give[j] < wants[j] {
                    give[j] += 1;
                    left -= 1;
                }
            }
            break;
        }
        for k in 0..n {
            let g = (wants[k] - give[k].min(wants[k])).min(even);
            give[k] += g;
            left -= g;
        }
    }
    if wants.iter().any(|&w| w > 0) {
        let mut k = 0;
        while left > 0 {
            let j = (k + spin) % n;
            if wants[j] > 0 {
                give[j] += 1;
                left -= 1;
            }
            k += 1;
        }
    }
    give
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_follow_demand_and_never_exceed_the_limit() {
        assert_eq!(fair_shares(3, &[5, 5, 5], 0), vec![1, 1, 1]);
        assert_eq!(fair_shares(3, &[0, 4, 0], 0), vec![0, 3, 0]);
        assert_eq!(fair_shares(7, &[1, 9, 9], 0), vec![1, 3, 3]);
        // One unit left over goes round with the spin.
        assert_eq!(fair_shares(2, &[5, 5, 5], 1), vec![0, 1, 1]);
        // What no one wants goes to those asking.
        assert_eq!(fair_shares(8, &[1, 1, 0], 0), vec![4, 4, 0]);
        assert_eq!(fair_shares(8, &[0, 0, 0], 0), vec![0, 0, 0]);
    }

    #[test]
    fn leases_sum_to_at_most_the_limit_while_demand_moves() {
        let mut l = Leases::new(1, 3);
        // Instance 0 alone asks: it gets everything.
        assert_eq!(l.renew(0, 0, 3, 0, 2, 0), 3);
        // Instance 1 asks while 0 still holds its lease: nothing is free.
        assert_eq!(l.renew(0, 1, 3, 0, 3, 0), 0);
        // 0 renews with 1 running: its fair share is 1 (wants 2 and 3,
        // the odd unit to 1 in this turn) ...
        assert_eq!(l.renew(0, 0, 3, 1, 2, 1), 1);
        // ... and 1 gets the rest of the limit.
        assert_eq!(l.renew(0, 1, 3, 0, 3, 1), 2);
        let leases: u32 = l.table[0].iter().map(|(lease, _)| lease).sum();
        assert!(leases <= 3, "{leases}");
    }
}

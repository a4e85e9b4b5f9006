//! The prefix handoff: a freed slot goes to a waiter whose prompt a replica
//! with a free slot already caches, passing the waiters that would go
//! first by up to a bound.
//!
//! Without it a freed slot goes to the level's next waiter (oldest first,
//! or by fair share), and that waiter is sent wherever the slot is: with
//! several prompts in play and each replica's cache holding a few, most
//! slots then go to a prompt the replica does not hold, which it prefills
//! whole and for which it evicts what the next waiters needed. With the
//! handoff, the waiter that goes next is passed while it has waited less
//! than the bound, in favour of the waiter whose prompt the free replica
//! caches the most (oldest first among equals). A waiter that has waited
//! the bound is never passed, so no request waits more than the bound
//! longer than it would have.
//!
//! Under fair share the choice stays within the tenant whose turn it is,
//! so the tenants' shares are kept; oldest first, any waiter of the level
//! may be chosen. Cost: the score of at most [`SCAN`] waiters a grant.

use super::{Entry, FairLevel};
use std::sync::Arc;

/// Waiters scored per grant, oldest first.
const SCAN: usize = 32;

impl<W> FairLevel<W> {
    /// Takes the waiter that goes next, or, while that one arrived after
    /// `due` (it has waited less than the bound), the waiter with the
    /// highest `score` above it among the first [`SCAN`] of the tenant
    /// whose turn it is (of the level, oldest first, when `fair` is off).
    pub fn pop_preferring(
        &mut self,
        fair: bool,
        due: f64,
        score: impl Fn(&W) -> u64,
    ) -> Option<(Arc<str>, f64, Entry<W>)> {
        let turn = self.pick(fair)?;
        if self.flows[turn].queue.front()?.since <= due {
            return self.take(turn, 0);
        }
        let flows: Vec<usize> = match fair {
            true => vec![turn],
            false => (0..self.flows.len()).collect(),
        };
        // The oldest waiters of those flows, in arrival order: the one that
        // goes next comes first.
        let mut scanned: Vec<(u64, usize, usize)> = Vec::new();
        for &f in &flows {
            let queue = self.flows[f].queue.iter().enumerate().take(SCAN);
            scanned.extend(queue.map(|(at, e)| (e.seq, f, at)));
        }
        scanned.sort_unstable();
        // The highest score, the oldest among equals: (score, flow, position).
        let mut best: Option<(u64, usize, usize)> = None;
        for &(_, f, at) in scanned.iter().take(SCAN) {
            let s = score(&self.flows[f].queue[at].item);
            if best.is_none_or(|(b, _, _)| s > b) {
                best = Some((s, f, at));
            }
        }
        let (_, f, at) = best?;
        self.take(f, at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(waiters: &[(&str, f64, u64)]) -> FairLevel<u64> {
        let mut l = FairLevel::default();
        for (tenant, since, score) in waiters {
            l.push(&Arc::from(*tenant), 1.0, *since, *score);
        }
        l
    }

    /// A waiter that has not waited the bound is passed for a younger one
    /// whose prompt a free replica caches; among equal scores the older
    /// goes first; one that has waited the bound is never passed.
    #[test]
    fn the_head_is_passed_only_within_the_bound_and_for_a_higher_score() {
        let mut l = level(&[("", 1.0, 0), ("", 2.0, 5), ("", 3.0, 9), ("", 4.0, 9)]);
        let (_, _, e) = l.pop_preferring(false, 0.5, |s| *s).unwrap();
        assert_eq!((e.since, e.item), (3.0, 9));
        let (_, _, e) = l.pop_preferring(false, 0.5, |s| *s).unwrap();
        assert_eq!((e.since, e.item), (4.0, 9));
        // The head arrived at 1.0: due once the bound reaches back to it.
        let (_, _, e) = l.pop_preferring(false, 1.0, |s| *s).unwrap();
        assert_eq!((e.since, e.item), (1.0, 0));
        assert_eq!(l.len(), 1);
        let (_, _, e) = l.pop_preferring(false, 0.5, |s| *s).unwrap();
        assert_eq!(e.item, 5);
        assert!(l.pop_preferring(false, 0.5, |s| *s).is_none());
    }

    /// Nothing scores above the head: the order is the plain one.
    #[test]
    fn without_a_better_score_the_order_is_kept() {
        let mut l = level(&[("", 1.0, 3), ("", 2.0, 3), ("", 3.0, 0)]);
        let order: Vec<f64> = std::iter::from_fn(|| l.pop_preferring(false, 0.0, |s| *s))
            .map(|(_, _, e)| e.since)
            .collect();
        assert_eq!(order, [1.0, 2.0, 3.0]);
    }

    /// Under fair share the choice stays with the tenant whose turn it is;
    /// oldest first it spans the level's tenants.
    #[test]
    fn fair_share_keeps_the_tenant_s_turn() {
        let waiters = [("a", 1.0, 0), ("b", 2.0, 7), ("a", 3.0, 4)];
        let mut fair = level(&waiters);
        let (t, _, e) = fair.pop_preferring(true, 0.0, |s| *s).unwrap();
        assert_eq!((&*t, e.item), ("a", 4));
        let mut fifo = level(&waiters);
        let (t, _, e) = fifo.pop_preferring(false, 0.0, |s| *s).unwrap();
        assert_eq!((&*t, e.item), ("b", 7));
    }
}

//! Anticipatory holds (as disk schedulers hold a disk idle for the process
//! that just read, to serve its next nearby read): a tenant sending one
//! request at a time frees its slot an instant before it sends the next
//! one. Work-conserving fair share gives that slot to another tenant's
//! waiter at once, and the tenant then waits for the next slot to free,
//! though fair share would have served it first.
//!
//! So when a request of tenant `t` frees its slot, the slot is held for
//! `t`'s next request for a short window (`anticipate`, a few
//! milliseconds: the time a client takes to send its next request) if
//! - `t` has nothing waiting at the level,
//! - another tenant waits at the level (else the slot stays free anyway),
//! - the level is the one a freed slot goes to now (priority and aging),
//! - and `t` was not ahead of its fair share when the request started:
//!   its counter, less what that request was charged, is at most the
//!   lowest counter of the waiting tenants. (Checking the counter with the
//!   request counted would refuse a hold whenever the others gained less
//!   than that one request meanwhile, though the tenant was lifted to the
//!   lowest counter when it started: a tenant taking a held slot is lifted
//!   as one that starts waiting, so it never banks credit.)
//!
//! A request of `t` that arrives within the window takes the held slot
//! ([`FairLevel::take_hold`]); at the end of the window the slot goes to
//! the next waiter. Cost: at most one window of one slot per such release;
//! none when only one tenant is active.

use std::sync::Arc;

use super::FairLevel;
use crate::admission::queue::Level;
use crate::admission::refusal::next_level;

/// A request of `tenant` at `level`, charged `tokens` weighted tokens in
/// all (before its tenant's weight), freed its slot at `now` (seconds):
/// holds the slot for `tenant` until `now + window` when the conditions of
/// the module docs hold. Returns whether it holds. Both dispatchers call
/// this after charging the ended request.
pub fn anticipate<W>(
    levels: &[Level],
    waiting: &mut [FairLevel<W>],
    (level, tenant, tokens): (usize, &Arc<str>, f64),
    now: f64,
    window: f64,
) -> bool {
    if window <= 0.0 || level >= waiting.len() {
        return false;
    }
    let fronts = waiting.iter().map(FairLevel::oldest);
    if next_level(levels, fronts, now) != Some(level) {
        return false;
    }
    waiting[level].hold(tenant, tokens, now, window)
}

impl<W> FairLevel<W> {
    /// Holds a slot for `tenant` until `now + window` when it has nothing
    /// waiting, another tenant waits, and its counter less `tokens` (its
    /// ended request's charge) is at most the lowest waiting counter.
    fn hold(&mut self, tenant: &Arc<str>, tokens: f64, now: f64, window: f64) -> bool {
        self.holds.retain(|(_, until)| *until > now);
        let Some(&i) = self.index.get(tenant) else {
            return false;
        };
        let flow = &self.flows[i];
        if !flow.queue.is_empty() {
            return false;
        }
        let before = self.counters.get(tenant) - tokens / flow.weight;
        match self.lowest_waiting() {
            Some(lowest) if before <= lowest => {}
            _ => return false,
        }
        self.holds.push((Arc::clone(tenant), now + window));
        true
    }

    /// Slots held at `now`.
    pub fn held(&self, now: f64) -> usize {
        self.holds.iter().filter(|(_, until)| *until > now).count()
    }

    /// Whether a slot is held for `tenant` at `now`.
    pub fn holds_for(&self, tenant: &str, now: f64) -> bool {
        (self.holds.iter()).any(|(t, until)| &**t == tenant && *until > now)
    }

    /// A request of `tenant` arriving at `now` takes a slot held for it
    /// (false: none is). It is lifted as a tenant that starts waiting is.
    pub fn take_hold(&mut self, tenant: &Arc<str>, now: f64) -> bool {
        self.holds.retain(|(_, until)| *until > now);
        let Some(at) = self.holds.iter().position(|(t, _)| t == tenant) else {
            return false;
        };
        self.holds.swap_remove(at);
        if let Some(lift) = self.lowest_waiting() {
            self.counters.raise_to(tenant, lift);
        }
        true
    }

    /// When the next hold ends (`None`: none is live at `now`).
    pub fn hold_ends(&self, now: f64) -> Option<f64> {
        (self.holds.iter())
            .map(|(_, until)| *until)
            .filter(|until| *until > now)
            .min_by(f64::total_cmp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn name(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    fn one_level() -> Vec<Level> {
        vec![Level {
            name: "only".into(),
            max_wait: Duration::from_secs(60),
            promote_after: Duration::from_secs(60),
            ttft_objective: None,
        }]
    }

    /// A heavy tenant with `waiters` waiting and 1000 tokens served; the
    /// light tenant served `light` tokens, nothing waiting.
    fn level(waiters: usize, light: f64) -> Vec<FairLevel<usize>> {
        let (heavy, l) = (name("heavy"), name("light"));
        let mut level = FairLevel::default();
        level.started(&heavy, 1.0, 1000.0);
        level.started(&l, 1.0, light);
        level.ended(&l, 1.0, 0.0);
        for i in 0..waiters {
            level.push(&heavy, 1.0, 0.0, i);
        }
        vec![level]
    }

    #[test]
    fn a_tenant_that_would_go_first_gets_its_slot_held_for_the_window() {
        let light = name("light");
        let mut w = level(3, 200.0);
        assert!(anticipate(
            &one_level(),
            &mut w,
            (0, &light, 200.0),
            1.0,
            0.005
        ));
        assert_eq!(w[0].held(1.002), 1);
        assert!(w[0].holds_for("light", 1.002));
        assert!(!w[0].holds_for("heavy", 1.002));
        assert_eq!(w[0].hold_ends(1.002), Some(1.005));
        // Taken within the window, once.
        assert!(w[0].take_hold(&light, 1.002));
        assert!(!w[0].take_hold(&light, 1.003));
        assert_eq!(w[0].held(1.003), 0);
        // Ahead only by the request that ended: held.
        let mut w = level(3, 1100.0);
        assert!(anticipate(
            &one_level(),
            &mut w,
            (0, &light, 200.0),
            1.0,
            0.005
        ));
        // Not taken: it ends with the window.
        assert!(anticipate(
            &one_level(),
            &mut w,
            (0, &light, 200.0),
            2.0,
            0.005
        ));
        assert_eq!(w[0].held(2.005), 0);
        assert!(!w[0].take_hold(&light, 2.006));
    }

    #[test]
    fn no_hold_when_work_conservation_costs_nothing_or_fair_share_would_not_serve_it() {
        let light = name("light");
        // Nobody else waits: the slot stays free anyway.
        assert!(!anticipate(
            &one_level(),
            &mut level(0, 200.0),
            (0, &light, 200.0),
            1.0,
            0.005
        ));
        // Ahead of the waiting tenant before its request: it would not go
        // first.
        assert!(!anticipate(
            &one_level(),
            &mut level(3, 1300.0),
            (0, &light, 200.0),
            1.0,
            0.005
        ));
        // Off.
        assert!(!anticipate(
            &one_level(),
            &mut level(3, 200.0),
            (0, &light, 200.0),
            1.0,
            0.0
        ));
        // It has a waiter of its own: that one takes the slot.
        let mut w = level(3, 200.0);
        w[0].push(&light, 1.0, 0.5, 99);
        assert!(!anticipate(
            &one_level(),
            &mut w,
            (0, &light, 200.0),
            1.0,
            0.005
        ));
        // A higher level waits: the slot goes there.
        let mut levels = one_level();
        levels.insert(0, levels[0].clone());
        let mut w = level(3, 200.0);
        let mut high = FairLevel::default();
        high.push(&name("other"), 1.0, 0.9, 7);
        w.insert(0, high);
        assert!(!anticipate(&levels, &mut w, (1, &light, 200.0), 1.0, 0.005));
    }
}

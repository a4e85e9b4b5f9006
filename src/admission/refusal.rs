//! The pool queue's two decisions as pure functions of what it holds, so
//! that `serve`'s queue ([`super::queue`], on the wall clock under its
//! mutex) and `llmlb fleet-sim` (on a virtual clock) decide alike:
//!
//! - [`refusal`]: whether a newcomer at a level is refused (429), and why:
//!   its level full (`max_depth` waiters), its estimated wait (waiters at
//!   its level or above, and those of lower levels that aging has lifted
//!   to its level or above, + 1, ÷ the drain rate) beyond the level's
//!   `max_wait`, or, on a level with a `ttft_objective`, its predicted time
//!   to first token beyond the objective ([`super::estimate`]).
//! - [`effective_level`]: aging. A waiter counts `⌊waited ÷ promote_after⌋`
//!   levels higher than its own (not above level 0); [`next_level`]: the
//!   level whose oldest waiter has the lowest effective level goes next,
//!   ties to the longest waiting (which of its waiters goes is the level's
//!   fair share, [`super::fair`]).
//! - A full level (`max_depth`) or a tenant at its bound of waiters at the
//!   level refuses at once; the estimated wait counts, of the newcomer's
//!   own level, the waiters fair share puts before it.
//!
//! Times are seconds (f64) from any origin the caller keeps; nothing here
//! reads a clock. Cost: O(levels), plus the deadline test's O(60 × capacity)
//! when the level has an objective.

use std::time::Duration;

use super::estimate::{Drain, Newcomer, Placement, predicted_ttft};
use super::queue::{Level, Refusal};

/// The queue as a newcomer at `level` finds it.
#[derive(Debug, Clone, Copy)]
pub struct Standing<'a> {
    pub level: usize,
    /// Waiters per level, highest level first.
    pub depths: &'a [usize],
    /// Waiters of its own level that go before it (all of them in arrival
    /// order; under fair share, [`super::fair::FairLevel::ahead`]).
    pub level_ahead: usize,
    /// Waiters of its tenant at its level, and the bound on them.
    pub tenant_depth: usize,
    pub tenant_max_depth: usize,
    /// Waiters of lower levels that go before the newcomer
    /// ([`lifted_ahead`]).
    pub promoted: usize,
    /// Slots of the replicas that may take work.
    pub capacity: usize,
    /// A slot is free and nobody waits: it would be dispatched at once.
    pub free: bool,
    /// Its predicted time to first token once dispatched (read only on a
    /// level with a `ttft_objective`).
    pub placement: Placement,
}

/// Why a newcomer is refused, or `None` when it is admitted or queued.
/// `ages` gives how long each request holding a slot has held it, in
/// seconds; it is called only for the deadline test.
pub fn refusal(
    levels: &[Level],
    max_depth: usize,
    drain: &Drain,
    s: Standing<'_>,
    ages: impl FnOnce() -> Vec<f64>,
) -> Option<Refusal> {
    let level = s.level.min(levels.len().saturating_sub(1));
    let queued: usize = s.depths.iter().sum();
    let retry_after = drain.backlog(queued, s.capacity);
    let ahead: usize = s.depths.iter().take(level).sum::<usize>() + s.level_ahead + s.promoted;
    let at_level = s.depths.get(level).copied().unwrap_or(0);
    let settings = levels.get(level)?;
    if !s.free {
        if at_level >= max_depth {
            return Some(Refusal::QueueFull { retry_after });
        }
        if s.tenant_depth >= s.tenant_max_depth {
            return Some(Refusal::TenantFull { retry_after });
        }
        if let Some(rate) = drain.rate(s.capacity) {
            let estimated = Duration::from_secs_f64((ahead + 1) as f64 / rate);
            if estimated > settings.max_wait {
                return Some(Refusal::OverObjective {
                    estimated: Some(estimated),
                    retry_after,
                });
            }
        }
    }
    let objective = settings.ttft_objective?;
    let newcomer = Newcomer {
        level,
        ahead,
        now: s.free,
        placement: s.placement,
    };
    let predicted =
        predicted_ttft(drain, s.capacity, &ages(), newcomer).map(Duration::from_secs_f64);
    predicted
        .is_none_or(|p| p > objective)
        .then_some(Refusal::OverObjective {
            estimated: predicted,
            retry_after,
        })
}

/// Whether a waiter at level `waiter` that has waited `waited` seconds
/// goes before a newcomer at level `newcomer`: it is of a lower level and
/// aging ([`effective_level`]) lifts it to the newcomer's level or above
/// within the newcomer's horizon. Being older, a lifted waiter goes first.
/// A level with a `ttft_objective` admits only newcomers that start within
/// it, so that is its horizon; other levels count the waiters lifted by
/// now.
pub fn lifted_ahead(levels: &[Level], newcomer: usize, waiter: usize, waited: f64) -> bool {
    let Some(w) = levels.get(waiter).filter(|_| waiter > newcomer) else {
        return false;
    };
    let horizon = levels
        .get(newcomer)
        .and_then(|l| l.ttft_objective)
        .map_or(0.0, |o| o.as_secs_f64());
    effective_level(waiter, waited + horizon, w.promote_after) <= newcomer
}

/// The level whose waiter goes next: each level's oldest waiter (`fronts`:
/// its arrival in seconds and its order of arrival, `None` for an empty
/// level) competes at its effective level at `now`; the lowest wins, ties
/// to the longest waiting.
pub fn next_level(
    levels: &[Level],
    fronts: impl Iterator<Item = Option<(f64, u64)>>,
    now: f64,
) -> Option<usize> {
    let mut best: Option<(usize, f64, usize)> = None;
    for (level, front) in fronts.enumerate() {
        let Some((since, _)) = front else { continue };
        let promote_after = levels
            .get(level)
            .map_or(Duration::ZERO, |l| l.promote_after);
        let effective = effective_level(level, now - since, promote_after);
        let better = match best {
            None => true,
            Some((e, s, _)) => effective < e || (effective == e && since < s),
        };
        if better {
            best = Some((effective, since, level));
        }
    }
    best.map(|(_, _, level)| level)
}

/// The level a waiter at `level` competes at after waiting `waited`
/// seconds: one level higher per `promote_after` waited (none when it is
/// zero), not above level 0.
pub fn effective_level(level: usize, waited: f64, promote_after: Duration) -> usize {
    let step = promote_after.as_secs_f64();
    let promoted = if step > 0.0 {
        (waited.max(0.0) / step) as usize
    } else {
        0
    };
    level.saturating_sub(promoted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn level(max_wait: u64, objective: Option<u64>) -> Level {
        Level {
            name: "l".into(),
            max_wait: Duration::from_secs(max_wait),
            promote_after: Duration::from_secs(5),
            ttft_objective: objective.map(Duration::from_secs),
        }
    }

    fn standing(level: usize, depths: &[usize], free: bool) -> Standing<'_> {
        Standing {
            level,
            depths,
            level_ahead: depths.get(level).copied().unwrap_or(0),
            tenant_depth: 0,
            tenant_max_depth: usize::MAX,
            capacity: 2,
            free,
            promoted: 0,
            placement: Placement::default(),
        }
    }

    #[test]
    fn depth_and_max_wait_count_only_the_levels_that_go_first() {
        let levels = [level(10, None), level(10, None)];
        let mut drain = Drain::default();
        let none = || unreachable!("no deadline level");
        // Level 1 full; level 0 still has room.
        let full = refusal(&levels, 3, &drain, standing(1, &[0, 3], false), none);
        assert!(matches!(full, Some(Refusal::QueueFull { .. })));
        assert_eq!(
            refusal(&levels, 3, &drain, standing(0, &[0, 3], false), none),
            None
        );
        // 2 slots held 2 s each: 1 req/s. Ten waiting at level 1 do not
        // count for a level-0 newcomer; ten at level 0 do for level 1.
        drain.served(2.0);
        assert_eq!(
            refusal(&levels, 100, &drain, standing(0, &[9, 10], false), none),
            None
        );
        assert!(matches!(
            refusal(&levels, 100, &drain, standing(1, &[10, 0], false), none),
            Some(Refusal::OverObjective { .. })
        ));
        // A free slot skips both tests.
        assert_eq!(
            refusal(&levels, 0, &drain, standing(1, &[0, 0], true), none),
            None
        );
    }

    #[test]
    fn aged_waiters_of_lower_levels_count_as_ahead() {
        let levels = [level(10, None), level(3600, None)];
        let mut drain = Drain::default();
        drain.served(2.0);
        // 1 request/s with 2 slots: 9 waiting at level 0 is a 10 s wait,
        // within max_wait; one more, lifted from level 1, is not.
        let mut s = standing(0, &[9, 5], false);
        assert_eq!(refusal(&levels, 100, &drain, s, Vec::new), None);
        s.promoted = 1;
        assert!(matches!(
            refusal(&levels, 100, &drain, s, Vec::new),
            Some(Refusal::OverObjective { .. })
        ));
    }

    #[test]
    fn a_deadline_level_refuses_a_placement_beyond_its_objective() {
        let levels = [level(3600, Some(2))];
        let drain = Drain::default();
        let mut s = standing(0, &[0], true);
        s.placement = Duration::from_secs(3).into();
        assert!(matches!(
            refusal(&levels, 10, &drain, s, Vec::new),
            Some(Refusal::OverObjective { estimated, .. }) if estimated == Some(Duration::from_secs(3))
        ));
        s.placement = Duration::from_secs(1).into();
        assert_eq!(refusal(&levels, 10, &drain, s, Vec::new), None);
    }

    #[test]
    fn a_deadline_newcomer_looks_its_objective_ahead_for_lifted_waiters() {
        // Level 0 with a 2 s objective, levels 1 and 2 lifted every 5 s.
        let levels = [level(3600, Some(2)), level(3600, None), level(3600, None)];
        assert!(!lifted_ahead(&levels, 0, 1, 2.9));
        assert!(lifted_ahead(&levels, 0, 1, 3.0), "lifted within 2 s");
        assert!(!lifted_ahead(&levels, 0, 2, 7.9));
        assert!(lifted_ahead(&levels, 0, 2, 8.0));
        // Without an objective: only those lifted by now; never a waiter
        // of the newcomer's own level or above, nor of a level not defined.
        assert!(!lifted_ahead(&levels, 1, 2, 4.9));
        assert!(lifted_ahead(&levels, 1, 2, 5.0));
        assert!(!lifted_ahead(&levels, 1, 1, 60.0));
        assert!(!lifted_ahead(&levels, 1, 7, 60.0));
    }

    #[test]
    fn aging_moves_a_waiter_up_one_level_per_step() {
        let step = Duration::from_secs(5);
        assert_eq!(effective_level(2, 4.9, step), 2);
        assert_eq!(effective_level(2, 5.0, step), 1);
        assert_eq!(effective_level(2, 60.0, step), 0);
        assert_eq!(effective_level(2, 60.0, Duration::ZERO), 2);
    }
}

//! This instance's side of the slot leases: which cap each replica has
//! here, from the last grants, the time since the store last answered, and
//! the fallback when it stopped answering. Pure: the caller passes the
//! clock, so every transition is unit-tested without a store.
//!
//! Phases, measured from `sent`, the moment the last successful refresh was
//! sent (the store recorded the lease no earlier, so it lapses there no
//! earlier than `sent + ttl`):
//! - **leased** until `sent + ttl − margin` (`margin` = one refresh and two
//!   call timeouts, so a loop that ticks late still stops in time): the
//!   granted cap;
//! - **expiring** until `sent + ttl + margin`: the smaller of the granted cap
//!   and the fallback, while the other instances' leases run out;
//! - **fallback** after that: `max(1, ⌊limit ÷ live⌋ − excess)`, with `live`
//!   the number of instances the last refresh saw and `excess` what the
//!   others held beyond that even share (their running requests). Never
//!   below 1, so no request waits forever on a store.
//! - **probation**, for one `ttl` after the store answers again (or after
//!   it lost its data): the granted cap, but no more than the cap in force
//!   when the store came back, while the other instances re-register what
//!   they hold.
//!
//! Between refreshes the instance may give slots back ([`Leases::release`]):
//! the cap in force drops at once, and the next refresh reports the lower
//! cap as what it holds, so the store can hand the slots to another
//! instance one refresh sooner. The cap stays lowered until an answer.
//!
//! Before its first successful refresh the instance holds no slot (cap 0);
//! when the store has not answered for one `ttl + margin` since the first
//! try, it falls back as if it were alone (`live = 1`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How this instance stands with the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// No refresh has finished yet.
    Joining,
    Leased,
    /// Back after a failure: leases, capped by what was in force.
    Probation,
    /// The store stopped answering; the leases are running out.
    Expiring,
    Fallback,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Joining => "joining",
            Phase::Leased => "leased",
            Phase::Probation => "probation",
            Phase::Expiring => "expiring",
            Phase::Fallback => "fallback",
        }
    }
}

/// What one replica's refresh returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    pub cap: u32,
    /// The other instances' leases beyond the even share.
    pub excess: u32,
}

#[derive(Debug, Clone, Default)]
struct Slot {
    limit: u32,
    grant: u32,
    excess: u32,
    /// The cap in force when probation began.
    ceiling: Option<u32>,
    /// Given back since the last answer: the cap is at most this.
    released: Option<u32>,
}

#[derive(Debug)]
pub struct Leases {
    ttl: Duration,
    margin: Duration,
    sent: Option<Instant>,
    /// When the first refresh was tried.
    first_try: Option<Instant>,
    live: u32,
    epoch: Option<String>,
    probation_until: Option<Instant>,
    slots: HashMap<String, Slot>,
}

impl Leases {
    pub fn new(ttl: Duration, refresh: Duration, timeout: Duration) -> Leases {
        Leases {
            ttl,
            margin: refresh + timeout * 2,
            sent: None,
            first_try: None,
            live: 1,
            epoch: None,
            probation_until: None,
            slots: HashMap::new(),
        }
    }

    pub fn phase(&self, now: Instant) -> Phase {
        let Some(sent) = self.sent else {
            return match self.first_try {
                Some(first) if now >= first + self.ttl + self.margin => Phase::Fallback,
                _ => Phase::Joining,
            };
        };
        if now + self.margin < sent + self.ttl {
            if self.probation_until.is_some_and(|until| now < until) {
                Phase::Probation
            } else {
                Phase::Leased
            }
        } else if now < sent + self.ttl + self.margin {
            Phase::Expiring
        } else {
            Phase::Fallback
        }
    }

    /// Live instances the last refresh counted (1 before any).
    pub fn live(&self) -> u32 {
        self.live
    }

    /// The cap in force on replica `key` (limit `limit`) at `now`.
    pub fn cap(&self, key: &str, limit: u32, now: Instant) -> u32 {
        let slot = self.slots.get(key);
        let fallback = || {
            let excess = slot.map_or(0, |s| s.excess);
            (limit / self.live.max(1)).saturating_sub(excess).max(1)
        };
        let granted = || {
            let s = slot.cloned().unwrap_or_default();
            let grant = s.grant.min(limit).min(s.released.unwrap_or(u32::MAX));
            match s.ceiling {
                Some(c) if self.probation_until.is_some_and(|u| now < u) => grant.min(c),
                _ => grant,
            }
        };
        match self.phase(now) {
            Phase::Joining => 0,
            Phase::Leased | Phase::Probation => granted(),
            Phase::Expiring => granted().min(fallback()),
            Phase::Fallback => fallback().min(limit.max(1)),
        }
    }

    /// A refresh sent at `sent` failed (no answer, an error or over the timeout).
    pub fn failed(&mut self, sent: Instant) {
        self.first_try.get_or_insert(sent);
    }

    /// A refresh sent at `sent` answered at `now` with `grants` for
    /// `limits` (same order, one per replica key). Returns true when it
    /// starts a probation (the store came back, or lost its data).
    pub fn answered(
        &mut self,
        now: Instant,
        sent: Instant,
        epoch: &str,
        live: u32,
        limits: &[(&str, u32)],
        grants: &[Grant],
    ) -> bool {
        let rejoin = match self.phase(now) {
            Phase::Joining => false,
            Phase::Expiring | Phase::Fallback => true,
            Phase::Leased | Phase::Probation => false,
        } || self.epoch.as_deref().is_some_and(|e| e != epoch);
        let before: Vec<u32> = limits
            .iter()
            .map(|(key, limit)| self.cap(key, *limit, now))
            .collect();
        let in_probation = self.probation_until.is_some_and(|u| now < u);
        if rejoin {
            self.probation_until = Some(now + self.ttl);
        }
        let mut slots = HashMap::with_capacity(limits.len());
        for (((key, limit), grant), before) in limits.iter().zip(grants).zip(before) {
            let old_ceiling = self.slots.get(*key).and_then(|s| s.ceiling);
            let ceiling = if rejoin {
                Some(before)
            } else if in_probation {
                // A replica new during probation starts from nothing.
                Some(old_ceiling.unwrap_or(0))
            } else {
                None
            };
            slots.insert(
                key.to_string(),
                Slot {
                    limit: *limit,
                    grant: grant.cap,
                    excess: grant.excess,
                    ceiling,
                    released: None,
                },
            );
        }
        self.slots = slots;
        self.sent = Some(sent);
        self.first_try.get_or_insert(sent);
        self.live = live.max(1);
        self.epoch = Some(epoch.to_string());
        rejoin
    }

    /// Lowers the cap on replica `key` (limit `limit`) to `keep` until the
    /// next answer, when the lease holds more: the slots go back to the
    /// store with the next refresh. Only a lease can be given back (not the
    /// fallback's share). Returns whether the cap dropped.
    pub fn release(&mut self, key: &str, limit: u32, keep: u32, now: Instant) -> bool {
        if !matches!(self.phase(now), Phase::Leased | Phase::Probation)
            || self.cap(key, limit, now) <= keep
        {
            return false;
        }
        match self.slots.get_mut(key) {
            Some(slot) => {
                slot.released = Some(keep);
                true
            }
            None => false,
        }
    }

    /// The limits of the replicas the last refresh covered, by key.
    pub fn limits(&self) -> impl Iterator<Item = (&str, u32)> {
        self.slots.iter().map(|(k, s)| (k.as_str(), s.limit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TTL: Duration = Duration::from_secs(2);
    const REFRESH: Duration = Duration::from_millis(50);
    const TIMEOUT: Duration = Duration::from_millis(50);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn grant(cap: u32, excess: u32) -> Grant {
        Grant { cap, excess }
    }

    #[test]
    fn joining_holds_nothing_and_a_store_never_reached_means_alone() {
        let t0 = Instant::now();
        let mut l = Leases::new(TTL, REFRESH, TIMEOUT);
        assert_eq!(l.phase(t0), Phase::Joining);
        assert_eq!(l.cap("p/a", 3, t0), 0);
        l.failed(t0);
        assert_eq!(
            l.cap("p/a", 3, t0 + ms(100)),
            0,
            "one failure is not an outage"
        );
        l.failed(t0 + ms(100));
        assert_eq!(l.phase(t0 + ms(2200)), Phase::Fallback);
        assert_eq!(
            l.cap("p/a", 3, t0 + ms(2200)),
            3,
            "alone as far as it knows"
        );
    }

    #[test]
    fn a_lease_runs_out_then_the_share_of_the_instances_last_seen() {
        let t0 = Instant::now();
        let mut l = Leases::new(TTL, REFRESH, TIMEOUT);
        assert!(!l.answered(t0, t0, "e", 3, &[("p/a", 7)], &[grant(5, 0)]));
        assert_eq!(l.cap("p/a", 7, t0 + ms(10)), 5);
        // The store stops answering: the lease holds while it is valid ...
        l.failed(t0 + ms(100));
        assert_eq!(l.cap("p/a", 7, t0 + ms(1800)), 5);
        // ... then the smaller of lease and share (7 ÷ 3 = 2) ...
        assert_eq!(l.phase(t0 + ms(1900)), Phase::Expiring);
        assert_eq!(l.cap("p/a", 7, t0 + ms(1900)), 2);
        // ... then the share alone.
        assert_eq!(l.phase(t0 + ms(2200)), Phase::Fallback);
        assert_eq!(l.cap("p/a", 7, t0 + ms(2200)), 2);
    }

    #[test]
    fn the_fallback_leaves_the_others_excess_but_keeps_one_slot() {
        let t0 = Instant::now();
        let mut l = Leases::new(TTL, REFRESH, TIMEOUT);
        l.answered(
            t0,
            t0,
            "e",
            2,
            &[("a", 8), ("b", 2)],
            &[grant(0, 3), grant(0, 5)],
        );
        let later = t0 + ms(5000);
        assert_eq!(l.cap("a", 8, later), 1, "8 ÷ 2 − 3");
        assert_eq!(l.cap("b", 2, later), 1, "never below one");
        let mut l = Leases::new(TTL, REFRESH, TIMEOUT);
        l.answered(t0, t0, "e", 2, &[("a", 8)], &[grant(4, 0)]);
        assert_eq!(l.cap("a", 8, later), 4);
    }

    #[test]
    fn coming_back_is_a_probation_capped_by_what_was_in_force() {
        let t0 = Instant::now();
        let mut l = Leases::new(TTL, REFRESH, TIMEOUT);
        l.answered(t0, t0, "e", 3, &[("a", 9)], &[grant(6, 0)]);
        let back = t0 + ms(10_000);
        assert_eq!(l.cap("a", 9, back), 3, "fallback: 9 ÷ 3");
        assert!(l.answered(back, back, "e", 3, &[("a", 9)], &[grant(8, 0)]));
        assert_eq!(l.phase(back), Phase::Probation);
        assert_eq!(l.cap("a", 9, back + ms(100)), 3);
        // Grants during probation are still capped; after it, they rule.
        let next = back + ms(1000);
        assert!(!l.answered(next, next, "e", 3, &[("a", 9)], &[grant(2, 0)]));
        assert_eq!(l.cap("a", 9, next), 2);
        let after = back + TTL + ms(10);
        l.answered(after, after, "e", 3, &[("a", 9)], &[grant(7, 0)]);
        assert_eq!(l.phase(after), Phase::Leased);
        assert_eq!(l.cap("a", 9, after), 7);
    }

    #[test]
    fn a_store_that_lost_its_data_starts_a_probation() {
        let t0 = Instant::now();
        let mut l = Leases::new(TTL, REFRESH, TIMEOUT);
        l.answered(t0, t0, "e1", 2, &[("a", 4)], &[grant(1, 0)]);
        let t1 = t0 + ms(50);
        assert!(l.answered(t1, t1, "e2", 1, &[("a", 4)], &[grant(4, 0)]));
        assert_eq!(
            l.cap("a", 4, t1),
            1,
            "no more than before until the others re-register"
        );
    }

    #[test]
    fn slots_given_back_stay_back_until_the_next_answer() {
        let t0 = Instant::now();
        let mut l = Leases::new(TTL, REFRESH, TIMEOUT);
        l.answered(t0, t0, "e", 2, &[("a", 8)], &[grant(6, 0)]);
        assert!(!l.release("a", 8, 6, t0), "nothing to give back");
        assert!(l.release("a", 8, 2, t0 + ms(10)));
        assert_eq!(l.cap("a", 8, t0 + ms(10)), 2);
        // A refresh that failed (its script may have run) keeps it low.
        l.failed(t0 + ms(20));
        assert_eq!(l.cap("a", 8, t0 + ms(30)), 2);
        assert!(!l.release("a", 8, 3, t0 + ms(30)), "never raised");
        // The next answer's grant rules again.
        l.answered(
            t0 + ms(40),
            t0 + ms(40),
            "e",
            2,
            &[("a", 8)],
            &[grant(4, 0)],
        );
        assert_eq!(l.cap("a", 8, t0 + ms(40)), 4);
        // The fallback's share is not a lease: nothing to give back.
        assert!(!l.release("a", 8, 0, t0 + ms(9000)));
    }

    #[test]
    fn no_cap_exceeds_the_limit() {
        let t0 = Instant::now();
        let mut l = Leases::new(TTL, REFRESH, TIMEOUT);
        l.answered(t0, t0, "e", 1, &[("a", 4)], &[grant(4, 0)]);
        // A reload lowered the limit before the next refresh.
        assert_eq!(l.cap("a", 2, t0), 2);
        assert_eq!(l.cap("a", 2, t0 + ms(9000)), 2);
    }
}

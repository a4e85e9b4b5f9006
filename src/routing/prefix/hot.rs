//! Hot prefixes kept warm on purpose: when one prompt prefix brings more
//! requests than one replica should carry, it is assigned to k replicas
//! (the first k of the prefix's rendezvous order), which `cache` and
//! `exact` scoring then count as holding it. k follows demand up at once
//! and back down one replica per `replicate_hold` once demand has fallen.
//!
//! ```text
//! share    = decayed arrivals of the prefix ÷ (decayed arrivals of the
//!            pool + 8) (exponential decay, time constant `replicate_hold`;
//!            the 8 keeps a fresh pool's first arrivals from each looking
//!            like all of its traffic)
//! demand   = share × requests the pool has in flight, this one included
//!            (requests; Little's law: the prefix's part of the pool's load)
//! capacity = max(replicate_above, 1.5 × mean in flight per replica)
//!            (requests one replica should carry of one prefix: the floor
//!            the operator sets, or half again the mean when the pool is
//!            busier than that, so that even traffic keeps k = 1 through
//!            the noise of its arrivals)
//! k        = clamp(⌈demand ÷ capacity⌉, 1, replicas)
//! ```
//!
//! The decision is per request and per prefix: no fleet-wide imbalance
//! threshold switches the whole pool to load balancing. A prefix whose
//! demand fits one replica keeps k = 1 and is scored exactly as before.
//!
//! What the copies hold is the part of the prompt the prefix's arrivals
//! share: the leading blocks an arrival has in common with the previous
//! one (a system prompt, few-shot examples), not the rest of any one
//! conversation.
//!
//! Memory: at most [`MAX_TRACKED`] prefixes, each with the block hashes of
//! its last arrival (at most [`MAX_BLOCKS`], 2 KiB); when full, the
//! prefixes with the least recent demand are dropped.
//!
//! Cost: one mutex held for a hash-map lookup and a few floating-point
//! operations per request of a `cache` or `exact` pool; the rendezvous
//! order is computed by the caller only when k ≥ 2.

use std::collections::HashMap;
use std::sync::Mutex;

use super::home::Homes;
use super::rendezvous::Node;

/// Prefixes tracked per pool before the coldest are dropped.
pub const MAX_TRACKED: usize = 4_096;

/// Leading blocks of an arrival remembered per prefix (4,096 tokens at 16
/// per block): a shared part longer than this counts as this long.
pub const MAX_BLOCKS: usize = 256;

/// Pseudo-arrivals of other prefixes added to the pool's count, so that
/// the first few arrivals of a fresh pool do not each look like all of its
/// traffic.
const PRIOR: f64 = 8.0;

/// How far above the mean in-flight load one replica may carry of one
/// prefix before the prefix is copied: even traffic (every prefix about its
/// fair share) stays at one copy each.
const HEADROOM: f64 = 1.5;

/// The controller's settings (from `[pools.prefix]`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HotSettings {
    /// Copy a prefix to more replicas when its demand calls for it (else
    /// every prefix keeps one copy and only its home and shared part are
    /// tracked).
    pub replicate: bool,
    /// Give every prefix a home ([`super::home`]).
    pub homes: bool,
    /// In-flight requests of one prefix one replica carries before the
    /// prefix is copied to another (the capacity floor).
    pub above: f64,
    /// Time constant of the demand estimate, and how long demand must stay
    /// below k − 1 copies before one is given up, in milliseconds.
    pub hold_ms: u64,
}

/// The demand of every prefix of one pool, and its number of copies.
#[derive(Debug)]
pub struct HotPrefixes {
    settings: HotSettings,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    pool: Decayed,
    prefixes: HashMap<u64, Entry>,
    homes: Homes,
}

#[derive(Debug, Clone)]
struct Entry {
    demand: Decayed,
    copies: usize,
    /// Since when the target has been below `copies` (ms).
    below_since: Option<u64>,
    /// The block hashes of the prefix's last arrival (at most
    /// [`MAX_BLOCKS`]), and how many of them the arrival before shared.
    last: Vec<u64>,
    shared: usize,
    /// The name hash of the prefix's home, once it has one.
    home: Option<u64>,
}

/// What one arrival learns: how many replicas should hold its prefix, and
/// how many leading blocks it shares with the prefix's previous arrival
/// (what the copies are there to hold).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hot {
    pub copies: usize,
    pub shared_blocks: usize,
    /// The prefix's home: an index into the candidates it was asked for
    /// (`None` with homes off, or a single candidate).
    pub home: Option<usize>,
}

/// An exponentially decayed count of arrivals: steady arrivals at λ per
/// second hold it near λ × τ, so a ratio of two is a ratio of rates.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Decayed {
    value: f64,
    at_ms: u64,
}

impl Decayed {
    pub(super) fn at(&self, now_ms: u64, tau_ms: f64) -> f64 {
        let dt = now_ms.saturating_sub(self.at_ms) as f64;
        self.value * (-dt / tau_ms).exp()
    }

    pub(super) fn add(&mut self, now_ms: u64, tau_ms: f64) {
        self.shift(now_ms, tau_ms, 1.0);
    }

    /// Adds `by` (may be negative; the value stays at or above 0).
    pub(super) fn shift(&mut self, now_ms: u64, tau_ms: f64, by: f64) {
        self.value = (self.at(now_ms, tau_ms) + by).max(0.0);
        self.at_ms = self.at_ms.max(now_ms);
    }
}

/// Replicated prefixes of a pool right now, for the gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Replication {
    /// Prefixes kept on two or more replicas.
    pub prefixes: u64,
    /// Copies beyond the first, summed over those prefixes.
    pub extra_copies: u64,
}

impl HotPrefixes {
    pub fn new(settings: HotSettings) -> HotPrefixes {
        HotPrefixes {
            settings,
            state: Mutex::new(State::default()),
        }
    }

    pub fn settings(&self) -> HotSettings {
        self.settings
    }

    fn tau(&self) -> f64 {
        self.settings.hold_ms.max(1) as f64
    }

    /// Counts an arrival of prefix `key` at `now_ms` in a pool of `replicas`
    /// equal replicas with `in_flight` requests (not counting this one), and
    /// returns how many replicas should hold the prefix.
    #[cfg(test)]
    pub fn arrive(&self, key: u64, now_ms: u64, in_flight: u64, replicas: usize) -> usize {
        self.arrive_blocks(key, &[], now_ms, in_flight, &tests::nodes(replicas as u64))
            .copies
    }

    /// Counts an arrival of prefix `key`, a prompt of `blocks` (chained
    /// hashes), at `now_ms` in a pool whose candidates are `nodes`, with
    /// `in_flight` requests (not counting this one): how many replicas
    /// should hold the prefix, how many blocks its previous arrival shared,
    /// and its home.
    pub fn arrive_blocks(
        &self,
        key: u64,
        blocks: &[u64],
        now_ms: u64,
        in_flight: u64,
        nodes: &[Node],
    ) -> Hot {
        let replicas = nodes.len();
        if replicas <= 1 {
            return Hot {
                copies: 1,
                shared_blocks: 0,
                home: None,
            };
        }
        let tau = self.tau();
        let mut guard = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let s = &mut *guard;
        s.pool.add(now_ms, tau);
        let pool = s.pool.value;
        if s.prefixes.len() >= MAX_TRACKED && !s.prefixes.contains_key(&key) {
            forget_coldest(&mut s.prefixes, now_ms, tau);
        }
        let e = s.prefixes.entry(key).or_insert(Entry {
            demand: Decayed::default(),
            copies: 1,
            below_since: None,
            last: Vec::new(),
            shared: 0,
            home: None,
        });
        e.demand.add(now_ms, tau);
        let head = &blocks[..blocks.len().min(MAX_BLOCKS)];
        e.shared = e.last.iter().zip(head).take_while(|(a, b)| a == b).count();
        e.last.clear();
        e.last.extend_from_slice(head);
        let home = if self.settings.homes {
            // Its arrivals before this one (this one is counted on the home
            // after the choice).
            let demand = (e.demand.at(now_ms, tau) - 1.0).max(0.0);
            let home = s.homes.place(e.home, key, demand, nodes, now_ms, tau);
            e.home = home.map(|i| nodes[i].name_hash);
            home
        } else {
            None
        };
        if !self.settings.replicate {
            return Hot {
                copies: 1,
                shared_blocks: e.shared,
                home,
            };
        }
        let share = (e.demand.value / (pool + PRIOR)).min(1.0);
        let load = (in_flight + 1) as f64;
        let demand = share * load;
        let capacity = self.settings.above.max(HEADROOM * load / replicas as f64);
        let target = ((demand / capacity).ceil() as usize).clamp(1, replicas);
        e.copies = e.copies.min(replicas);
        if target >= e.copies {
            e.copies = target;
            e.below_since = None;
        } else {
            match e.below_since {
                None => e.below_since = Some(now_ms),
                Some(since) if now_ms.saturating_sub(since) >= self.settings.hold_ms => {
                    e.copies -= 1;
                    e.below_since = (e.copies > target).then_some(now_ms);
                }
                Some(_) => {}
            }
        }
        Hot {
            copies: e.copies,
            shared_blocks: e.shared,
            home,
        }
    }

    /// How many prefixes are replicated now, and their extra copies.
    pub fn replication(&self) -> Replication {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut r = Replication::default();
        for e in s.prefixes.values().filter(|e| e.copies > 1) {
            r.prefixes += 1;
            r.extra_copies += (e.copies - 1) as u64;
        }
        r
    }

    /// Prefixes tracked (for tests of the bound).
    pub fn tracked(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .prefixes
            .len()
    }
}

/// Drops the quarter of `prefixes` with the least demand at `now_ms`.
fn forget_coldest(prefixes: &mut HashMap<u64, Entry>, now_ms: u64, tau: f64) {
    let mut demand: Vec<f64> = prefixes
        .values()
        .map(|e| e.demand.at(now_ms, tau))
        .collect();
    let cut = demand.len() / 4;
    demand.select_nth_unstable_by(cut, f64::total_cmp);
    let bar = demand[cut];
    prefixes.retain(|_, e| e.demand.at(now_ms, tau) > bar);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hot() -> HotPrefixes {
        HotPrefixes::new(HotSettings {
            replicate: true,
            homes: false,
            above: 4.0,
            hold_ms: 10_000,
        })
    }

    #[test]
    fn a_prefix_within_one_replicas_capacity_keeps_one_copy() {
        let h = hot();
        // One prefix alone, 3 requests in flight over 4 replicas.
        for i in 0..100 {
            assert_eq!(h.arrive(7, i * 10, 3, 4), 1);
        }
        assert_eq!(h.replication(), Replication::default());
    }

    /// `n` arrivals of `key`, 1 ms apart from `from`; the last one's copies.
    fn feed(
        h: &HotPrefixes,
        key: u64,
        n: u64,
        from: u64,
        in_flight: u64,
        replicas: usize,
    ) -> usize {
        (0..n)
            .map(|i| h.arrive(key, from + i, in_flight, replicas))
            .last()
            .unwrap()
    }

    #[test]
    fn copies_follow_demand_up_at_once() {
        let h = hot();
        // The first arrival of a fresh pool is not taken for all its traffic.
        assert_eq!(h.arrive(7, 0, 10, 4), 1);
        // All traffic is one prefix (share 100 ÷ 108); 10 in flight with a
        // floor of 4 per replica: ⌈10.2 ÷ 4.1⌉ = 3 copies of 4 replicas.
        assert_eq!(feed(&h, 7, 99, 1, 10, 4), 3);
        // 40 in flight: a replica's capacity is 1.5 × the mean (15.4);
        // ⌈0.93 × 41 ÷ 15.4⌉ = 3 copies, and the fourth replica takes its
        // turn by the cost model.
        assert_eq!(h.arrive(7, 100, 40, 4), 3);
        // Half the pool's traffic on 8 replicas with 200 in flight:
        // ⌈0.5 × 201 ÷ 37.7⌉ = 3.
        let h = hot();
        for i in 0..400 {
            h.arrive(1 + i % 100, i * 2, 200, 8);
            h.arrive(0, i * 2 + 1, 200, 8);
        }
        assert_eq!(h.arrive(0, 800, 200, 8), 3);
        assert_eq!(
            h.replication(),
            Replication {
                prefixes: 1,
                extra_copies: 2
            }
        );
    }

    #[test]
    fn even_traffic_is_not_replicated_however_busy() {
        let h = hot();
        // Eight prefixes taking turns on 8 replicas, 200 in flight: each is
        // an eighth of the load, within a replica's share with headroom.
        for i in 0..4_000u64 {
            let k = h.arrive(i % 8, i, 200, 8);
            if i > 100 {
                assert_eq!(k, 1, "arrival {i}");
            }
        }
    }

    #[test]
    fn one_hot_prefix_among_cold_ones_is_replicated_alone() {
        let h = hot();
        // Prefix 0 brings half the arrivals; 1..=50 the other half. 64 in
        // flight on 8 replicas: prefix 0 holds about 32 of them, a replica's
        // capacity is max(4, 1.5 × 8.1) ≈ 12.2, so it needs 3 copies.
        let mut k0 = 0;
        for i in 0..2_000u64 {
            let key = if i % 2 == 0 { 0 } else { 1 + i % 50 };
            let k = h.arrive(key, i * 5, 64, 8);
            if key == 0 {
                k0 = k;
            } else if i > 200 {
                assert_eq!(k, 1);
            }
        }
        assert_eq!(k0, 3);
        assert_eq!(h.replication().prefixes, 1);
    }

    #[test]
    fn copies_shrink_one_per_hold_once_demand_falls() {
        let h = hot();
        // One prefix, 20 in flight on 4 replicas: ⌈0.96 × 21 ÷ 7.9⌉ = 3.
        assert_eq!(feed(&h, 7, 200, 0, 20, 4), 3);
        // The pool goes quiet: nothing in flight. The target is 1 at once,
        // but a copy is given up only per full hold (10 s) below it.
        let mut now = 200;
        assert_eq!(h.arrive(7, now, 0, 4), 3);
        now += 9_000;
        assert_eq!(h.arrive(7, now, 0, 4), 3);
        now += 1_000;
        assert_eq!(h.arrive(7, now, 0, 4), 2);
        now += 5_000;
        assert_eq!(h.arrive(7, now, 0, 4), 2);
        now += 5_000;
        assert_eq!(h.arrive(7, now, 0, 4), 1);
        assert_eq!(h.replication(), Replication::default());
        // Demand comes back: up again at once.
        assert!(feed(&h, 7, 50, now + 1, 20, 4) >= 2);
    }

    #[test]
    fn tracking_is_bounded_and_keeps_the_hot_prefix() {
        let h = hot();
        for i in 0..3 * MAX_TRACKED as u64 {
            h.arrive(0, i, 40, 4);
            h.arrive(1_000_000 + i, i, 40, 4);
        }
        assert!(h.tracked() <= MAX_TRACKED);
        assert!(h.arrive(0, 3 * MAX_TRACKED as u64, 40, 4) >= 2);
    }

    /// `n` replicas of weight 1.
    pub(super) fn nodes(n: u64) -> Vec<Node> {
        (0..n)
            .map(|i| Node {
                name_hash: super::super::rendezvous::mix(i),
                weight: 1,
            })
            .collect()
    }

    #[test]
    fn the_shared_part_is_what_two_arrivals_have_in_common() {
        let h = hot();
        let first = h.arrive_blocks(7, &[1, 2, 3, 4], 0, 0, &nodes(2));
        assert_eq!(first.shared_blocks, 0);
        assert_eq!(
            h.arrive_blocks(7, &[1, 2, 3, 9, 9], 1, 0, &nodes(2))
                .shared_blocks,
            3
        );
        assert_eq!(
            h.arrive_blocks(7, &[1, 2], 2, 0, &nodes(2)).shared_blocks,
            2
        );
        assert_eq!(
            h.arrive_blocks(7, &[1, 2, 3], 3, 0, &nodes(2))
                .shared_blocks,
            2
        );
    }

    #[test]
    fn a_single_replica_pool_never_replicates() {
        assert_eq!(hot().arrive(7, 0, 100, 1), 1);
    }
}

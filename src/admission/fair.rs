//! Fair share among the tenants of one priority level: the Virtual Token
//! Counter (Sheng et al., "Fairness in Serving Large Language Models", OSDI
//! 2024), applied where llmlb decides, when a slot frees.
//!
//! Each tenant of a level has a counter of the service it received, in
//! tokens divided by its weight: a prompt token counts `prompt_weight`
//! (against 1 for an output token). When a slot frees, the next request of
//! the level comes from the tenant with waiters whose counter is lowest
//! (ties: the one holding fewer slots now, then the oldest waiter); within
//! a tenant, oldest first. A tenant that starts waiting has its counter
//! lifted to the lowest counter among the tenants waiting (to the last
//! counter that left the backlog when nobody waits), so time spent idle is
//! not banked as credit. A lone tenant gets every slot; the one exception to
//! work conservation is the short hold of [`anticipate()`]: a slot freed by a
//! tenant that would go first, but has nothing waiting, is kept for that
//! tenant's next request for a few milliseconds while others wait.
//!
//! llmlb charges the prompt when a request is dispatched (the estimate it
//! admitted the request with) and, when the answer ends, its output and the
//! prompt's correction as the replica's `usage` reports them (else the
//! estimate stays). VTC charges output token by token as the replica
//! produces it; a proxy sees it at the end. So the bound differs from the
//! paper's by the output still in flight: while two tenants `f` and `g`
//! both wait, `|c_f − c_g| ≤ prompt_weight × P / w + S × M / w` for the
//! smallest weight `w`, the longest prompt `P`, the longest output `M` and
//! the `S` slots of the pool ([`bound`]), and the weighted service either
//! receives over any interval in which both wait differs by at most twice
//! that.
//!
//! With fairness off (`fairness = "fifo"`) the same structure serves the
//! level oldest first.
//!
//! The counters sit behind [`ServiceCounters`]: per llmlb instance
//! ([`LocalCounters`]) until a store shared by several instances backs
//! them.
//!
//! Times are seconds (f64) from an origin the caller keeps; nothing here
//! reads a clock. Cost per pick: O(tenants of the level); per push and
//! pop: O(1) plus a hash lookup. Idle tenants' counters are forgotten when
//! more than [`MAX_IDLE`] tenants have been seen (a returning tenant is
//! lifted as a new one).

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

mod anticipate;
mod handoff;

pub use anticipate::anticipate;

/// Idle tenants (no waiter, no slot) remembered per level before they are
/// forgotten.
pub const MAX_IDLE: usize = 1024;

/// How a level orders its waiters.
#[derive(Debug, Clone, PartialEq)]
pub struct FairParams {
    /// Fair share among tenants (false: oldest first).
    pub enabled: bool,
    /// What a prompt token counts against an output token.
    pub prompt_weight: f64,
    /// Configured tenants: weight and queue bound.
    pub tenants: HashMap<String, Share>,
    /// Waiters per tenant and level for a tenant without its own bound.
    pub tenant_max_depth: usize,
    /// How long a slot freed by a tenant that would go first, with nothing
    /// waiting, is held for its next request while others wait (zero: never).
    pub anticipate: Duration,
}

impl Default for FairParams {
    fn default() -> FairParams {
        FairParams {
            enabled: true,
            prompt_weight: 0.5,
            tenants: HashMap::new(),
            tenant_max_depth: usize::MAX,
            anticipate: crate::config::DEFAULT_ANTICIPATE,
        }
    }
}

impl FairParams {
    /// The weight of `tenant` (1 when not configured).
    pub fn weight(&self, tenant: &str) -> f64 {
        self.tenants.get(tenant).map_or(1.0, |s| s.weight)
    }

    /// The waiters `tenant` may have at one level.
    pub fn max_depth(&self, tenant: &str) -> usize {
        self.tenants
            .get(tenant)
            .and_then(|s| s.max_depth)
            .unwrap_or(self.tenant_max_depth)
    }
}

/// A configured tenant's share.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Share {
    pub weight: f64,
    /// Its waiters per level (`None`: the pool's `tenant_max_depth`).
    pub max_depth: Option<usize>,
}

/// The VTC bound on two waiting tenants' counters (see the module docs):
/// `prompt_weight × max_prompt / min_weight + slots × max_output /
/// min_weight`.
pub fn bound(
    prompt_weight: f64,
    max_prompt: f64,
    max_output: f64,
    slots: usize,
    min_weight: f64,
) -> f64 {
    (prompt_weight * max_prompt + slots as f64 * max_output) / min_weight
}

/// Where a level's tenants' service counters live. [`LocalCounters`]
/// keeps them in this process; a store shared by several llmlb instances
/// can stand behind the same calls.
pub trait ServiceCounters: std::fmt::Debug + Send {
    /// The tenant's counter (0 for a tenant never charged).
    fn get(&self, tenant: &str) -> f64;
    /// Adds `tokens` (already divided by the tenant's weight).
    fn add(&mut self, tenant: &Arc<str>, tokens: f64);
    /// Raises the tenant's counter to at least `floor` (the lift of a
    /// tenant that starts waiting).
    fn raise_to(&mut self, tenant: &Arc<str>, floor: f64);
    /// Forgets the counters of the tenants `keep` refuses.
    fn retain(&mut self, keep: &dyn Fn(&str) -> bool);
}

/// Counters in this process.
#[derive(Debug, Default)]
pub struct LocalCounters(HashMap<Arc<str>, f64>);

impl ServiceCounters for LocalCounters {
    fn get(&self, tenant: &str) -> f64 {
        self.0.get(tenant).copied().unwrap_or(0.0)
    }

    fn add(&mut self, tenant: &Arc<str>, tokens: f64) {
        *self.0.entry(Arc::clone(tenant)).or_default() += tokens;
    }

    fn raise_to(&mut self, tenant: &Arc<str>, floor: f64) {
        let c = self.0.entry(Arc::clone(tenant)).or_default();
        *c = c.max(floor);
    }

    fn retain(&mut self, keep: &dyn Fn(&str) -> bool) {
        self.0.retain(|k, _| keep(k));
    }
}

/// A waiter and when it arrived.
#[derive(Debug)]
pub struct Entry<W> {
    /// Arrival order within the level.
    pub seq: u64,
    /// Arrival, seconds from the caller's origin.
    pub since: f64,
    pub item: W,
}

#[derive(Debug)]
struct Flow<W> {
    name: Arc<str>,
    weight: f64,
    /// Requests of this tenant holding a slot.
    in_service: usize,
    queue: VecDeque<Entry<W>>,
}

/// One tenant as the status page and the metrics show it.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantView {
    pub name: Arc<str>,
    pub weight: f64,
    pub waiting: usize,
    pub in_service: usize,
    /// Its counter: weighted tokens charged.
    pub service: f64,
}

/// One level's waiters, by tenant.
#[derive(Debug)]
pub struct FairLevel<W> {
    flows: Vec<Flow<W>>,
    index: HashMap<Arc<str>, usize>,
    waiting: usize,
    next_seq: u64,
    /// The counter of the last tenant that stopped waiting.
    floor: f64,
    /// Each tenant's weighted tokens charged (the virtual token counters).
    counters: Box<dyn ServiceCounters>,
    /// Slots held for a tenant's next request, and until when ([`anticipate()`]).
    holds: Vec<(Arc<str>, f64)>,
}

impl<W> Default for FairLevel<W> {
    fn default() -> Self {
        FairLevel::with_counters(Box::new(LocalCounters::default()))
    }
}

impl<W> FairLevel<W> {
    /// A level whose tenants' counters live in `counters`.
    pub fn with_counters(counters: Box<dyn ServiceCounters>) -> FairLevel<W> {
        FairLevel {
            flows: Vec::new(),
            index: HashMap::new(),
            waiting: 0,
            next_seq: 0,
            floor: 0.0,
            counters,
            holds: Vec::new(),
        }
    }

    /// Waiters of the level.
    pub fn len(&self) -> usize {
        self.waiting
    }

    pub fn is_empty(&self) -> bool {
        self.waiting == 0
    }

    /// Waiters of `tenant`.
    pub fn depth(&self, tenant: &str) -> usize {
        self.index
            .get(tenant)
            .map_or(0, |&i| self.flows[i].queue.len())
    }

    fn flow(&mut self, tenant: &Arc<str>, weight: f64) -> usize {
        if let Some(&i) = self.index.get(tenant) {
            self.flows[i].weight = weight;
            return i;
        }
        if self.flows.len() >= MAX_IDLE {
            self.forget_idle();
        }
        self.flows.push(Flow {
            name: Arc::clone(tenant),
            weight,
            in_service: 0,
            queue: VecDeque::new(),
        });
        let i = self.flows.len() - 1;
        self.index.insert(Arc::clone(tenant), i);
        i
    }

    fn forget_idle(&mut self) {
        self.flows
            .retain(|f| !f.queue.is_empty() || f.in_service > 0);
        self.index = (self.flows.iter().enumerate())
            .map(|(i, f)| (Arc::clone(&f.name), i))
            .collect();
        let index = &self.index;
        self.counters.retain(&|t| index.contains_key(t));
    }

    /// The lowest counter among the tenants waiting.
    fn lowest_waiting(&self) -> Option<f64> {
        (self.flows.iter())
            .filter(|f| !f.queue.is_empty())
            .map(|f| self.counters.get(&f.name))
            .min_by(f64::total_cmp)
    }

    /// A newcomer of `tenant` (of `weight`) arriving at `since`. A tenant
    /// that starts waiting is lifted to the lowest waiting counter.
    pub fn push(&mut self, tenant: &Arc<str>, weight: f64, since: f64, item: W) -> u64 {
        let lift = self.lowest_waiting().unwrap_or(self.floor);
        let i = self.flow(tenant, weight);
        if self.flows[i].queue.is_empty() {
            self.counters.raise_to(tenant, lift);
        }
        let flow = &mut self.flows[i];
        let seq = self.next_seq;
        self.next_seq += 1;
        flow.queue.push_back(Entry { seq, since, item });
        self.waiting += 1;
        seq
    }

    /// Puts back a waiter taken by [`FairLevel::pop`] that could not be
    /// dispatched, in its place and without a lift.
    pub fn restore(&mut self, tenant: &Arc<str>, weight: f64, entry: Entry<W>) {
        let i = self.flow(tenant, weight);
        let q = &mut self.flows[i].queue;
        let at = q.partition_point(|e| e.seq < entry.seq);
        q.insert(at, entry);
        self.waiting += 1;
    }

    /// The tenant whose waiter goes next.
    fn pick(&self, fair: bool) -> Option<usize> {
        let waiting = self
            .flows
            .iter()
            .enumerate()
            .filter(|(_, f)| !f.queue.is_empty());
        let front = |f: &Flow<W>| f.queue.front().map_or(u64::MAX, |e| e.seq);
        if !fair {
            return waiting.min_by_key(|(_, f)| front(f)).map(|(i, _)| i);
        }
        waiting
            .min_by(|(_, a), (_, b)| {
                let c = |f: &Flow<W>| self.counters.get(&f.name);
                c(a).total_cmp(&c(b))
                    .then(a.in_service.cmp(&b.in_service))
                    .then(front(a).cmp(&front(b)))
            })
            .map(|(i, _)| i)
    }

    /// Takes the waiter that goes next (fair share, or oldest first).
    pub fn pop(&mut self, fair: bool) -> Option<(Arc<str>, f64, Entry<W>)> {
        let i = self.pick(fair)?;
        self.take(i, 0)
    }

    /// Takes flow `f`'s waiter at `at` to be served: its tenant, weight and
    /// entry. A tenant left with nothing waiting sets the floor newcomers
    /// are lifted to.
    fn take(&mut self, f: usize, at: usize) -> Option<(Arc<str>, f64, Entry<W>)> {
        let flow = &mut self.flows[f];
        let entry = flow.queue.remove(at)?;
        self.waiting -= 1;
        if flow.queue.is_empty() {
            self.floor = self.counters.get(&flow.name);
        }
        Some((Arc::clone(&flow.name), flow.weight, entry))
    }

    /// The oldest waiter's arrival (aging compares levels by it).
    pub fn oldest(&self) -> Option<(f64, u64)> {
        (self.flows.iter())
            .filter_map(|f| f.queue.front().map(|e| (e.since, e.seq)))
            .min_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)))
    }

    /// Removes the first waiter `matches` accepts.
    pub fn remove(&mut self, matches: impl Fn(&W) -> bool) -> Option<Entry<W>> {
        for f in &mut self.flows {
            if let Some(at) = f.queue.iter().position(|e| matches(&e.item)) {
                self.waiting -= 1;
                return f.queue.remove(at);
            }
        }
        None
    }

    /// Waiters whose arrival `counts` accepts, each tenant's oldest first
    /// (`counts` must hold for a prefix of each tenant's waiters).
    pub fn count_prefix(&self, counts: impl Fn(f64) -> bool) -> usize {
        (self.flows.iter())
            .map(|f| f.queue.iter().take_while(|e| counts(e.since)).count())
            .sum()
    }

    /// Every waiter, each tenant's oldest first.
    pub fn iter(&self) -> impl Iterator<Item = (&Arc<str>, &Entry<W>)> {
        (self.flows.iter()).flat_map(|f| f.queue.iter().map(move |e| (&f.name, e)))
    }

    /// Waiters of the level that go before a newcomer of `tenant` (of
    /// `weight`): in arrival order all of them; under fair share its own,
    /// and of every other tenant `u` as many as `u`'s weight lets through
    /// while the newcomer's tenant is served its own waiters plus one, at
    /// most all of `u`'s.
    pub fn ahead(&self, fair: bool, tenant: &str, weight: f64) -> usize {
        if !fair {
            return self.waiting;
        }
        let own = self.depth(tenant);
        let turns = (own + 1) as f64;
        (self.flows.iter())
            .filter(|f| &*f.name != tenant)
            .map(|f| {
                let share = (turns * f.weight / weight).ceil() as usize;
                f.queue.len().min(share.saturating_sub(1))
            })
            .sum::<usize>()
            + own
    }

    /// Charges `tokens` weighted tokens to `tenant` (divided by its weight).
    pub fn charge(&mut self, tenant: &Arc<str>, weight: f64, tokens: f64) {
        let i = self.flow(tenant, weight);
        let weight = self.flows[i].weight;
        self.counters.add(tenant, tokens / weight);
    }

    /// A request of `tenant` took a slot: charged `tokens` weighted tokens.
    pub fn started(&mut self, tenant: &Arc<str>, weight: f64, tokens: f64) {
        let i = self.flow(tenant, weight);
        self.flows[i].in_service += 1;
        self.charge(tenant, weight, tokens);
    }

    /// A request of `tenant` freed its slot: charged `tokens` more (its
    /// output, and its prompt's correction; may be negative).
    pub fn ended(&mut self, tenant: &Arc<str>, weight: f64, tokens: f64) {
        let i = self.flow(tenant, weight);
        let f = &mut self.flows[i];
        f.in_service = f.in_service.saturating_sub(1);
        self.charge(tenant, weight, tokens);
    }

    /// The tenants of the level, by name.
    pub fn tenants(&self) -> Vec<TenantView> {
        let mut out: Vec<TenantView> = (self.flows.iter())
            .map(|f| TenantView {
                name: Arc::clone(&f.name),
                weight: f.weight,
                waiting: f.queue.len(),
                in_service: f.in_service,
                service: self.counters.get(&f.name),
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// Moves every waiter and counter of `other` into this level (a
    /// reload's new queue): waiters in their arrival order after this
    /// level's, counters kept (the larger one when both know a tenant).
    pub fn absorb(&mut self, mut other: FairLevel<W>) {
        let mut moved: Vec<(Arc<str>, f64, Entry<W>)> = Vec::new();
        for f in &mut other.flows {
            let i = self.flow(&f.name, f.weight);
            self.counters.raise_to(&f.name, other.counters.get(&f.name));
            self.flows[i].in_service += f.in_service;
            moved.extend(
                f.queue
                    .drain(..)
                    .map(|e| (Arc::clone(&f.name), f.weight, e)),
            );
        }
        moved.sort_by_key(|(_, _, e)| e.seq);
        for (name, weight, mut e) in moved {
            e.seq = self.next_seq;
            self.next_seq += 1;
            let i = self.flow(&name, weight);
            self.flows[i].queue.push_back(e);
            self.waiting += 1;
        }
        self.floor = self.floor.max(other.floor);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    /// Two tenants, each always waiting, one slot; each dispatch charges
    /// `prompt`, each end `output`: the sequence of tenants served.
    fn serve_backlogged(weights: [f64; 2], requests: usize) -> Vec<usize> {
        let names = [name("a"), name("b")];
        let mut level = FairLevel::default();
        for (i, n) in names.iter().enumerate() {
            for _ in 0..requests {
                level.push(n, weights[i], 0.0, i);
            }
        }
        let mut served = Vec::new();
        while let Some((n, w, e)) = level.pop(true) {
            level.started(&n, w, 50.0);
            level.ended(&n, w, 100.0);
            served.push(e.item);
        }
        served
    }

    #[test]
    fn equal_weights_alternate_and_weights_two_to_one_serve_two_to_one() {
        let served = serve_backlogged([1.0, 1.0], 50);
        assert_eq!(&served[..6], &[0, 1, 0, 1, 0, 1]);
        let served = serve_backlogged([2.0, 1.0], 300);
        // While both wait (the first 300 dispatches: a has 300), a gets
        // twice b's share.
        let a = served[..300].iter().filter(|&&t| t == 0).count() as f64;
        let b = 300.0 - a;
        assert!((a / b - 2.0).abs() / 2.0 < 0.1, "{a}:{b}");
    }

    #[test]
    fn a_newcomer_is_lifted_to_the_lowest_waiting_counter_and_banks_nothing() {
        let (heavy, light) = (name("heavy"), name("light"));
        let mut level = FairLevel::default();
        for i in 0..20 {
            level.push(&heavy, 1.0, 0.0, i);
        }
        // The heavy tenant alone for 10 dispatches: 10 × 150 tokens.
        for _ in 0..10 {
            let (n, w, _) = level.pop(true).unwrap();
            level.started(&n, w, 50.0);
            level.ended(&n, w, 100.0);
        }
        level.push(&light, 1.0, 1.0, 100);
        let views = level.tenants();
        assert_eq!(views[0].service, views[1].service, "lifted, not at 0");
        // A tie, and neither holds a slot: the oldest waiter goes, then
        // the light tenant, now the lower counter.
        let (n, w, _) = level.pop(true).unwrap();
        level.started(&n, w, 50.0);
        let (n2, _, _) = level.pop(true).unwrap();
        assert_eq!((&*n, &*n2), ("heavy", "light"));
        let mut level: FairLevel<u32> = FairLevel::default();
        level.push(&heavy, 1.0, 0.0, 0);
        level.push(&heavy, 1.0, 0.0, 1);
        let (n, w, _) = level.pop(true).unwrap();
        level.started(&n, w, 50.0);
        level.push(&light, 1.0, 1.0, 2);
        let (n, _, e) = level.pop(true).unwrap();
        assert_eq!((&*n, e.item), ("light", 2), "fewer slots held wins a tie");
    }

    #[test]
    fn fifo_serves_the_level_in_arrival_order() {
        let mut level = FairLevel::default();
        for (i, t) in ["a", "a", "b", "a", "b"].iter().enumerate() {
            level.push(&name(t), 1.0, i as f64, i);
        }
        let order: Vec<usize> =
            std::iter::from_fn(|| level.pop(false).map(|(_, _, e)| e.item)).collect();
        assert_eq!(order, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn restore_puts_a_waiter_back_in_its_place() {
        let a = name("a");
        let mut level = FairLevel::default();
        for i in 0..3 {
            level.push(&a, 1.0, i as f64, i);
        }
        let (n, w, first) = level.pop(true).unwrap();
        let (_, _, second) = level.pop(true).unwrap();
        level.restore(&n, w, second);
        level.restore(&n, w, first);
        let order: Vec<usize> =
            std::iter::from_fn(|| level.pop(true).map(|(_, _, e)| e.item)).collect();
        assert_eq!(order, vec![0, 1, 2]);
    }

    #[test]
    fn ahead_counts_what_fair_share_puts_before_a_newcomer() {
        let mut level = FairLevel::default();
        for i in 0..12 {
            level.push(&name("heavy"), 1.0, 0.0, i);
        }
        assert_eq!(level.ahead(false, "light", 1.0), 12);
        assert_eq!(level.ahead(true, "light", 1.0), 0);
        level.push(&name("light"), 1.0, 0.0, 99);
        // Its second request goes after its first and one of the heavy's.
        assert_eq!(level.ahead(true, "light", 1.0), 2);
        // Weighted 1:2, the heavy passes two for each of the light's.
        assert_eq!(level.ahead(true, "light", 0.5), 4);
        assert_eq!(level.ahead(true, "heavy", 1.0), 13);
    }

    proptest::proptest! {
        /// S slots; prompts up to P and outputs up to M; requests end in
        /// any order; tenants a (weight 1) and b (weight 2) always have
        /// waiters, c comes and goes. Whenever a and b both wait, their
        /// counters differ by at most the bound.
        #[test]
        fn the_counters_of_two_waiting_tenants_stay_within_the_bound(
            steps in proptest::collection::vec((1u64..=400, 1u64..=300, 0usize..4, proptest::bool::weighted(0.15)), 400),
        ) {
            let (slots, p, m, prompt_weight) = (4usize, 400.0, 300.0, 0.5);
            let names = [name("a"), name("b"), name("c")];
            let weights = [1.0, 2.0, 1.0];
            let limit = bound(prompt_weight, p, m, slots, 1.0);
            let mut level = FairLevel::default();
            let mut running: Vec<(usize, u64)> = Vec::new();
            for (step, &(prompt, output, end, c_arrives)) in steps.iter().enumerate() {
                for t in 0..2 {
                    while level.depth(&names[t]) < 3 {
                        level.push(&names[t], weights[t], step as f64, (t, prompt));
                    }
                }
                if c_arrives {
                    level.push(&names[2], weights[2], step as f64, (2, prompt));
                }
                while running.len() < slots {
                    let Some((n, w, e)) = level.pop(true) else {
                        break;
                    };
                    let (t, prompt) = e.item;
                    level.started(&n, w, prompt_weight * prompt as f64);
                    running.push((t, output));
                }
                let (t, output) = running.swap_remove(end % running.len());
                level.ended(&names[t], weights[t], output as f64);
                let v = level.tenants();
                let gap = (v[0].service - v[1].service).abs();
                proptest::prop_assert!(gap <= limit, "step {}: {} > {}", step, gap, limit);
            }
        }
    }
}

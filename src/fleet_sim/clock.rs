//! The virtual clock: a min-heap of timed events. Time is seconds (f64)
//! from the start of the workload; events at equal times come out in the
//! order they were pushed (a sequence number breaks ties), so a run is
//! deterministic.
//!
//! Cost: O(log n) per push and pop, no allocation once the heap has grown.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// What happens at a point in virtual time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Workload request `index` arrives at the proxy.
    Arrival(u32),
    /// Replica `replica`'s step of generation `epoch` ends (a stale epoch,
    /// left over from before a fault, is ignored).
    StepEnd { replica: u32, epoch: u32 },
    /// The proxy scrapes every replica's metrics.
    Scrape,
    /// Fault `index` of the schedule takes effect.
    Fault(u32),
    /// Request `index` gives up waiting on a replica that does not answer.
    Timeout(u32),
    /// Request `index`, waiting for a free slot, reaches its deadline.
    SlotDeadline(u32),
    /// Health checks have failed `fall` times in a row on replica `index`.
    Down(u32),
    /// Request `index` reaches its replica's engine (half the network
    /// delay after it was sent).
    Enter(u32),
    /// The proxy sees the end of request `index`'s answer (half the network
    /// delay after its last step): its in-flight guard goes.
    Release(u32),
    /// Request `index`'s prefill (attempt `attempt`) reaches its prefill
    /// replica's engine.
    PrefillEnter { index: u32, attempt: u32 },
    /// Request `index`'s prefill answer (attempt `attempt`) reaches the
    /// proxy.
    PrefillAnswer { index: u32, attempt: u32 },
    /// Request `index`'s prefill step reaches its `prefill_timeout`.
    PrefillTimeout(u32),
    /// Request `index`'s KV cache has reached its decode replica.
    Loaded(u32),
    /// A slot held for a tenant's next request is given up
    /// ([`crate::admission::fair::anticipate`]).
    HoldEnd,
    /// Simulated llmlb instance `index` renews its slot leases with the
    /// fleet store; the next renewal follows one refresh later.
    Renew(u32),
    /// Instance `index` renews at once: a request started waiting for a
    /// slot there.
    Nudge(u32),
    /// The instances read each other's dispatch records from the store.
    Records,
}

#[derive(Debug)]
struct Entry {
    at: f64,
    seq: u64,
    event: Event,
}

impl PartialEq for Entry {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Entry {}

impl PartialOrd for Entry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Entry {
    /// Reversed: `BinaryHeap` is a max-heap and the earliest event goes first.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .at
            .total_cmp(&self.at)
            .then_with(|| other.seq.cmp(&self.seq))
    }
}

/// Pending events in time order.
#[derive(Debug, Default)]
pub struct EventQueue {
    heap: BinaryHeap<Entry>,
    seq: u64,
    now: f64,
    popped: u64,
}

impl EventQueue {
    pub fn new() -> EventQueue {
        EventQueue::default()
    }

    /// Schedules `event` at `at` (clamped to now: nothing happens in the past).
    pub fn push(&mut self, at: f64, event: Event) {
        let at = if at.is_finite() {
            at.max(self.now)
        } else {
            self.now
        };
        self.seq += 1;
        self.heap.push(Entry {
            at,
            seq: self.seq,
            event,
        });
    }

    /// The next event, advancing the clock to its time.
    pub fn pop(&mut self) -> Option<(f64, Event)> {
        let e = self.heap.pop()?;
        self.now = e.at;
        self.popped += 1;
        Some((e.at, e.event))
    }

    /// The time of the last event popped.
    pub fn now(&self) -> f64 {
        self.now
    }

    /// Events handled so far.
    pub fn handled(&self) -> u64 {
        self.popped
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }
}

/// Virtual seconds as the millisecond timestamps llmlb's code compares
/// (never 0, like `telemetry::clock::now_millis`).
pub fn millis(t: f64) -> u64 {
    (t.max(0.0) * 1000.0) as u64 + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_first_and_ties_in_push_order() {
        let mut q = EventQueue::new();
        q.push(2.0, Event::Scrape);
        q.push(1.0, Event::Arrival(0));
        q.push(1.0, Event::Arrival(1));
        q.push(0.5, Event::Fault(0));
        let order: Vec<(f64, Event)> = std::iter::from_fn(|| q.pop()).collect();
        assert_eq!(
            order,
            vec![
                (0.5, Event::Fault(0)),
                (1.0, Event::Arrival(0)),
                (1.0, Event::Arrival(1)),
                (2.0, Event::Scrape)
            ]
        );
        assert_eq!(q.handled(), 4);
        assert_eq!(q.now(), 2.0);
    }

    #[test]
    fn nothing_is_scheduled_in_the_past() {
        let mut q = EventQueue::new();
        q.push(5.0, Event::Scrape);
        q.pop();
        q.push(1.0, Event::Arrival(3));
        q.push(f64::NAN, Event::Arrival(4));
        assert_eq!(q.pop(), Some((5.0, Event::Arrival(3))));
        assert_eq!(q.pop(), Some((5.0, Event::Arrival(4))));
        assert!(q.is_empty());
        assert_eq!(millis(0.0), 1);
        assert_eq!(millis(1.5), 1501);
    }
}

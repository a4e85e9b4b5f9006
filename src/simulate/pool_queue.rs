//! The pool queue on the virtual clock, for pools whose replicas have a
//! `max_inflight`: what `serve`'s queue and forwarder do together, for the
//! single priority level simulated requests have (the pool's lowest, as for
//! a caller without a tier).
//!
//! A request the fleet cannot start at once (every replica it may use at
//! its limit) waits in FIFO order and is sent when a slot frees; it is
//! refused with 429 when the level's queue is full (`queue.max_depth`) or
//! when its estimated wait (its position ÷ the drain rate, `capacity ÷ mean
//! service time` of requests a replica answered) exceeds the level's
//! `max_wait`; it gets 503 when it waited `queue.timeout`. The service time
//! is the same weighted mean the real queue keeps, measured on the virtual
//! clock from dispatch to the last token.
//!
//! Not modelled: several priority levels and their aging (simulated
//! requests carry no tier), and the queue's capacity counting replicas a
//! canary split excludes (the forwarder's wait, which this is, does not).

use crate::admission::service_mean;
use crate::routing::Pool;

/// The queue settings of one pool, and the service time learned so far.
#[derive(Debug, Clone)]
pub struct QueueModel {
    max_depth: usize,
    /// Seconds.
    max_wait: f64,
    /// Seconds a request may wait before 503.
    pub timeout: f64,
    service_mean: Option<f64>,
}

impl QueueModel {
    /// The model of `pool`'s queue, when it has one.
    pub fn of(pool: &Pool) -> Option<QueueModel> {
        let admission = pool.admission.as_ref()?;
        let level = admission.queue.levels().last()?;
        Some(QueueModel {
            max_depth: admission.queue.max_depth(),
            max_wait: level.max_wait.as_secs_f64(),
            timeout: admission.timeout.as_secs_f64(),
            service_mean: None,
        })
    }

    /// Whether a newcomer that must wait behind `waiting` others, with
    /// `capacity` slots in the fleet, is refused (429).
    pub fn refuses(&self, waiting: usize, capacity: usize) -> bool {
        if waiting >= self.max_depth {
            return true;
        }
        match self.service_mean {
            Some(mean) if mean > 0.0 && capacity > 0 => {
                (waiting + 1) as f64 * mean / capacity as f64 > self.max_wait
            }
            _ => false,
        }
    }

    /// A request a replica answered held its slot `held` seconds.
    pub fn served(&mut self, held: f64) {
        self.service_mean = Some(service_mean(self.service_mean, held));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model(depth: usize, max_wait: f64) -> QueueModel {
        QueueModel {
            max_depth: depth,
            max_wait,
            timeout: 30.0,
            service_mean: None,
        }
    }

    #[test]
    fn a_full_level_refuses() {
        let q = model(2, 10.0);
        assert!(!q.refuses(1, 4));
        assert!(q.refuses(2, 4));
    }

    #[test]
    fn the_estimated_wait_refuses_once_a_rate_is_known() {
        let mut q = model(100, 10.0);
        // No served request yet: only the depth bound applies.
        assert!(!q.refuses(50, 1));
        q.served(2.0);
        // 2 s per request on 2 slots: position 10 waits 10 s, 11 waits 11 s.
        assert!(!q.refuses(9, 2));
        assert!(q.refuses(10, 2));
        q.served(4.0);
        assert!((q.service_mean.unwrap() - 2.4).abs() < 1e-9);
    }
}

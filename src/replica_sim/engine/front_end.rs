//! The API server's per-request work (`api_per_request`) as a queue that
//! shares the engine's CPU, for replicas whose front end and engine take
//! turns on the same cores (vLLM's CPU backend on a small machine).
//!
//! A request that arrives while the engine is busy (something running, or
//! other requests still in the front end) first needs `api_per_request`
//! seconds of front-end work (parsing, tokenizing) before the engine's
//! scheduler sees it; one that meets an idle engine goes straight to the
//! scheduler (the simulator's own HTTP path already took that time). The
//! front end works first in, first out:
//!
//! ```text
//! during a step of engine time t > 0:  front-end time f = min(backlog, t)
//!                                      step lasts t + f   (equal turns)
//! with nothing to schedule:            f = the oldest request's remainder
//!                                      step lasts f       (the core is free)
//! ```
//!
//! A request whose work is done joins the scheduler's queue at the end of
//! the step that finished it. So the cost is spread over the steps that run
//! while the backlog lasts (every running request's inter-token time grows a
//! little) rather than charged whole to the step that admits the newcomer.
//!
//! Cost: O(requests finished) per step.

use std::collections::VecDeque;

/// Requests still in the front end, oldest first, with the seconds of work
/// each has left.
#[derive(Debug, Default)]
pub(super) struct FrontEnd {
    queue: VecDeque<(u64, f64)>,
}

impl FrontEnd {
    pub fn push(&mut self, id: u64, work: f64) {
        self.queue.push_back((id, work));
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub fn remove(&mut self, id: u64) -> bool {
        let before = self.queue.len();
        self.queue.retain(|&(r, _)| r != id);
        self.queue.len() != before
    }

    /// Works through the queue beside `engine_time` seconds of engine work
    /// (see the module docs); returns the front-end seconds spent and the
    /// requests finished, oldest first.
    pub fn work(&mut self, engine_time: f64) -> (f64, Vec<u64>) {
        let mut budget = if engine_time > 0.0 {
            engine_time
        } else {
            self.queue.front().map_or(0.0, |&(_, w)| w)
        };
        let mut spent = 0.0;
        let mut done = Vec::new();
        while let Some((id, left)) = self.queue.front_mut() {
            if budget <= 0.0 {
                break;
            }
            let t = left.min(budget);
            *left -= t;
            budget -= t;
            spent += t;
            // Float residue below a nanosecond counts as done.
            if *left <= 1e-12 {
                done.push(*id);
                self.queue.pop_front();
            }
        }
        (spent, done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_each_step_equally_and_finishes_in_order() {
        let mut f = FrontEnd::default();
        f.push(1, 0.003);
        f.push(2, 0.003);
        // A 2 ms engine step: 2 ms of front-end work beside it.
        let (spent, done) = f.work(0.002);
        assert!((spent - 0.002).abs() < 1e-12);
        assert!(done.is_empty());
        let (spent, done) = f.work(0.002);
        assert!((spent - 0.002).abs() < 1e-12);
        assert_eq!(done, vec![1]);
        // Less backlog than engine time: only the backlog is spent.
        let (spent, done) = f.work(0.010);
        assert!((spent - 0.002).abs() < 1e-12);
        assert_eq!(done, vec![2]);
        assert!(f.is_empty());
    }

    #[test]
    fn an_idle_engine_leaves_the_core_to_the_oldest_request() {
        let mut f = FrontEnd::default();
        f.push(7, 0.0025);
        f.push(8, 0.0025);
        let (spent, done) = f.work(0.0);
        assert!((spent - 0.0025).abs() < 1e-12);
        assert_eq!(done, vec![7]);
        assert!(f.remove(8));
        assert!(!f.remove(8));
        assert_eq!(f.work(0.0), (0.0, vec![]));
    }
}

//! The API server's per-request work (`api_per_request`): a first-in,
//! first-out server of its own, running beside the engine.
//!
//! vLLM's API server (HTTP, request validation, tokenizing) is a process of
//! its own, separate from the engine core and its model worker; on a GPU
//! replica it runs on host cores while the GPU steps, and on the CPU backend
//! only the model worker is bound to the cores it computes on, so the API
//! server runs on another core beside the steps. Every request, whether or
//! not the engine is busy, is worked on by it for `api_per_request` seconds,
//! one request after another in arrival order, before the scheduler sees it:
//!
//! ```text
//! arrives at t:   done = max(t, when the API server is free) + api_per_request
//! joins the scheduler's queue at the first step that starts at or after done
//! ```
//!
//! So a burst of `k` requests reaches the engine over `k × api_per_request`
//! seconds (the last one's time to first token holds the whole burst), and
//! the API server bounds a replica's request rate at `1 / api_per_request`,
//! but its work does not lengthen the steps of requests already running.
//! When the engine has nothing to run and a request is still in the API
//! server, the engine waits for it (a step of no work that ends when the
//! request is done).
//!
//! Cost: O(1) per request.

use std::collections::VecDeque;

/// Requests still in the API server, oldest first, with the time each is
/// done.
#[derive(Debug, Default)]
pub(super) struct FrontEnd {
    queue: VecDeque<(u64, f64)>,
    /// When the API server finishes the last request it holds.
    free_at: f64,
}

impl FrontEnd {
    /// Queues `work` seconds for request `id`, arrived at `now`.
    pub fn push(&mut self, id: u64, now: f64, work: f64) {
        let done = self.free_at.max(now) + work;
        self.free_at = done;
        self.queue.push_back((id, done));
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Drops `id` (an aborted request). The time already planned for the
    /// requests behind it stays: the API server had taken it up.
    pub fn remove(&mut self, id: u64) -> bool {
        let before = self.queue.len();
        self.queue.retain(|&(r, _)| r != id);
        self.queue.len() != before
    }

    /// The requests done by `now`, oldest first.
    pub fn ready(&mut self, now: f64) -> Vec<u64> {
        let mut done = Vec::new();
        // Float residue below a nanosecond counts as done.
        while let Some(&(id, at)) = self.queue.front() {
            if at > now + 1e-9 {
                break;
            }
            done.push(id);
            self.queue.pop_front();
        }
        done
    }

    /// When the oldest request still in the API server is done.
    pub fn next_done(&self) -> Option<f64> {
        self.queue.front().map(|&(_, at)| at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_served_one_after_another_in_arrival_order() {
        let mut f = FrontEnd::default();
        f.push(1, 0.0, 0.003);
        f.push(2, 0.001, 0.003);
        // The second waits for the first: done at 6 ms, not 4.
        assert_eq!(f.next_done(), Some(0.003));
        assert!(f.ready(0.002).is_empty());
        assert_eq!(f.ready(0.003), vec![1]);
        assert!(f.ready(0.005).is_empty());
        assert_eq!(f.ready(0.006), vec![2]);
        assert!(f.is_empty());
        // An idle API server starts on a newcomer at once.
        f.push(3, 1.0, 0.003);
        assert_eq!(f.next_done(), Some(1.003));
    }

    #[test]
    fn an_aborted_request_leaves_the_queue() {
        let mut f = FrontEnd::default();
        f.push(7, 0.0, 0.0025);
        f.push(8, 0.0, 0.0025);
        assert!(f.remove(7));
        assert!(!f.remove(7));
        assert_eq!(f.ready(1.0), vec![8]);
        assert_eq!(f.next_done(), None);
    }
}

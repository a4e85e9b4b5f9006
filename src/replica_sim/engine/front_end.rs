//! The API server's work (`api_per_request` for every request it takes in,
//! `api_per_output_token` for every token it streams out): a first-in,
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
//! The same server streams the tokens out: vLLM's API server is one
//! process with one event loop, whose output handler takes each step's
//! outputs from the engine core (detokenizing them, framing the SSE chunks)
//! between its other tasks, parsing and tokenizing new requests among them
//! (`vllm/v1/engine/async_llm.py`, `output_handler`). A step that samples
//! `n` tokens hands the API server `n × api_per_output_token` of work when
//! it ends, behind the work it took up before, and its tokens reach the
//! clients when that is done; a request arriving later waits behind it:
//!
//! ```text
//! step ends at e with n tokens:  streamed = max(free, e) + n × api_per_output_token
//! ```
//!
//! So while a burst of newcomers is being taken in, the tokens of the
//! requests already running reach their clients together once the burst is
//! through (the first tokens of a burst come in a clump, as they do from
//! vLLM), and under many streams a newcomer reaches the scheduler later;
//! the steps themselves (the engine core) are not lengthened.
//!
//! Cost: O(1) per request and per step.

use std::collections::VecDeque;

/// Requests still in the API server, oldest first, with the time each is
/// done.
#[derive(Debug, Default)]
pub(super) struct FrontEnd {
    queue: VecDeque<(u64, f64)>,
    /// When the API server finishes the last work it has taken up.
    free_at: f64,
}

impl FrontEnd {
    /// Queues `work` seconds for request `id`, arrived at `now`.
    pub fn push(&mut self, id: u64, now: f64, work: f64) {
        let done = self.free_at.max(now) + work;
        self.free_at = done;
        self.queue.push_back((id, done));
    }

    /// Hands the API server a step's outputs at `at` (the step's end),
    /// `work` seconds of streaming, after the work it took up before; returns
    /// when they are streamed to the clients.
    pub fn stream_out(&mut self, at: f64, work: f64) -> f64 {
        let done = self.free_at.max(at) + work;
        self.free_at = done;
        done
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
    fn outputs_and_newcomers_take_turns_in_arrival_order() {
        let mut f = FrontEnd::default();
        // Three requests arrive together at 0, 3 ms of work each.
        for id in 1..=3 {
            f.push(id, 0.0, 0.003);
        }
        // A step ending at 4 ms hands over 16 tokens of 0.2 ms: they are
        // streamed once the three requests are taken in (9 ms), at 12.2 ms.
        let streamed = f.stream_out(0.004, 16.0 * 0.0002);
        assert!((streamed - 0.0122).abs() < 1e-12, "{streamed}");
        // A request arriving at 10 ms waits behind that streaming.
        f.push(4, 0.010, 0.003);
        assert_eq!(f.ready(0.009), vec![1, 2, 3]);
        assert!((f.next_done().unwrap() - 0.0152).abs() < 1e-12);
        // An idle API server streams a step's outputs at once.
        let mut g = FrontEnd::default();
        assert_eq!(g.stream_out(1.0, 0.0), 1.0);
        assert!((g.stream_out(2.0, 0.001) - 2.001).abs() < 1e-12);
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

//! Drives a run: hands out conversations on the arrival schedule, keeps the
//! request budget and the deadline, and collects the records.
//!
//! - Open loop (and trace timestamps): one dispatcher sleeps until each
//!   arrival and spawns the conversation; at most `max_in_flight` run at
//!   once, later arrivals wait for a slot (so a slow server delays the
//!   schedule rather than piling up unbounded work).
//! - Closed loop: `concurrency` clients each take the next conversation when
//!   their last one finished.
//!
//! Every request takes one unit of the budget before it is sent (a chat turn
//! is one request), so a run never sends more than its count. No request
//! starts after the deadline; those in flight may finish within their
//! timeout. A failed chat turn ends its session (the next turn would build
//! on an answer that never came).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, sleep_until};

use super::arrivals::{Arrivals, GapSampler};
use super::client::BenchClient;
use super::progress::Counters;
use super::record::RequestRecord;
use super::workload::{Conversation, Workload};

pub struct Shared {
    pub client: BenchClient,
    pub start: Instant,
    pub deadline: Instant,
    pub budget: u64,
    pub counters: Arc<Counters>,
    taken: AtomicU64,
    records: Mutex<Vec<RequestRecord>>,
}

impl Shared {
    pub fn new(
        client: BenchClient,
        start: Instant,
        deadline: Instant,
        budget: u64,
        counters: Arc<Counters>,
    ) -> Self {
        Shared {
            client,
            start,
            deadline,
            budget,
            counters,
            taken: AtomicU64::new(0),
            records: Mutex::new(Vec::new()),
        }
    }

    /// Takes one request from the budget, if any is left and time remains.
    fn take(&self) -> bool {
        Instant::now() < self.deadline
            && self
                .taken
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| {
                    (t < self.budget).then_some(t + 1)
                })
                .is_ok()
    }

    fn give_back(&self) {
        self.taken.fetch_sub(1, Ordering::Relaxed);
    }

    fn exhausted(&self) -> bool {
        self.taken.load(Ordering::Relaxed) >= self.budget || Instant::now() >= self.deadline
    }

    /// The records collected so far (all of them once the loop returned).
    pub fn take_records(&self) -> Vec<RequestRecord> {
        std::mem::take(&mut *self.records.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Sends the turns of `conv` in order; the first turn's budget unit has
    /// already been taken.
    async fn conversation(&self, conv: Conversation) {
        for (i, turn) in conv.turns.iter().enumerate() {
            if i > 0 {
                if !conv.think_time.is_zero() {
                    sleep(conv.think_time).await;
                }
                if !self.take() {
                    return;
                }
            }
            self.counters.sent.fetch_add(1, Ordering::Relaxed);
            let rec = self.client.send(turn, self.start).await;
            let ok = rec.outcome.is_ok();
            if !ok {
                self.counters.failed.fetch_add(1, Ordering::Relaxed);
            }
            self.counters.finished.fetch_add(1, Ordering::Relaxed);
            self.records
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(rec);
            if !ok {
                return;
            }
        }
    }
}

/// Runs an open loop (Gamma gaps) or replays the workload's timestamps.
pub async fn open_loop(
    shared: Arc<Shared>,
    mut workload: Box<dyn Workload>,
    arrivals: &Arrivals,
    max_in_flight: usize,
    seed: u64,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(max_in_flight));
    let mut gaps = match arrivals {
        Arrivals::Open { rate, burstiness } => Some(GapSampler::new(*rate, *burstiness, seed)),
        _ => None,
    };
    let mut next_at = shared.start;
    let mut tasks = JoinSet::new();
    while !shared.exhausted() {
        let Some(conv) = workload.next_conversation() else {
            break;
        };
        let at = match gaps.as_mut() {
            Some(g) => {
                let at = next_at;
                next_at += g.next_gap();
                at
            }
            None => shared.start + conv.at.unwrap_or_default(),
        };
        if at >= shared.deadline {
            break;
        }
        sleep_until(at).await;
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        if !shared.take() {
            break;
        }
        let s = shared.clone();
        tasks.spawn(async move {
            s.conversation(conv).await;
            drop(slot);
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

/// Runs `concurrency` clients in a closed loop.
pub async fn closed_loop(shared: Arc<Shared>, workload: Box<dyn Workload>, concurrency: usize) {
    let workload = Arc::new(Mutex::new(workload));
    let mut tasks = JoinSet::new();
    for _ in 0..concurrency {
        let (s, w) = (shared.clone(), workload.clone());
        tasks.spawn(async move {
            while s.take() {
                let next = w
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .next_conversation();
                let Some(conv) = next else {
                    s.give_back();
                    return;
                };
                s.conversation(conv).await;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

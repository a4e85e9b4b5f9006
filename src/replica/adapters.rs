//! Which LoRA adapters a replica is running, for adapter-aware placement.
//!
//! vLLM keeps at most `--max-loras` adapters active at once, and its
//! scheduler only starts a waiting request whose adapter is among those of
//! the running requests, or when fewer than `max_loras` adapters run: a
//! request for another adapter waits until every running request of the
//! adapters in the way has finished, and requests of those adapters that
//! arrive meanwhile start before it (the scheduler skips the waiting one).
//! What makes a request wait is the adapters with requests *running* there,
//! not which adapter was loaded last: on an idle replica a new adapter only
//! has to be loaded.
//!
//! [`Adapters`] keeps, per replica:
//! - llmlb's own requests in flight per adapter (exact and immediate:
//!   counted from dispatch until the request's [`super::InFlightGuard`]
//!   drops, see [`super::InFlightGuard::run_adapter`]), in the order the
//!   adapters became busy there: the first `max_lora` of them hold the
//!   slots, the later ones wait for those to drain (as the scheduler
//!   admits them);
//! - the last scraped `vllm:lora_requests_info` (`running_lora_adapters`,
//!   `max_lora`; read by `signals::lora`), for requests other clients run.
//!   A scraped adapter no longer counts once llmlb's own requests of it
//!   there have all ended after that scrape (the scrape showed those);
//!   `waiting_lora_adapters` never count as loaded: they are waiting for a
//!   slot;
//! - the adapters most recently started there: with nothing running, the
//!   newest `max_lora` of them are still loaded.
//!
//! [`Adapters::placement`] says whether a request for an adapter runs at
//! once there ([`Placement::Loaded`]), needs only a load
//! ([`Placement::FreeSlot`]), runs at once but keeps another adapter's
//! requests waiting longer ([`Placement::Draining`]), or waits for other
//! adapters' requests to drain ([`Placement::Swap`]). Cost: one mutex per
//! replica held for a few string comparisons.

use std::sync::Mutex;

/// One reading of `vllm:lora_requests_info`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoraInfo {
    pub max_lora: Option<u32>,
    pub running: Vec<String>,
    pub waiting: Vec<String>,
}

/// Where a request for an adapter stands on one replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// The adapter is running or still loaded there: it starts at once.
    Loaded,
    /// Not loaded, but a slot is free (fewer adapters run than
    /// `max_lora`): it is loaded without waiting for other requests.
    FreeSlot,
    /// The adapter holds a slot, but another adapter's requests wait there
    /// for it to drain: this request starts at once and they wait longer.
    Draining,
    /// Every slot is taken by other adapters' running requests: it waits
    /// until they drain.
    Swap,
}

/// A replica's adapters.
#[derive(Debug, Default)]
pub struct Adapters {
    inner: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    scraped: Option<LoraInfo>,
    /// Sequence number of the last scrape (see `seq`).
    scraped_seq: u64,
    /// llmlb's requests in flight per adapter (entries kept at zero).
    running: Vec<Run>,
    /// Adapters by when they last started there, newest last.
    recent: Vec<String>,
    /// Orders scrapes and request ends without a clock.
    seq: u64,
}

#[derive(Debug)]
struct Run {
    adapter: String,
    count: u32,
    /// `seq` when llmlb's last request of it there ended.
    ended: u64,
    /// `seq` when its count last rose from zero: the busy adapters hold
    /// the slots in this order.
    since: u64,
}

impl Adapters {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores a scrape's reading; `None`: the replica exports none.
    pub fn observe(&self, info: Option<LoraInfo>) {
        let mut s = self.lock();
        s.seq += 1;
        s.scraped_seq = s.seq;
        if let Some(i) = &info {
            for a in &i.running {
                s.touch(a);
            }
        }
        s.scraped = info;
    }

    /// Whether a scrape has shown the replica's adapter state.
    pub fn known(&self) -> bool {
        self.lock().scraped.is_some()
    }

    /// Where a request for `adapter` stands now.
    pub fn placement(&self, adapter: &str) -> Placement {
        self.lock().placement(adapter)
    }

    /// A request for `adapter` is being sent there: where it stood. Its
    /// run is counted by [`super::InFlightGuard::run_adapter`].
    pub fn sent(&self, adapter: &str) -> Placement {
        let mut s = self.lock();
        let placement = s.placement(adapter);
        s.touch(adapter);
        placement
    }

    /// One more of llmlb's requests for `adapter` runs there.
    pub(super) fn start(&self, adapter: &str) {
        let mut s = self.lock();
        s.touch(adapter);
        s.seq += 1;
        let seq = s.seq;
        match s.running.iter_mut().find(|r| r.adapter == adapter) {
            Some(r) => {
                if r.count == 0 {
                    r.since = seq;
                }
                r.count += 1;
            }
            None => s.running.push(Run {
                adapter: adapter.to_string(),
                count: 1,
                ended: 0,
                since: seq,
            }),
        }
    }

    /// One of llmlb's requests for `adapter` there ended.
    pub(super) fn end(&self, adapter: &str) {
        let mut s = self.lock();
        s.seq += 1;
        let seq = s.seq;
        if let Some(r) = s.running.iter_mut().find(|r| r.adapter == adapter) {
            r.count = r.count.saturating_sub(1);
            r.ended = seq;
        }
    }
}

impl State {
    fn max_lora(&self) -> usize {
        self.scraped.as_ref().and_then(|i| i.max_lora).unwrap_or(1) as usize
    }

    fn touch(&mut self, adapter: &str) {
        self.recent.retain(|a| a != adapter);
        self.recent.push(adapter.to_string());
        // Only the newest few can still be loaded.
        let keep = self.max_lora().max(1) * 4;
        if self.recent.len() > keep {
            self.recent.drain(..self.recent.len() - keep);
        }
    }

    /// The distinct adapters with requests there, in the order they hold
    /// the slots: the scraped running ones not explained by llmlb's
    /// requests that have ended (they run now), then llmlb's own by when
    /// they became busy there.
    fn busy(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        let scraped = self.scraped.iter().flat_map(|i| &i.running);
        for a in scraped {
            let ended_since = self
                .running
                .iter()
                .any(|r| r.adapter == *a && r.ended > self.scraped_seq);
            if !ended_since && !out.contains(&a.as_str()) {
                out.push(a);
            }
        }
        let mut own: Vec<&Run> = self.running.iter().filter(|r| r.count > 0).collect();
        own.sort_by_key(|r| r.since);
        for r in own {
            if !out.contains(&r.adapter.as_str()) {
                out.push(&r.adapter);
            }
        }
        out
    }

    fn placement(&self, adapter: &str) -> Placement {
        let busy = self.busy();
        let max = self.max_lora();
        if let Some(i) = busy.iter().position(|a| *a == adapter) {
            return match i {
                // Holds a slot; others wait behind it when there are more.
                i if i < max && busy.len() > max => Placement::Draining,
                i if i < max => Placement::Loaded,
                // Itself waiting for a slot: another request of it waits too.
                _ => Placement::Swap,
            };
        }
        if busy.len() >= max {
            return Placement::Swap;
        }
        // A free slot; the adapter may still be loaded from before.
        let resident = self.recent.iter().rev().take(max);
        if resident.into_iter().any(|a| a == adapter) {
            Placement::Loaded
        } else {
            Placement::FreeSlot
        }
    }
}

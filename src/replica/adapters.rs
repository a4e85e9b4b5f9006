//! Which LoRA adapters a replica has loaded, for adapter-aware placement.
//!
//! vLLM keeps at most `--max-loras` adapters on the GPU at once; a request
//! for an adapter a replica does not hold waits until one is swapped out.
//! Its `vllm:lora_requests_info` gauge names the adapters of the running and
//! waiting requests (`running_lora_adapters`, `waiting_lora_adapters`,
//! comma-separated) and `max_lora`; vLLM keeps one series per label set it
//! has seen, valued by when it was last set, so the newest one is the
//! current state (read by `signals::lora`).
//!
//! [`Adapters`] keeps, per replica, the last scraped state and the adapters
//! llmlb sent it since (for [`SENT_HOLD_MS`]): an adapter counts as loaded
//! there when either names it. [`Adapters::placement`] says whether a
//! request for an adapter would find it loaded, find a free adapter slot,
//! or cause a swap. Cost: one mutex per replica held for a few string
//! comparisons.

use std::sync::Mutex;

/// How long an adapter llmlb sent a replica counts as loaded there without
/// a scrape saying so: about a request's life on a loaded replica.
pub const SENT_HOLD_MS: u64 = 2_000;

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
    /// The adapter is loaded there.
    Loaded,
    /// Not loaded, but an adapter slot is free.
    FreeSlot,
    /// Every slot holds another adapter: one must be swapped out.
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
    /// Adapters sent since, with when they stop counting (ms).
    sent: Vec<(String, u64)>,
}

impl Adapters {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stores a scrape's reading; `None`: the replica exports none.
    pub fn observe(&self, info: Option<LoraInfo>) {
        self.lock().scraped = info;
    }

    /// Whether a scrape has shown the replica's adapter state.
    pub fn known(&self) -> bool {
        self.lock().scraped.is_some()
    }

    /// Where a request for `adapter` stands at `now_ms`.
    pub fn placement(&self, adapter: &str, now_ms: u64) -> Placement {
        let s = self.lock();
        let active = s.active(now_ms);
        if active.contains(&adapter) {
            return Placement::Loaded;
        }
        let max = s.scraped.as_ref().and_then(|i| i.max_lora).unwrap_or(1) as usize;
        if active.len() < max {
            Placement::FreeSlot
        } else {
            Placement::Swap
        }
    }

    /// A request for `adapter` was sent at `now_ms`; where it stood.
    pub fn sent(&self, adapter: &str, now_ms: u64) -> Placement {
        let placement = self.placement(adapter, now_ms);
        let mut s = self.lock();
        s.sent.retain(|(a, until)| *until > now_ms && a != adapter);
        s.sent.push((adapter.to_string(), now_ms + SENT_HOLD_MS));
        placement
    }
}

impl State {
    /// The distinct adapters counted as loaded at `now_ms`.
    fn active(&self, now_ms: u64) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        let scraped = self
            .scraped
            .iter()
            .flat_map(|i| i.running.iter().chain(&i.waiting));
        let sent = self
            .sent
            .iter()
            .filter(|(_, until)| *until > now_ms)
            .map(|(a, _)| a);
        for a in scraped.chain(sent) {
            if !out.contains(&a.as_str()) {
                out.push(a);
            }
        }
        out
    }
}

//! Per-pool circuit breaker: at most `max_pending` requests of a pool are
//! queued or being forwarded at once; the next one is refused at once with
//! 503 `pool_overloaded` instead of piling up behind a fleet that cannot keep
//! up. A request counts from the moment its pool is known until its response
//! body ends (or the client goes away).
//!
//! Each pool's gate is an `Arc` of two atomics found by pool name in an
//! `ArcSwap` map; a reload keeps the gate (and its count) of a pool that
//! stays and only updates the limit.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use arc_swap::ArcSwap;

use crate::config::Config;
use crate::pool::NameMap;

#[derive(Debug, Default)]
pub struct Gate {
    /// 0: no limit.
    limit: AtomicU32,
    pending: AtomicU64,
}

impl Gate {
    /// Counts one request until the guard is dropped, or says no when the
    /// pool is at its limit (returning the limit).
    pub fn try_enter(self: &Arc<Self>) -> Result<PendingGuard, u32> {
        let limit = self.limit.load(Ordering::Relaxed);
        let before = self.pending.fetch_add(1, Ordering::AcqRel);
        if limit != 0 && before >= u64::from(limit) {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            return Err(limit);
        }
        Ok(PendingGuard(Arc::clone(self)))
    }

    pub fn pending(&self) -> u64 {
        self.pending.load(Ordering::Relaxed)
    }
}

#[derive(Debug)]
pub struct PendingGuard(Arc<Gate>);

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.0.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Every pool's gate, by pool name.
#[derive(Debug, Default)]
pub struct Gates(ArcSwap<NameMap<Arc<Gate>>>);

impl Gates {
    pub fn build(config: &Config) -> Gates {
        let gates = Gates::default();
        gates.update(config);
        gates
    }

    /// Applies a (new) config: pools that stay keep their gate and count.
    pub fn update(&self, config: &Config) {
        let old = self.0.load();
        let map = config
            .pools
            .iter()
            .map(|p| {
                let gate = old.get(&p.name).cloned().unwrap_or_default();
                gate.limit.store(p.max_pending, Ordering::Relaxed);
                (p.name.clone(), gate)
            })
            .collect();
        self.0.store(Arc::new(map));
    }

    pub fn get(&self, pool: &str) -> Option<Arc<Gate>> {
        self.0.load().get(pool).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(limit: u32) -> Config {
        let mut c = crate::config::parse(
            "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n[[pools.replicas]]\nurl = \"http://127.0.0.1:1\"\n",
        )
        .unwrap();
        c.pools[0].max_pending = limit;
        c
    }

    #[test]
    fn refuses_beyond_the_limit_and_frees_on_drop() {
        let gates = Gates::build(&config(2));
        let g = gates.get("p").unwrap();
        let a = g.try_enter().unwrap();
        let _b = g.try_enter().unwrap();
        assert_eq!(g.try_enter().unwrap_err(), 2);
        assert_eq!(g.pending(), 2);
        drop(a);
        assert!(g.try_enter().is_ok());
    }

    #[test]
    fn zero_means_no_limit() {
        let gates = Gates::build(&config(0));
        let g = gates.get("p").unwrap();
        let held: Vec<_> = (0..100).map(|_| g.try_enter().unwrap()).collect();
        assert_eq!(g.pending(), 100);
        drop(held);
        assert_eq!(g.pending(), 0);
    }

    #[test]
    fn reload_keeps_the_count_and_updates_the_limit() {
        let gates = Gates::build(&config(1));
        let held = gates.get("p").unwrap().try_enter().unwrap();
        gates.update(&config(2));
        let g = gates.get("p").unwrap();
        assert_eq!(g.pending(), 1);
        let _second = g.try_enter().unwrap();
        assert!(g.try_enter().is_err());
        drop(held);
    }
}

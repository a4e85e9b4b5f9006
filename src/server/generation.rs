//! One generation of the running configuration: the config, the topology
//! built from it and the gateway (keys, tiers, rate limits) built from it,
//! swapped together.
//!
//! A request loads the generation once and reads all three from it, so a
//! reload between two reads can never pair a new gateway (tiers, keys) with
//! an old topology (pools, replicas). Writers (a config reload, a discovery
//! change) build the next generation from the current one and store it in
//! one step, one writer at a time: a discovery rebuild racing a reload cannot
//! put back the old config.
//!
//! Cost: one `ArcSwap` load per request; a store per reload.

use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;

use crate::config::Config;
use crate::gateway::Gateway;
use crate::pool::Topology;

/// What a request reads: one consistent triple.
#[derive(Debug)]
pub struct Generation {
    pub config: Arc<Config>,
    pub topology: Arc<Topology>,
    pub gateway: Arc<Gateway>,
}

/// The live generation and the lock its writers take.
#[derive(Debug)]
pub struct Live {
    current: ArcSwap<Generation>,
    writer: Mutex<()>,
}

impl Live {
    pub fn new(generation: Generation) -> Live {
        Live {
            current: ArcSwap::from_pointee(generation),
            writer: Mutex::new(()),
        }
    }

    /// The generation in force now.
    pub fn load(&self) -> Arc<Generation> {
        self.current.load_full()
    }

    /// Holds off other writers until the returned guard is dropped; read
    /// the current generation after taking it, then [`Writer::store`].
    pub fn write(&self) -> Writer<'_> {
        let guard = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        Writer {
            live: self,
            _guard: guard,
        }
    }
}

/// The one writer of the moment.
pub struct Writer<'a> {
    live: &'a Live,
    _guard: MutexGuard<'a, ()>,
}

impl Writer<'_> {
    /// The generation in force now (no other writer can change it).
    pub fn current(&self) -> Arc<Generation> {
        self.live.load()
    }

    /// Puts `next` in force.
    pub fn store(&self, next: Generation) {
        self.live.current.store(Arc::new(next));
    }
}

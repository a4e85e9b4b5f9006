//! The fleet store: what several llmlb instances share through Redis (or
//! Valkey), so that what one instance guarantees holds for all of them.
//!
//! - **Registration** ([`store`]): each instance registers with a heartbeat
//!   (every `fleet.refresh`) and a TTL (`fleet.instance_ttl`); the status
//!   page lists the live ones.
//! - **Per-replica limits** ([`lease`], [`script`]): each replica's
//!   `max_inflight` is split into leases of slots that follow each
//!   instance's demand (Doorman's idea), renewed on every refresh. The
//!   request path only reads the cap its instance holds (an atomic per
//!   replica); it never waits on the store. A killed instance's slots come
//!   back when its registration lapses (`instance_ttl`).
//! - **One queue order** ([`queues`]): each refresh publishes every pool
//!   queue's waiters per level and each level's oldest wait, and reads the
//!   other instances'; a waiter here that another instance's goes before
//!   takes no slot and is not counted as demand, and the slots this
//!   instance will not use are given back before its next refresh
//!   ([`Fleet::release`]), so the lease moves there (`admission::queue`
//!   holds the rule); the refresh that gave them back wakes the other
//!   instances through the store's `wake` channel ([`wake`]), so the one
//!   whose waiter goes first takes them at once.
//! - **One prefix view** ([`prefixes`]): dispatch records on a Redis
//!   stream, folded by every instance into its `cache`/`hash` index.
//! - **The store** ([`client`]): one Redis or Valkey server, the master
//!   Redis Sentinel names (found again at each connection), or a Redis
//!   Cluster (every fleet key under one hash tag).
//! - **Failure**: when the store is down, slow or out of reach, each
//!   instance runs out its leases, then uses its share of each replica's
//!   limit (`max_inflight ÷` the live instances it last saw, at least 1),
//!   and rejoins through a probation when the store answers again.
//!
//! The module sits at the bottom of the layers (it reads `config` and
//! `telemetry` only); the daemon wires it to the replicas.

mod client;
pub mod lease;
mod metrics;
pub mod prefixes;
mod queues;
pub mod script;
mod store;
mod wake;

pub use client::{StoreClient, StoreConn};
pub use lease::Phase;
pub use metrics::FleetMetrics;
pub use prefixes::{PrefixOutbox, PrefixRecord};
pub use queues::QueueReport;
pub use store::{Demand, Exchange, Fleet, FleetError, FleetStatus, Instance};

/// Woken when a request starts waiting for a slot, so the refresh loop
/// asks for a bigger share at once instead of at its next tick.
static WAITING: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// A request waits for a slot (in a pool queue or for a replica).
pub fn nudge() {
    WAITING.notify_waiters();
}

fn waiting() -> &'static tokio::sync::Notify {
    &WAITING
}

#[cfg(test)]
mod tests;

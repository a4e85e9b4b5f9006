//! Prefix affinity: keep requests that share a prompt beginning on replicas
//! that already hold it in their KV cache, without creating hot spots.
//!
//! `hash` mode ([`rendezvous`]) maps a hash of the system prompt (or of the
//! first tokens) to a replica by rendezvous hashing, moving on down that
//! prefix's order when the preferred replica is saturated. `cache` mode
//! ([`cache_index`], [`score`]) remembers which prompt blocks ([`blocks`])
//! went where and picks the replica with the lowest expected time to first
//! token. [`predict`] says what the chosen replica should report cached.
//! [`hot`] keeps a prefix with more demand than one replica should carry
//! warm on as many replicas as it needs, and [`home`] gives every prefix
//! one replica to go back to, spreading prefixes by demand.

pub mod blocks;
pub mod cache_index;
pub mod ending;
pub mod evict_order;
pub mod held;
pub mod home;
pub mod hot;
pub mod predict;
pub mod rendezvous;
pub mod score;

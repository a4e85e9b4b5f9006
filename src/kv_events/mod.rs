//! KV-cache events: what a replica's prefix cache stores and evicts, as
//! vLLM publishes it over ZMQ (`--kv-events-config`).
//!
//! A low module shared by both sides: the simulator publishes with
//! [`publisher`], llmlb subscribes with [`subscriber`]; both speak the wire
//! format of [`wire`], read a `BlockStored` through [`StoredBlocks`]; [`metrics`]
//! counts what the subscribers see. Nothing here knows about routing or the proxy.

pub mod metrics;
pub mod publisher;
mod stored;
pub mod subscriber;
pub mod wire;

pub use stored::StoredBlocks;
pub use wire::{BlockExtra, BlockKey, EventBatch, KvEvent, Message, WireError};

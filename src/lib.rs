//! llmlb: a load balancer for LLM inference fleets.
//!
//! The request path, one module per stage: [`server`] accepts and reads the
//! request, [`routing`] finds the pool, [`balancing`] picks the replica,
//! [`forwarding`] streams the answer back. [`config`] parses and validates the
//! TOML file; [`telemetry`] and [`admin`] make it observable.

#![forbid(unsafe_code)]
// The crate is the binary's library: its docs are read with private items
// (`cargo doc --document-private-items`), where these links resolve.
#![allow(rustdoc::private_intra_doc_links)]

pub mod admin;
pub mod admission;
pub mod balancing;
pub mod bench;
pub mod calibrate;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod demo;
pub mod discovery;
pub mod doctor;
pub mod fleet;
pub mod fleet_sim;
pub mod forwarding;
pub mod gateway;
pub mod health;
pub mod kv_events;
pub mod kv_transfer;
pub mod net;
pub mod pool;
pub mod replica;
pub mod replica_sim;
pub mod routing;
pub mod server;
pub mod signals;
pub mod telemetry;
pub mod tokenize;

//! Load signals: what each replica reports about itself on `/metrics`.
//!
//! [`parse`] reads Prometheus text, [`preset`] says which names carry load,
//! [`lora`] reads which LoRA adapters a replica holds,
//! `snapshot` reads one scrape into a [`LoadSnapshot`](crate::replica::LoadSnapshot)
//! (stored on the replica, replaced whole), and [`scraper`] is the background
//! loop that keeps them fresh and notices restarts
//! ([`RestartWatch`](crate::replica::RestartWatch)).

pub mod lora;
pub mod parse;
pub mod preset;
pub mod scraper;
mod snapshot;

pub use preset::MetricNames;

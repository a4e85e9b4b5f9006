//! Load signals: what each replica reports about itself on `/metrics`.
//!
//! [`parse`] reads Prometheus text, [`preset`] says which names carry load,
//! [`LoadSnapshot`] is one scrape's result (stored on the replica, replaced
//! whole), and [`scraper`] is the background loop that keeps them fresh.

pub mod parse;
pub mod preset;
pub mod scraper;
mod snapshot;

pub use preset::MetricNames;
pub use snapshot::{EngineTiming, LoadSnapshot};

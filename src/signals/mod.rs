//! Load signals: what each replica reports about itself on `/metrics`.
//!
//! [`parse`] reads Prometheus text, [`preset`] says which names carry load,
//! [`LoadSnapshot`] is one scrape's result (stored on the replica, replaced
//! whole), [`scraper`] is the background loop that keeps them fresh, and
//! [`restart`] tells from consecutive scrapes that a replica restarted.

pub mod parse;
pub mod preset;
pub mod restart;
pub mod scraper;
mod snapshot;

pub use preset::MetricNames;
pub use restart::RestartWatch;
pub use snapshot::{EngineTiming, LoadSnapshot};

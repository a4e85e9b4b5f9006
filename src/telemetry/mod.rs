//! Logs and llmlb's own Prometheus metrics.

pub mod clock;
mod logging;
mod metrics;

pub use logging::{LogFormat, init_logging};
pub use metrics::Metrics;

//! Logs and llmlb's own Prometheus metrics.

pub mod clock;
mod logging;
mod metrics;
mod model_metrics;
pub mod prefix_loop;
mod signal_metrics;

pub use logging::{LogFormat, init_logging};
pub use metrics::Metrics;
pub use model_metrics::ModelMetrics;
pub use prefix_loop::PrefixLoopMetrics;
pub use signal_metrics::SignalMetrics;

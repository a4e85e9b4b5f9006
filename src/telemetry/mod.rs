//! Logs, llmlb's own Prometheus metrics and request traces.

pub mod clock;
mod family;
pub mod log_line;
mod logging;
mod metrics;
mod model_metrics;
pub mod prefix_loop;
mod replica_series;
mod signal_metrics;
pub mod trace;

pub use family::Family;
pub use logging::{LogFormat, init_logging};
pub use metrics::Metrics;
pub use model_metrics::{ModelMetrics, ModelSeries};
pub use prefix_loop::PrefixLoopMetrics;
pub use replica_series::ReplicaSeries;
pub use signal_metrics::SignalMetrics;

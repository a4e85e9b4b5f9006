//! Health: active checks (`GET /health` on a cadence, HAProxy's fall/rise)
//! and the background loop that runs them. Passive outlier ejection lives
//! with the replica state in `balancing::outlier`.

pub mod checker;
mod probe;
mod state;

pub use probe::{ProbeError, Prober};
pub use state::{ActiveHealth, Transition};

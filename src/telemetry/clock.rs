//! A cheap monotonic millisecond clock shared by the request path.

use std::sync::OnceLock;
use std::time::Instant;

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// Milliseconds since the first call in this process (monotonic).
pub fn now_millis() -> u64 {
    origin().elapsed().as_millis() as u64 + 1
}

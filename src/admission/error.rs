//! Why admission refused a request. The HTTP status and body are chosen at
//! the edge (`server/error.rs`), not here.

use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    /// The queue of the request's priority level holds its maximum.
    #[error("queue for this priority is full")]
    QueueFull { retry_after: Duration },
    /// The caller's tenant has its bound of waiters at this priority level.
    #[error("this tenant's share of the queue for this priority is full")]
    TenantQueueFull { retry_after: Duration },
    /// The estimated wait exceeds the level's latency objective.
    #[error("the fleet cannot start this request within its latency objective")]
    OverObjective {
        /// `None`: no request served yet to estimate a wait from.
        estimated: Option<Duration>,
        retry_after: Duration,
    },
    /// Waited the pool's `queue_timeout` without a slot.
    #[error("request waited too long in the queue")]
    QueueTimeout { retry_after: Duration },
}

//! Why forwarding gave up on a request. The HTTP status and body are chosen
//! at the edge (`server/error.rs`), not here.

use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ForwardError {
    /// No replica of the pool was eligible for the first attempt.
    #[error("no healthy replica in pool `{pool}`")]
    NoHealthyReplica { pool: String },
    /// Every attempt failed to reach a replica (or the connection broke
    /// after the request was sent).
    #[error("could not reach a replica of pool `{pool}` after {attempts} attempt(s)")]
    UpstreamUnavailable { pool: String, attempts: u32 },
    /// The replica sent no response head within `timeouts.first_byte`.
    #[error("replica of pool `{pool}` did not answer within {timeout}")]
    UpstreamTimeout { pool: String, timeout: String },
    /// Every replica the request may use stayed full for the wait allowed.
    #[error("request waited too long for a free replica")]
    SlotTimeout { retry_after: Duration },
    /// The request's path does not make a URI on the replica.
    #[error("invalid request path: {0}")]
    InvalidPath(String),
}

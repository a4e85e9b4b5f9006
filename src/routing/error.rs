//! What the routing stage refuses, as a typed error.
//!
//! Routing fails only on a request it cannot make sense of: a forced canary
//! version the pool does not run, or a body whose `model` cannot be
//! rewritten because it is not a JSON object. The HTTP status and body are
//! chosen at the edge (`server/stage_errors.rs`), not here.

/// Why the routing stage refused a request.
#[derive(Debug, thiserror::Error)]
pub enum RouteError {
    /// The version header names a version the pool does not run.
    #[error("unknown version {version:?}; this pool runs {}", known.join(", "))]
    UnknownVersion { version: String, known: Vec<String> },
    /// An alias needs the body's `model` rewritten, and the body is not a
    /// JSON object.
    #[error("request body is not a JSON object: {0}")]
    BodyNotObject(serde_json::Error),
    /// The rewritten body could not be serialised again.
    #[error("{0}")]
    Rewrite(serde_json::Error),
}

//! What the gateway refuses, as typed errors: an unauthenticated caller
//! ([`AuthError`]) and a charge a rate limit refuses ([`RateLimited`]).
//!
//! The HTTP status (401, 429 with `Retry-After`) and the JSON body are
//! chosen at the edge (`server/stage_errors.rs`); a refused charge also
//! carries the buckets' state for the `x-ratelimit-*` headers.

use std::time::Duration;

use super::charging::RateHeaders;

/// Why a caller is not let in (`[gateway] auth = true`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("missing API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`")]
    MissingKey,
    #[error("invalid API key")]
    InvalidKey,
}

impl AuthError {
    /// The message a client reads.
    pub fn message(self) -> &'static str {
        match self {
            AuthError::MissingKey => {
                "missing API key: send `Authorization: Bearer KEY` or `x-api-key: KEY`"
            }
            AuthError::InvalidKey => "invalid API key",
        }
    }
}

/// Which of a key's per-minute limits refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    Requests,
    Tokens,
}

impl LimitKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LimitKind::Requests => "requests",
            LimitKind::Tokens => "tokens",
        }
    }
}

/// A charge refused by a rate limit; nothing was charged.
#[derive(Debug, Clone, thiserror::Error)]
#[error("rate limit reached for {} per minute", kind.as_str())]
pub struct RateLimited {
    pub kind: LimitKind,
    /// When the refused charge would fit.
    pub retry_after: Duration,
    /// The buckets as they stand, for the `x-ratelimit-*` headers.
    pub headers: RateHeaders,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_match_the_display_text() {
        for e in [AuthError::MissingKey, AuthError::InvalidKey] {
            assert_eq!(e.message(), e.to_string());
        }
    }
}

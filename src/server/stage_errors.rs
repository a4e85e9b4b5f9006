//! How the stages' own errors become llmlb's HTTP answer: one `From` impl
//! per stage error, so the status mapping stays at the edge
//! ([`ApiError::status`]) and the stages never build an HTTP error.
//!
//! Status and body are exactly those the stages produced before they had
//! their own types: an authentication refusal is a 401, a rate limit a 429
//! with `Retry-After`, a routing refusal a 400 with the refusal's message.

use super::ApiError;
use crate::gateway::{AuthError, RateLimited};
use crate::routing::RouteError;

impl From<AuthError> for ApiError {
    fn from(e: AuthError) -> ApiError {
        ApiError::Unauthorized(e.message())
    }
}

/// The `x-ratelimit-*` state travels separately
/// ([`super::limit_headers`]); the error keeps the kind and the wait.
impl From<RateLimited> for ApiError {
    fn from(e: RateLimited) -> ApiError {
        ApiError::RateLimited {
            kind: e.kind.as_str(),
            retry_after: e.retry_after,
        }
    }
}

impl From<RouteError> for ApiError {
    fn from(e: RouteError) -> ApiError {
        ApiError::BadRequest(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::StatusCode;

    #[test]
    fn a_routing_refusal_is_a_bad_request_with_its_message() {
        let e = ApiError::from(RouteError::UnknownVersion {
            version: "v9".into(),
            known: vec!["v1".into(), "v2".into()],
        });
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            e.to_string(),
            "unknown version \"v9\"; this pool runs v1, v2"
        );
    }
}

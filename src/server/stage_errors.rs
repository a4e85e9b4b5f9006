//! How the stages' own errors become llmlb's HTTP answer: one `From` impl
//! per stage error (the body read, the gateway, routing, the queue,
//! forwarding), so the status mapping stays at the edge
//! ([`ApiError::status`]) and the stages never build an HTTP error.
//!
//! Status and body are exactly those the stages produced before they had
//! their own types: an authentication refusal is a 401, a rate limit a 429
//! with `Retry-After`, a routing refusal a 400 with the refusal's message.

use super::ApiError;
use crate::admission::AdmitError;
use crate::forwarding::ForwardError;
use crate::gateway::{AuthError, RateLimited};
use crate::net::ReadError;
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

impl From<ReadError> for ApiError {
    fn from(e: ReadError) -> ApiError {
        match e {
            ReadError::TooLarge { limit } => ApiError::PayloadTooLarge { limit },
            e @ ReadError::Broken(_) => ApiError::BadRequest(e.to_string()),
        }
    }
}

impl From<AdmitError> for ApiError {
    fn from(e: AdmitError) -> ApiError {
        match e {
            AdmitError::QueueFull { retry_after } => ApiError::QueueFull { retry_after },
            AdmitError::TenantQueueFull { retry_after } => {
                ApiError::TenantQueueFull { retry_after }
            }
            AdmitError::OverObjective {
                estimated,
                retry_after,
            } => ApiError::OverObjective {
                estimated,
                retry_after,
            },
            AdmitError::QueueTimeout { retry_after } => ApiError::QueueTimeout { retry_after },
        }
    }
}

/// Waiting for a free replica is the pool's queue by another name: a wait
/// that runs out answers as the queue's timeout does.
impl From<ForwardError> for ApiError {
    fn from(e: ForwardError) -> ApiError {
        match e {
            ForwardError::SlotTimeout { retry_after } => ApiError::QueueTimeout { retry_after },
            other => ApiError::Upstream(other),
        }
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

    #[test]
    fn forwarding_failures_keep_their_status_and_a_slot_wait_is_a_queue_timeout() {
        let cases = [
            (
                ForwardError::NoHealthyReplica { pool: "p".into() },
                503,
                "no_healthy_replica",
            ),
            (
                ForwardError::UpstreamUnavailable {
                    pool: "p".into(),
                    attempts: 2,
                },
                502,
                "upstream_unavailable",
            ),
            (
                ForwardError::UpstreamTimeout {
                    pool: "p".into(),
                    timeout: "1s".into(),
                },
                504,
                "upstream_timeout",
            ),
            (
                ForwardError::InvalidPath("/a b?k=secret".into()),
                400,
                "invalid_request",
            ),
        ];
        for (e, status, code) in cases {
            let api = ApiError::from(e.clone());
            assert_eq!(api.status().as_u16(), status, "{e}");
            assert_eq!(api.code(), code);
            assert_eq!(api.to_string(), e.to_string());
        }
        let path = ApiError::from(ForwardError::InvalidPath("/a b?k=secret".into()));
        assert_eq!(path.log_message(), "invalid request path");
        let slot = ApiError::from(ForwardError::SlotTimeout {
            retry_after: std::time::Duration::from_millis(1500),
        });
        assert!(matches!(slot, ApiError::QueueTimeout { .. }));
        assert_eq!(slot.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            slot.retry_after(),
            Some(std::time::Duration::from_millis(1500))
        );
    }
}

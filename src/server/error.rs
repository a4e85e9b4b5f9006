//! Errors llmlb answers itself, mapped to an HTTP status and an OpenAI-style
//! JSON body in exactly one place ([`ApiError::into_response`]).

use std::time::Duration;

use http::{Response, StatusCode, header};

use crate::forwarding::ForwardError;
use crate::net::{ResponseBody, json_error};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    /// A body field with the wrong type or value; `param` is its path
    /// (`max_tokens`, `messages[0].role`), OpenAI's `param`.
    #[error("invalid `{param}`: {reason}")]
    InvalidParam { param: String, reason: String },
    #[error("the model `{0}` does not exist or is not served here")]
    ModelNotFound(String),
    #[error("no route for {method} {path}")]
    RouteNotFound { method: String, path: String },
    /// `allow`: the methods the path answers (the `Allow` header).
    #[error("method {method} is not allowed on this path")]
    MethodNotAllowed { method: String, allow: &'static str },
    #[error("request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    /// Forwarding gave up; its message is the client's. (A slot wait that
    /// ran out is a [`ApiError::QueueTimeout`], see the `From` impl.)
    #[error(transparent)]
    Upstream(ForwardError),
    #[error("pool `{pool}` has {limit} requests pending already; retry later")]
    PoolOverloaded { pool: String, limit: u32 },
    #[error("llmlb is shutting down")]
    ShuttingDown,
    #[error("{0}")]
    Unauthorized(&'static str),
    #[error("rate limit reached for {kind} per minute; retry after {}s", retry_secs(*retry_after))]
    RateLimited {
        kind: &'static str,
        retry_after: Duration,
    },
    #[error("queue for this priority is full; retry after {}s", retry_secs(*retry_after))]
    QueueFull { retry_after: Duration },
    #[error("this tenant's share of the queue for this priority is full; retry after {}s", retry_secs(*retry_after))]
    TenantQueueFull { retry_after: Duration },
    #[error("the fleet cannot start this request within its latency objective ({}); retry after {}s", estimate_words(*estimated), retry_secs(*retry_after))]
    OverObjective {
        estimated: Option<Duration>,
        retry_after: Duration,
    },
    #[error("request waited too long in the queue; retry after {}s", retry_secs(*retry_after))]
    QueueTimeout { retry_after: Duration },
    #[error("the request body did not arrive within {0}")]
    BodyTimeout(String),
    #[error("llmlb holds too many request bodies right now; retry shortly")]
    ServerBusy,
}

/// The estimate behind an over-objective refusal, in words.
fn estimate_words(estimated: Option<Duration>) -> String {
    match estimated {
        Some(e) => format!("estimated {:.1}s", e.as_secs_f64()),
        None => "every slot is busy and no request has finished yet to estimate the wait".into(),
    }
}

/// Whole seconds for `Retry-After`, at least 1.
pub fn retry_secs(d: Duration) -> u64 {
    (d.as_secs_f64().ceil() as u64).max(1)
}

impl ApiError {
    /// The error as a log line may show it: a bad request's reason without
    /// the details that quote the request (parts of the prompt, field
    /// values); everything else as the client reads it.
    pub fn log_message(&self) -> String {
        match self {
            ApiError::BadRequest(m) => m.split(": ").next().unwrap_or_default().to_string(),
            // The reason may quote the offending value (prompt text): log
            // only which field was wrong.
            ApiError::InvalidParam { param, .. } => format!("invalid `{param}`"),
            // The path may carry a query string with the caller's data.
            ApiError::Upstream(ForwardError::InvalidPath(_)) => "invalid request path".into(),
            other => other.to_string(),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) | ApiError::InvalidParam { .. } => StatusCode::BAD_REQUEST,
            ApiError::ModelNotFound(_) | ApiError::RouteNotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::ShuttingDown | ApiError::PoolOverloaded { .. } => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Upstream(e) => match e {
                ForwardError::NoHealthyReplica { .. } | ForwardError::SlotTimeout { .. } => {
                    StatusCode::SERVICE_UNAVAILABLE
                }
                ForwardError::UpstreamUnavailable { .. } => StatusCode::BAD_GATEWAY,
                ForwardError::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
                ForwardError::InvalidPath(_) => StatusCode::BAD_REQUEST,
            },
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::RateLimited { .. }
            | ApiError::QueueFull { .. }
            | ApiError::TenantQueueFull { .. }
            | ApiError::OverObjective { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::QueueTimeout { .. } | ApiError::ServerBusy => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
        }
    }

    /// The `Retry-After` a client should honour, when there is one.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ApiError::RateLimited { retry_after, .. }
            | ApiError::QueueFull { retry_after }
            | ApiError::TenantQueueFull { retry_after }
            | ApiError::OverObjective { retry_after, .. }
            | ApiError::QueueTimeout { retry_after }
            | ApiError::Upstream(ForwardError::SlotTimeout { retry_after }) => Some(*retry_after),
            _ => None,
        }
    }

    /// The `reason` label of `llmlb_rejections_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::OverObjective { .. } => "slo",
            other => other.code(),
        }
    }

    /// Stable machine-readable code: the JSON `code` field and the
    /// `reason` label of `llmlb_rejections_total`.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) | ApiError::InvalidParam { .. } => "invalid_request",
            ApiError::ModelNotFound(_) => "model_not_found",
            ApiError::RouteNotFound { .. } => "not_found",
            ApiError::MethodNotAllowed { .. } => "method_not_allowed",
            ApiError::PayloadTooLarge { .. } => "payload_too_large",
            ApiError::Upstream(e) => match e {
                ForwardError::NoHealthyReplica { .. } => "no_healthy_replica",
                ForwardError::UpstreamUnavailable { .. } => "upstream_unavailable",
                ForwardError::UpstreamTimeout { .. } => "upstream_timeout",
                ForwardError::SlotTimeout { .. } => "queue_timeout",
                ForwardError::InvalidPath(_) => "invalid_request",
            },
            ApiError::ShuttingDown => "shutting_down",
            ApiError::PoolOverloaded { .. } => "pool_overloaded",
            ApiError::Unauthorized(_) => "invalid_api_key",
            ApiError::RateLimited { kind: "tokens", .. } => "rate_limit_tokens",
            ApiError::RateLimited { .. } => "rate_limit_requests",
            ApiError::QueueFull { .. } => "queue_full",
            ApiError::TenantQueueFull { .. } => "tenant_queue_full",
            ApiError::OverObjective { .. } => "over_objective",
            ApiError::QueueTimeout { .. } => "queue_timeout",
            ApiError::BodyTimeout(_) => "body_timeout",
            ApiError::ServerBusy => "server_busy",
        }
    }

    fn kind(&self) -> &'static str {
        match self.status().as_u16() {
            401 => "authentication_error",
            429 => "rate_limit_error",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        }
    }

    pub fn into_response(self) -> Response<ResponseBody> {
        let param = match &self {
            ApiError::InvalidParam { param, .. } => Some(param.as_str()),
            _ => None,
        };
        let mut resp = json_error(
            self.status(),
            self.kind(),
            self.code(),
            &self.to_string(),
            param,
        );
        if let Some(d) = self.retry_after() {
            resp.headers_mut().insert(
                header::RETRY_AFTER,
                header::HeaderValue::from(retry_secs(d)),
            );
        }
        if let ApiError::MethodNotAllowed { allow, .. } = &self {
            resp.headers_mut()
                .insert(header::ALLOW, header::HeaderValue::from_static(allow));
        }
        if matches!(self, ApiError::Unauthorized(_)) {
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer"),
            );
        }
        resp
    }
}

//! Errors llmlb answers itself, mapped to an HTTP status and an OpenAI-style
//! JSON body in exactly one place ([`ApiError::into_response`]).

use http::{Response, StatusCode, header};

use crate::forwarding::{ResponseBody, full_body};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("the model `{0}` does not exist or is not served here")]
    ModelNotFound(String),
    #[error("no route for {method} {path}")]
    RouteNotFound { method: String, path: String },
    #[error("method {0} is not allowed on this path")]
    MethodNotAllowed(String),
    #[error("request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge { limit: usize },
    #[error("no healthy replica in pool `{pool}`")]
    NoHealthyReplica { pool: String },
    #[error("could not reach a replica of pool `{pool}` after {attempts} attempt(s)")]
    UpstreamUnavailable { pool: String, attempts: u32 },
    #[error("replica of pool `{pool}` did not answer within {timeout}")]
    UpstreamTimeout { pool: String, timeout: String },
    #[error("llmlb is shutting down")]
    ShuttingDown,
}

impl ApiError {
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::ModelNotFound(_) | ApiError::RouteNotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::NoHealthyReplica { .. } | ApiError::ShuttingDown => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::UpstreamUnavailable { .. } => StatusCode::BAD_GATEWAY,
            ApiError::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// Stable machine-readable code: the JSON `code` field and the
    /// `reason` label of `llmlb_rejections_total`.
    pub fn code(&self) -> &'static str {
        match self {
            ApiError::BadRequest(_) => "invalid_request",
            ApiError::ModelNotFound(_) => "model_not_found",
            ApiError::RouteNotFound { .. } => "not_found",
            ApiError::MethodNotAllowed(_) => "method_not_allowed",
            ApiError::PayloadTooLarge { .. } => "payload_too_large",
            ApiError::NoHealthyReplica { .. } => "no_healthy_replica",
            ApiError::UpstreamUnavailable { .. } => "upstream_unavailable",
            ApiError::UpstreamTimeout { .. } => "upstream_timeout",
            ApiError::ShuttingDown => "shutting_down",
        }
    }

    fn kind(&self) -> &'static str {
        match self.status().as_u16() {
            400..=499 => "invalid_request_error",
            _ => "server_error",
        }
    }

    pub fn into_response(self) -> Response<ResponseBody> {
        error_response(self.status(), self.kind(), self.code(), &self.to_string())
    }
}

/// An OpenAI-style error: `{"error":{"message","type","param","code"}}`.
pub fn error_response(
    status: StatusCode,
    kind: &str,
    code: &str,
    message: &str,
) -> Response<ResponseBody> {
    let body = serde_json::json!({
        "error": {"message": message, "type": kind, "param": null, "code": code}
    });
    let mut resp = Response::new(full_body(body.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

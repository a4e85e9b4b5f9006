//! The admin listener: `/metrics` (Prometheus text), `/healthz` (the process is
//! alive), `/readyz` (config loaded, not draining, every pool has a replica
//! not known to be down) and `/admin/replicas` (each replica's load and health, JSON).

mod replicas;

use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::forwarding::{ResponseBody, full_body};
use crate::server::{AppState, error_response};

pub async fn handle(state: Arc<AppState>, req: Request<Incoming>) -> Response<ResponseBody> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return error_response(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method_not_allowed",
            "admin endpoints answer GET",
        );
    }
    match req.uri().path() {
        "/metrics" => text(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            state.metrics.render(),
        ),
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
        "/admin/replicas" => text(
            StatusCode::OK,
            "application/json",
            replicas::render(&state.topology.load()).to_string(),
        ),
        "/readyz" => {
            if state.is_ready() {
                text(StatusCode::OK, "text/plain", "ready\n".into())
            } else {
                text(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "not ready\n".into(),
                )
            }
        }
        other => error_response(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "not_found",
            &format!("no admin endpoint {other}"),
        ),
    }
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<ResponseBody> {
    let mut resp = Response::new(full_body(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

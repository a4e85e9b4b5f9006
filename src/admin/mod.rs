//! The admin listener: `/metrics` (Prometheus text), `/healthz` (the process is
//! alive), `/readyz` (config loaded, not draining, every pool has a replica
//! not known to be down) and `/admin/replicas` (each replica's load and health, JSON).
//! Mutating endpoints (`POST`, behind the optional admin token):
//! `/admin/reload`, `/admin/replicas/{name}/drain` and `/admin/replicas/{name}/undrain`.

mod replicas;
mod status;

use std::sync::Arc;

use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::net::{ResponseBody, full_body};
use crate::server::{AppState, error_response};

pub async fn handle(state: Arc<AppState>, req: Request<Incoming>) -> Response<ResponseBody> {
    if req.method() == Method::POST {
        return post(&state, &req);
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        let mut resp = error_response(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method_not_allowed",
            "admin endpoints answer GET",
        );
        resp.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD, POST"));
        return resp;
    }
    match req.uri().path() {
        "/metrics" => {
            let topology = state.topology();
            state
                .metrics
                .set_replicas(topology.pools().iter().flat_map(|p| {
                    p.replicas.iter().map(|r| {
                        (
                            p.name.as_str(),
                            r.name.as_str(),
                            format!("{}://{}", r.scheme, r.authority),
                        )
                    })
                }));
            text(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                state.metrics.render(),
            )
        }
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
        "/" => text(
            StatusCode::OK,
            "text/html; charset=utf-8",
            status::PAGE.into(),
        ),
        "/admin/status" => {
            let mut doc = status::render(&state);
            status::attach_instances(&state, &mut doc).await;
            json(StatusCode::OK, &doc)
        }
        "/admin/replicas" => text(
            StatusCode::OK,
            "application/json",
            replicas::render(&state.topology()).to_string(),
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

/// Mutating endpoints, behind the optional admin token.
fn post(state: &AppState, req: &Request<Incoming>) -> Response<ResponseBody> {
    if let Some(token) = &state.config().server.admin_token {
        let presented = crate::gateway::keys::presented_key(req.headers()).unwrap_or("");
        // Digests of equal length: the comparison time says nothing about
        // the token's length either.
        let digest = |s: &str| <sha2::Sha256 as sha2::Digest>::digest(s.as_bytes());
        let ok: bool =
            subtle::ConstantTimeEq::ct_eq(&digest(presented)[..], &digest(token)[..]).into();
        if !ok {
            let mut resp = error_response(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "invalid_admin_token",
                "admin endpoints need `Authorization: Bearer <server.admin_token>`",
            );
            resp.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return resp;
        }
    }
    match req.uri().path() {
        "/admin/reload" => match crate::server::reload::reload(state, None) {
            Ok(summary) => json(
                StatusCode::OK,
                &serde_json::json!({"status": "reloaded", "summary": summary}),
            ),
            Err(e) => {
                let errors: Vec<serde_json::Value> = e
                    .issues
                    .iter()
                    .map(|i| serde_json::json!({"key": i.key, "reason": i.reason}))
                    .collect();
                json(
                    StatusCode::BAD_REQUEST,
                    &serde_json::json!({
                        "error": {
                            "message": format!("config rejected; the running config stays in force:\n{e}"),
                            "type": "invalid_request_error",
                            "param": null,
                            "code": "invalid_config",
                        },
                        "file": e.file.display().to_string(),
                        "issues": errors,
                    }),
                )
            }
        },
        other => match drain_target(other) {
            Some((name, on)) => match replicas::set_draining(&state.topology(), name, on) {
                Some(body) => {
                    tracing::info!(
                        replica = name,
                        draining = on,
                        "replica drain changed by the admin API"
                    );
                    json(StatusCode::OK, &body)
                }
                None => error_response(
                    StatusCode::NOT_FOUND,
                    "invalid_request_error",
                    "replica_not_found",
                    &format!("no replica named {name:?}"),
                ),
            },
            None => error_response(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "not_found",
                &format!("no admin endpoint POST {other}"),
            ),
        },
    }
}

/// `/admin/replicas/{name}/drain` → `(name, true)`, `.../undrain` → `(name, false)`.
fn drain_target(path: &str) -> Option<(&str, bool)> {
    let rest = path.strip_prefix("/admin/replicas/")?;
    let (name, action) = rest.rsplit_once('/')?;
    let on = match action {
        "drain" => true,
        "undrain" => false,
        _ => return None,
    };
    (!name.is_empty()).then_some((name, on))
}

fn json(status: StatusCode, value: &serde_json::Value) -> Response<ResponseBody> {
    text(status, "application/json", value.to_string())
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<ResponseBody> {
    let mut resp = Response::new(full_body(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

//! The OpenAI-compatible surface around the inference endpoints: which
//! paths are routed by `model`, what llmlb answers itself (`GET /health`,
//! `GET /v1/models/{id}`, CORS preflights), CORS headers on answers, and
//! reading `model` from JSON or multipart (audio) bodies.

use http::header::{self, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode};

use super::multipart;
use super::request::{RequestMeta, extract};
use super::{ApiError, AppState, error_response};
use crate::config::CorsConfig;
use crate::net::{ResponseBody, full_body};
use crate::pool::Topology;

/// Endpoints forwarded to a replica of the pool serving the body's `model`
/// (vLLM's OpenAI-compatible server answers all of them).
const MODEL_ROUTED_PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/audio/transcriptions",
    "/v1/audio/translations",
    "/v1/audio/speech",
    "/v1/rerank",
    "/v2/rerank",
    "/rerank",
    "/v1/score",
    "/score",
    "/tokenize",
    "/detokenize",
];

/// Whether `path` is forwarded by the request's `model`.
pub fn is_model_routed(path: &str) -> bool {
    MODEL_ROUTED_PATHS.contains(&path)
}

/// What llmlb answers without a replica, or `None` for everything else.
pub fn local_answer<B>(
    state: &AppState,
    req: &Request<B>,
) -> Option<Result<Response<ResponseBody>, ApiError>> {
    let path = req.uri().path();
    let get = matches!(*req.method(), Method::GET | Method::HEAD);
    if *req.method() == Method::OPTIONS
        && let Some(cors) = &state.config().server.cors
        && let Some(origin) = req.headers().get(header::ORIGIN)
    {
        return Some(Ok(preflight(cors, origin)));
    }
    if path == "/health" {
        if !get {
            return Some(Err(ApiError::MethodNotAllowed {
                method: req.method().to_string(),
                allow: "GET, HEAD",
            }));
        }
        return Some(Ok(if state.is_ready() {
            Response::new(full_body(String::new()))
        } else {
            error_response(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "no_healthy_replica",
                "no pool has a replica known to be up",
            )
        }));
    }
    let raw = path.strip_prefix("/v1/models/")?;
    // Model ids hold slashes (`meta-llama/Llama-3.1-8B-Instruct`); a client
    // library escapes them in the path (`%2F`), so the id is decoded.
    let decoded = percent_encoding::percent_decode_str(raw).decode_utf8();
    let id = decoded.as_deref().unwrap_or(raw);
    if !get {
        return Some(Err(ApiError::MethodNotAllowed {
            method: req.method().to_string(),
            allow: "GET, HEAD",
        }));
    }
    let topology = state.topology();
    Some(
        find_model(&topology, id)
            .map(|owner| json(&model_object(id, &owner)))
            .ok_or_else(|| ApiError::ModelNotFound(id.to_owned())),
    )
}

fn find_model(topology: &Topology, id: &str) -> Option<String> {
    topology
        .models()
        .chain(topology.aliases())
        .find(|(m, _)| *m == id)
        .map(|(_, pool)| pool.name.clone())
        .or_else(|| {
            // The replicas' last lists (`models_from_replicas`).
            topology
                .reported_models()
                .into_iter()
                .find(|(m, _)| m == id)
                .map(|(_, pool)| pool.name.clone())
        })
}

/// One entry of `/v1/models`.
pub fn model_object(id: &str, owner: &str) -> serde_json::Value {
    serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": owner})
}

/// A JSON answer with status 200.
pub fn json(value: &serde_json::Value) -> Response<ResponseBody> {
    let mut resp = Response::new(full_body(value.to_string()));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn preflight(cors: &CorsConfig, origin: &HeaderValue) -> Response<ResponseBody> {
    let mut resp = Response::new(full_body(String::new()));
    *resp.status_mut() = StatusCode::NO_CONTENT;
    let h = resp.headers_mut();
    if let Some(allowed) = origin.to_str().ok().and_then(|o| cors.allow(o))
        && let Ok(v) = HeaderValue::from_str(&allowed)
    {
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, OPTIONS"),
        );
        if let Ok(v) = HeaderValue::from_str(&cors.allow_headers.join(", ")) {
            h.insert(header::ACCESS_CONTROL_ALLOW_HEADERS, v);
        }
        h.insert(header::ACCESS_CONTROL_MAX_AGE, cors.max_age_secs.into());
    }
    h.insert(header::VARY, HeaderValue::from_static("origin"));
    resp
}

/// Adds CORS headers to an answer's `headers` for a request from `origin`
/// when `[server.cors]` allows it.
pub fn apply_cors(state: &AppState, origin: Option<&HeaderValue>, headers: &mut HeaderMap) {
    // Most API clients send no Origin: then the config is not loaded.
    let Some(origin) = origin else {
        return;
    };
    let config = state.config();
    let Some(cors) = &config.server.cors else {
        return;
    };
    let Some(allowed) = origin.to_str().ok().and_then(|o| cors.allow(o)) else {
        return;
    };
    if let Ok(v) = HeaderValue::from_str(&allowed) {
        headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, v);
        headers.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("x-request-id, retry-after"),
        );
        headers.append(header::VARY, HeaderValue::from_static("origin"));
    }
}

/// The routing fields of a body: JSON, or a multipart form (audio uploads)
/// whose `model` field names the model.
pub fn extract_meta(headers: &HeaderMap, body: &[u8]) -> Result<RequestMeta, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let Some(boundary) = multipart::boundary(content_type) else {
        return extract(body);
    };
    let model = multipart::field(body, boundary, "model")
        .filter(|m| !m.trim().is_empty())
        .ok_or_else(|| ApiError::BadRequest("missing required form field `model`".into()))?;
    Ok(RequestMeta {
        model: model.trim().to_owned(),
        stream: multipart::field(body, boundary, "stream").is_some_and(|s| s.trim() == "true"),
        ..RequestMeta::default()
    })
}

//! Request handling of one simulated replica: vLLM's OpenAI endpoints,
//! `/health`, `/metrics`, and `/sim/fault` to inject failures.
//!
//! Fault behaviour: `hang` holds every request except `/metrics` and
//! `/sim/fault` open without an answer until the replica stops;
//! `error_rate` answers that fraction of inference requests with a 500
//! before any work; `max_waiting` answers 503 while the engine queue holds
//! that many requests; during the startup delay `/health`, `/v1/models` and
//! inference answer 503. A request may ask for its own faults in an
//! `x-sim-fault` header (`request_faults.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arc_swap::ArcSwap;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::json;
use tokio::sync::{mpsc, oneshot, watch};

use super::config::SimConfig;
use super::driver::{Command, Refused, SimClock};
use super::engine::{EngineStats, NewRequest};
use super::faults::{FaultPatch, Faults};
use super::openai::{self, Api, KvAsk, ParseError};
use super::request_faults::RequestFaults;
use super::responses::Meta;
use super::stream::{AbortGuard, SseBody};
use crate::net::{ReadError, ResponseBody, error_response, full_body, read_body};
use crate::tokenize::PromptTokenizer;

/// Largest request body accepted.
const BODY_LIMIT: usize = 16 * 1024 * 1024;

/// State shared by the connections of one replica.
pub struct Replica {
    pub config: SimConfig,
    /// Counts prompt tokens (`config.tokenizer_dir`, else the stand-in).
    pub tokenizer: PromptTokenizer,
    pub faults: Arc<Faults>,
    pub stats: Arc<ArcSwap<EngineStats>>,
    pub commands: mpsc::UnboundedSender<Command>,
    pub clock: SimClock,
    /// Unix time the replica started (the `_created` metric series).
    pub created_unix: f64,
    pub next_id: AtomicU64,
    /// Drawn when the replica starts, never from the seed: two replicas
    /// with the same seed (two processes, or two in one) hand out
    /// different response ids.
    pub id_salt: u64,
    pub shutdown: watch::Receiver<bool>,
    /// Where the replica listens (named in the KV transfer parameters it
    /// answers as a prefill replica).
    pub addr: std::net::SocketAddr,
}

impl Replica {
    fn ready(&self) -> bool {
        self.clock.now() >= self.config.startup_delay
    }

    /// Waits until the replica stops (how a hung request ends).
    async fn stopped(&self) {
        let mut rx = self.shutdown.clone();
        let _ = rx.wait_for(|&stop| stop).await;
    }
}

/// Errors a replica answers itself, mapped to a status and vLLM's error type
/// in exactly one place.
#[derive(Debug, thiserror::Error)]
enum ReplicaError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("{0}")]
    QueueFull(String),
    #[error("the replica is starting up")]
    Starting,
    #[error("the replica is shutting down")]
    Stopped,
    #[error("injected failure (llmlb replica-sim error_rate or x-sim-fault)")]
    Injected,
    #[error(transparent)]
    Read(#[from] ReadError),
}

impl ReplicaError {
    fn into_response(self) -> Response<ResponseBody> {
        let (status, kind, code) = match &self {
            ReplicaError::BadRequest(_) => {
                (StatusCode::BAD_REQUEST, "BadRequestError", "bad_request")
            }
            ReplicaError::NotFound(_) => (StatusCode::NOT_FOUND, "NotFoundError", "not_found"),
            ReplicaError::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "BadRequestError",
                "method_not_allowed",
            ),
            ReplicaError::QueueFull(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailableError",
                "queue_full",
            ),
            ReplicaError::Starting => (
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailableError",
                "starting",
            ),
            ReplicaError::Stopped => (
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailableError",
                "shutting_down",
            ),
            ReplicaError::Injected => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalServerError",
                "injected_fault",
            ),
            ReplicaError::Read(ReadError::TooLarge { .. }) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "payload_too_large",
            ),
            ReplicaError::Read(ReadError::Broken(_)) => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "invalid_request",
            ),
        };
        error_response(status, kind, code, &self.to_string())
    }
}

pub async fn handle(r: Arc<Replica>, req: Request<Incoming>) -> Response<ResponseBody> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    match (&method, path.as_str()) {
        (&Method::GET, "/sim/fault") => {
            return json_response(StatusCode::OK, &faults_json(&r.faults));
        }
        (&Method::POST, "/sim/fault") => return set_faults(&r, req).await,
        (&Method::GET, "/metrics") => return metrics(&r),
        _ => {}
    }
    if r.faults.hang() {
        r.stopped().await;
        return ReplicaError::Stopped.into_response();
    }
    let faults = match RequestFaults::from_headers(req.headers()) {
        Ok(f) => f,
        Err(e) => return ReplicaError::BadRequest(e).into_response(),
    };
    if faults.stall {
        r.stopped().await;
        return ReplicaError::Stopped.into_response();
    }
    if faults.error {
        return ReplicaError::Injected.into_response();
    }
    let resp = answer(&r, &method, &path, req).await;
    if faults.shape_body() {
        return resp.map(|body| faults.apply(body));
    }
    resp
}

async fn answer(
    r: &Replica,
    method: &Method,
    path: &str,
    req: Request<Incoming>,
) -> Response<ResponseBody> {
    let result = match (method, path) {
        (&Method::GET | &Method::HEAD, "/health") => {
            if r.ready() {
                Ok(Response::new(full_body("")))
            } else {
                Err(ReplicaError::Starting)
            }
        }
        (&Method::GET, "/v1/models") => models(r),
        (&Method::POST, "/v1/completions") => infer(r, Api::Completions, req).await,
        (&Method::POST, "/v1/chat/completions") => infer(r, Api::Chat, req).await,
        (
            _,
            "/health"
            | "/v1/models"
            | "/v1/completions"
            | "/v1/chat/completions"
            | "/metrics"
            | "/sim/fault",
        ) => Err(ReplicaError::MethodNotAllowed),
        _ => Err(ReplicaError::NotFound(format!("no endpoint {path}"))),
    };
    result.unwrap_or_else(ReplicaError::into_response)
}

async fn infer(
    r: &Replica,
    api: Api,
    req: Request<Incoming>,
) -> Result<Response<ResponseBody>, ReplicaError> {
    if !r.ready() {
        return Err(ReplicaError::Starting);
    }
    if r.faults.draw_error() {
        return Err(ReplicaError::Injected);
    }
    let body = read_body(req.into_body(), BODY_LIMIT).await?;
    let parsed = openai::parse(api, &body, &r.config.model, &r.tokenizer).map_err(|e| match e {
        ParseError::Bad(m) => ReplicaError::BadRequest(m),
        e @ ParseError::UnknownModel(_) => ReplicaError::NotFound(e.to_string()),
    })?;
    let role = r.config.disaggregation.role;
    let external_tokens = match parsed.kv {
        KvAsk::RemoteDecode if !role.prefills_for_others() => {
            return Err(ReplicaError::BadRequest(format!(
                "this replica's role is {}: it does not prefill for another replica (kv_transfer_params.do_remote_decode)",
                role.as_str()
            )));
        }
        KvAsk::RemotePrefill { .. } if !role.decodes_for_others() => {
            return Err(ReplicaError::BadRequest(format!(
                "this replica's role is {}: it does not decode another replica's prefill (kv_transfer_params.do_remote_prefill)",
                role.as_str()
            )));
        }
        KvAsk::RemotePrefill { tokens } => {
            tokens.map_or(parsed.prompt.len(), |t| t.min(parsed.prompt.len()))
        }
        KvAsk::Local | KvAsk::RemoteDecode => 0,
    };
    let prompt_len = parsed.prompt.len();
    let id = r.next_id.fetch_add(1, Ordering::Relaxed);
    let (events, mut rx) = mpsc::unbounded_channel();
    let (reply, answer) = oneshot::channel();
    let mut guard = AbortGuard::new(id, r.commands.clone());
    let new = NewRequest {
        id,
        prompt: parsed.prompt,
        max_tokens: parsed.max_tokens.unwrap_or(r.config.default_max_tokens),
        priority: parsed.priority,
        external_tokens,
    };
    r.commands
        .send(Command::Add {
            req: new,
            events,
            reply,
        })
        .map_err(|_| ReplicaError::Stopped)?;
    match answer.await {
        Ok(Ok(())) => {}
        Ok(Err(refused)) => {
            guard.disarm();
            return Err(match refused {
                Refused::QueueFull { .. } => ReplicaError::QueueFull(refused.to_string()),
                Refused::Invalid(e) => ReplicaError::BadRequest(e.to_string()),
            });
        }
        Err(_) => {
            guard.disarm();
            return Err(ReplicaError::Stopped);
        }
    }
    let created = unix_now() as u64;
    let meta = Meta::new(api, mix_id(id, r.id_salt), created, &r.config.model);
    if parsed.stream {
        let body = SseBody::new(rx, meta, parsed.include_usage, guard);
        let mut resp = Response::new(body.boxed_unsync());
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream; charset=utf-8"),
        );
        resp.headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        return Ok(resp);
    }
    let mut text = String::new();
    while let Some(t) = rx.recv().await {
        text.push_str(t.text);
        if let Some(fin) = t.finished {
            guard.disarm();
            let mut answer = meta.response(&text, &fin);
            if parsed.kv == KvAsk::RemoteDecode {
                answer = with_transfer_params(r, &answer, id, prompt_len);
            }
            return Ok(json_text(StatusCode::OK, answer));
        }
    }
    guard.disarm();
    Err(ReplicaError::Stopped)
}

/// A prefill replica's answer with the `kv_transfer_params` that tell a
/// decode replica where the prompt's KV cache is (vLLM's NIXL connector
/// answers these; the simulated decode side needs only `do_remote_prefill`
/// and `remote_num_tokens`).
fn with_transfer_params(r: &Replica, answer: &str, id: u64, prompt_tokens: usize) -> String {
    let Ok(serde_json::Value::Object(mut map)) = serde_json::from_str(answer) else {
        return answer.to_string();
    };
    let bs = r.config.engine.block_size;
    let blocks: Vec<u64> = (0..prompt_tokens.div_ceil(bs) as u64).collect();
    let params = crate::kv_transfer::prefill_answer_params(
        &format!("llmlb-sim-{}", r.addr.port()),
        &format!("cmpl-{id}"),
        &r.addr.ip().to_string(),
        r.addr.port(),
        &blocks,
        prompt_tokens,
    );
    map.insert("kv_transfer_params".into(), params);
    serde_json::Value::Object(map).to_string()
}

fn models(r: &Replica) -> Result<Response<ResponseBody>, ReplicaError> {
    if !r.ready() {
        return Err(ReplicaError::Starting);
    }
    let created = r.created_unix as u64;
    let body = json!({
        "object": "list",
        "data": [{
            "id": r.config.model, "object": "model", "created": created,
            "owned_by": "llmlb-sim", "root": r.config.model, "parent": null,
            "max_model_len": r.config.engine.max_model_len,
        }],
    });
    Ok(json_response(StatusCode::OK, &body))
}

fn metrics(r: &Replica) -> Response<ResponseBody> {
    let stats = r.stats.load();
    let text = super::metrics::render(
        &stats,
        &r.config.engine,
        super::metrics::Refusals {
            queue_full: r.faults.refusals(),
        },
        &super::metrics::Labels {
            model: &r.config.model,
            engine: "0",
        },
        r.created_unix,
    );
    let mut resp = Response::new(full_body(text));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    resp
}

async fn set_faults(r: &Replica, req: Request<Incoming>) -> Response<ResponseBody> {
    let body = match read_body(req.into_body(), 64 * 1024).await {
        Ok(b) => b,
        Err(e) => return ReplicaError::from(e).into_response(),
    };
    let patch: FaultPatch = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => {
            return ReplicaError::BadRequest(format!("invalid fault patch: {e}")).into_response();
        }
    };
    match r.faults.apply(&patch) {
        Ok(_) => json_response(StatusCode::OK, &faults_json(&r.faults)),
        Err(e) => ReplicaError::BadRequest(e).into_response(),
    }
}

fn faults_json(f: &Faults) -> serde_json::Value {
    let s = f.snapshot();
    json!({
        "error_rate": s.error_rate,
        "hang": s.hang,
        "slowdown": s.slowdown,
        "max_waiting": s.max_waiting,
    })
}

fn json_response(status: StatusCode, v: &serde_json::Value) -> Response<ResponseBody> {
    json_text(status, v.to_string())
}

fn json_text(status: StatusCode, body: String) -> Response<ResponseBody> {
    let mut resp = Response::new(full_body(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// A response id that differs between replicas (their salts differ).
fn mix_id(id: u64, salt: u64) -> u64 {
    super::engine::kv_cache::mix64(id ^ salt.rotate_left(32))
}

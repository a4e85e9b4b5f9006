//! The OpenAI surface around the inference endpoints: every endpoint vLLM
//! serves is routed by `model` (JSON or multipart form), `GET /health` and
//! `GET /v1/models/{id}` are answered by llmlb, CORS when configured.

use crate::common;

use bytes::Bytes;
use common::{Mode, Upstream, call, chat_request, error_code, get_request, one_pool, start_llmlb};
use http::{Request, StatusCode};
use http_body_util::Full;

fn two_pools(a: &Upstream, b: &Upstream, extra: &str) -> String {
    format!(
        "{extra}\n{}\n[[pools]]\nname = \"whisper\"\nmodels = [\"whisper-large\"]\n[[pools.replicas]]\nurl = \"{}\"\n",
        one_pool("round_robin", &[(&a.url(), 1)], ""),
        b.url()
    )
}

#[tokio::test]
async fn every_vllm_endpoint_is_routed_by_model() {
    let llama = Upstream::start("llama", Mode::Json).await;
    let whisper = Upstream::start("whisper", Mode::Json).await;
    let lb = start_llmlb(&two_pools(&llama, &whisper, "")).await;
    let paths = [
        "/v1/responses",
        "/v1/rerank",
        "/v2/rerank",
        "/rerank",
        "/v1/score",
        "/score",
        "/tokenize",
        "/detokenize",
        "/v1/audio/speech",
    ];
    for path in paths {
        let body = r#"{"model":"llama-3-8b","input":"hi"}"#;
        let (status, _, _) = call(lb.addr, chat_request(path, body)).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(llama.last_seen().path, path);
    }
    assert_eq!(llama.requests(), paths.len());

    // An audio upload names its model in a form field.
    let form = "--b0undary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\nRIFF....\r\n--b0undary\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-large\r\n--b0undary--\r\n";
    let upload = |path: &str, body: &str| {
        Request::post(path)
            .header("host", "llmlb.test")
            .header("content-type", "multipart/form-data; boundary=b0undary")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap()
    };
    for path in ["/v1/audio/transcriptions", "/v1/audio/translations"] {
        let (status, _, _) = call(lb.addr, upload(path, form)).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        let seen = whisper.last_seen();
        assert_eq!(seen.path, path);
        assert_eq!(
            seen.body,
            Bytes::from(form),
            "the form is forwarded unchanged"
        );
    }
    let no_model = form.replace("name=\"model\"", "name=\"language\"");
    let (status, _, body) = call(lb.addr, upload("/v1/audio/transcriptions", &no_model)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(error_code(&body), "invalid_request");
    assert!(String::from_utf8_lossy(&body).contains("form field `model`"));
    assert_eq!(whisper.requests(), 2);
}

fn get(path: &str) -> Request<Full<Bytes>> {
    get_request(path, "llmlb.test")
}

#[tokio::test]
async fn health_and_model_retrieval_are_answered_by_llmlb() {
    let llama = Upstream::start("llama", Mode::Json).await;
    let whisper = Upstream::start("whisper", Mode::Json).await;
    let lb = start_llmlb(&two_pools(&llama, &whisper, "")).await;
    let (status, _, _) = call(lb.addr, get("/health")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, body) = call(lb.addr, get("/v1/models/whisper-large")).await;
    assert_eq!(status, StatusCode::OK);
    let model: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(model["id"], "whisper-large");
    assert_eq!(model["object"], "model");
    assert_eq!(model["owned_by"], "whisper");
    let (status, _, body) = call(lb.addr, get("/v1/models/nope")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(error_code(&body), "model_not_found");
    assert_eq!(llama.requests() + whisper.requests(), 0);
}

#[tokio::test]
async fn health_is_503_when_no_replica_is_up() {
    let dead = common::refused_addr().await;
    let cfg = one_pool(
        "round_robin",
        &[(&format!("http://{dead}"), 1)],
        "[pools.health]\nenabled = true\ninterval = \"50ms\"\ntimeout = \"40ms\"\nfall = 1",
    );
    let lb = start_llmlb(&cfg).await;
    common::until("the only replica is marked down", || !lb.state.is_ready()).await;
    let (status, _, body) = call(lb.addr, get("/health")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(error_code(&body), "no_healthy_replica");
}

/// A CORS preflight from `https://app.example`, asking for `method` when given.
fn preflight(method: Option<&str>) -> Request<Full<Bytes>> {
    let mut b = Request::options("/v1/chat/completions")
        .header("host", "llmlb.test")
        .header("origin", "https://app.example");
    if let Some(m) = method {
        b = b.header("access-control-request-method", m);
    }
    b.body(Full::new(Bytes::new())).unwrap()
}

#[tokio::test]
async fn cors_when_configured() {
    let llama = Upstream::start("llama", Mode::Json).await;
    let whisper = Upstream::start("whisper", Mode::Json).await;
    let lb = start_llmlb(&two_pools(
        &llama,
        &whisper,
        "[server.cors]\nallow_origins = [\"https://app.example\"]",
    ))
    .await;
    let (status, headers, _) = call(lb.addr, preflight(Some("POST"))).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        headers["access-control-allow-origin"],
        "https://app.example"
    );
    assert!(
        headers["access-control-allow-headers"]
            .to_str()
            .unwrap()
            .contains("authorization")
    );
    let mut req = chat_request("/v1/chat/completions", common::CHAT);
    req.headers_mut()
        .insert("origin", "https://app.example".parse().unwrap());
    let (status, headers, _) = call(lb.addr, req).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        headers["access-control-allow-origin"],
        "https://app.example"
    );
    let mut other = chat_request("/v1/chat/completions", common::CHAT);
    other
        .headers_mut()
        .insert("origin", "https://evil.example".parse().unwrap());
    let (_, headers, _) = call(lb.addr, other).await;
    assert!(headers.get("access-control-allow-origin").is_none());

    // Without [server.cors], no CORS headers and preflights are not answered.
    let plain = start_llmlb(&two_pools(&llama, &whisper, "")).await;
    let (status, headers, _) = call(plain.addr, preflight(None)).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(headers.get("access-control-allow-origin").is_none());
}

#[test]
fn active_health_checks_are_on_by_default() {
    let config =
        llmlb::config::parse(&one_pool("round_robin", &[("http://127.0.0.1:1", 1)], "")).unwrap();
    let health = &config.pools[0].health;
    assert!(
        health.enabled,
        "a dead fleet must show on /readyz and /health"
    );
    assert_eq!(health.path, "/health");
}

/// Model ids hold slashes; client libraries escape them in the path.
#[tokio::test]
async fn a_model_id_with_an_escaped_slash_is_found() {
    let llama = Upstream::start("llama", Mode::Json).await;
    let cfg = "[[pools]]\nname = \"meta\"\nmodels = [\"meta-llama/Llama-3.1-8B-Instruct\"]\n\
               [[pools.replicas]]\nurl = \"URL\"\n"
        .replace("URL", &llama.url());
    let lb = start_llmlb(&cfg).await;
    for path in [
        "/v1/models/meta-llama%2FLlama-3.1-8B-Instruct",
        "/v1/models/meta-llama%2fLlama-3.1-8B-Instruct",
        "/v1/models/meta-llama/Llama-3.1-8B-Instruct",
    ] {
        let (status, _, body) = call(lb.addr, get(path)).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        let model: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(model["id"], "meta-llama/Llama-3.1-8B-Instruct", "{path}");
    }
    let (status, _, _) = call(lb.addr, get("/v1/models/meta-llama%2FOther")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

/// A 405 names the methods the path answers, as RFC 9110 requires.
#[tokio::test]
async fn method_not_allowed_names_the_allowed_methods() {
    let llama = Upstream::start("llama", Mode::Json).await;
    let lb = start_llmlb(&one_pool("round_robin", &[(&llama.url(), 1)], "")).await;
    let request = |method: &str, path: &str| {
        Request::builder()
            .method(method)
            .uri(path)
            .header("host", "llmlb.test")
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    for (method, path, allow) in [
        ("GET", "/v1/chat/completions", "POST"),
        ("PUT", "/v1/completions", "POST"),
        ("POST", "/health", "GET, HEAD"),
        ("DELETE", "/v1/models/llama-3-8b", "GET, HEAD"),
        ("POST", "/v1/models", "GET"),
    ] {
        let (status, headers, body) = call(lb.addr, request(method, path)).await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert_eq!(error_code(&body), "method_not_allowed");
        assert_eq!(headers["allow"], allow, "{method} {path}");
    }
    let (status, headers, _) = call(lb.admin_addr, request("PUT", "/metrics")).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(headers["allow"], "GET, HEAD, POST");
}

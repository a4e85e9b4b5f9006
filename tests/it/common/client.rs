//! A small HTTP client for the tests: requests, one-connection clients,
//! streams held open, raw bytes on a socket, and reading the answers.

use super::*;

/// A one-connection HTTP/1.1 client whose connection the test controls.
pub struct Conn {
    pub sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    pub task: tokio::task::JoinHandle<()>,
}

impl Conn {
    pub async fn open(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        let task = tokio::spawn(async move {
            let _ = conn.await;
        });
        Conn { sender, task }
    }

    pub async fn send(&mut self, req: Request<Full<Bytes>>) -> Response<Incoming> {
        self.sender.ready().await.unwrap();
        self.sender.send_request(req).await.unwrap()
    }

    /// Closes the TCP connection as a client that goes away would.
    pub fn close(self) {
        self.task.abort();
    }
}

pub fn chat_request(path: &str, body: &str) -> Request<Full<Bytes>> {
    Request::post(path)
        .header("host", "llmlb.test")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// A chat request carrying `tier` in `x-llmlb-tier`.
pub fn tier_chat(body: &str, tier: &str) -> Request<Full<Bytes>> {
    let mut req = chat_request("/v1/chat/completions", body);
    req.headers_mut()
        .insert("x-llmlb-tier", tier.parse().unwrap());
    req
}

pub const CHAT: &str =
    r#"{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}],"max_tokens":8}"#;
pub const CHAT_STREAM: &str =
    r#"{"model":"llama-3-8b","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;

/// Sends one request on a fresh connection and returns status, headers and body.
pub async fn call(addr: SocketAddr, req: Request<Full<Bytes>>) -> (StatusCode, HeaderMap, Bytes) {
    let mut c = Conn::open(addr).await;
    let resp = c.send(req).await;
    let (parts, body) = resp.into_parts();
    let bytes = body.collect().await.unwrap().to_bytes();
    (parts.status, parts.headers, bytes)
}

/// Parses an OpenAI-style error body and returns its `code`.
pub fn error_code(body: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_else(|e| {
        panic!(
            "error body is not JSON ({e}): {}",
            String::from_utf8_lossy(body)
        )
    });
    let err = &v["error"];
    assert!(err["message"].is_string(), "no error.message in {v}");
    assert!(err["type"].is_string(), "no error.type in {v}");
    err["code"].as_str().expect("error.code").to_string()
}

/// Writes `bytes` on a fresh TCP connection (optionally closing the write
/// half afterwards) and returns everything the server sends until it closes
/// the connection or `limit` passes.
pub async fn raw_exchange(
    addr: SocketAddr,
    bytes: &[u8],
    half_close: bool,
    limit: Duration,
) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(bytes).await.unwrap();
    if half_close {
        s.shutdown().await.unwrap();
    }
    let mut out = Vec::new();
    let _ = tokio::time::timeout(limit, async {
        let mut buf = [0u8; 4096];
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => out.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    out
}

/// The status code of a raw HTTP/1.1 response, if it has a status line.
pub fn raw_status(response: &[u8]) -> Option<u16> {
    let text = std::str::from_utf8(response).ok()?;
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

/// Sends an admin `POST` and returns status and JSON body.
pub async fn admin_post(admin: SocketAddr, path: &str) -> (StatusCode, serde_json::Value) {
    let req = post_request(path, "admin");
    let (status, _, body) = call(admin, req).await;
    (
        status,
        serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
    )
}

/// `GET` on the admin listener: status and body text.
pub async fn admin_get(admin: SocketAddr, path: &str) -> (StatusCode, String) {
    let req = get_request(path, "admin");
    let (status, _, body) = call(admin, req).await;
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// Sends a streaming chat on a connection of its own and returns the
/// connection and the response, unread.
pub async fn open_stream(addr: SocketAddr) -> (Conn, Response<Incoming>) {
    let mut conn = Conn::open(addr).await;
    let resp = conn
        .send(chat_request("/v1/chat/completions", CHAT_STREAM))
        .await;
    (conn, resp)
}

/// A streaming chat held open: the first chunk has arrived, the rest waits
/// for the replica (or the test) to let it go.
pub async fn held_stream(addr: SocketAddr) -> (Conn, Incoming) {
    let (conn, resp) = open_stream(addr).await;
    let mut body = resp.into_body();
    body.frame()
        .await
        .expect("a first chunk")
        .expect("the first chunk reads");
    (conn, body)
}

/// Asserts the status of a raw HTTP/1.1 response, showing it when it differs.
pub fn assert_raw_status(response: &[u8], want: u16) {
    assert_eq!(
        raw_status(response),
        Some(want),
        "{}",
        String::from_utf8_lossy(response)
    );
}

/// The string `field` of every element of the array `v[array]` (the model
/// ids of a `/v1/models` listing, the keys of config issues, ...).
pub fn strings_of<'a>(v: &'a serde_json::Value, array: &str, field: &str) -> Vec<&'a str> {
    let items = v[array]
        .as_array()
        .unwrap_or_else(|| panic!("no array {array} in {v}"));
    items
        .iter()
        .map(|item| {
            item[field]
                .as_str()
                .unwrap_or_else(|| panic!("no string {field} in {item}"))
        })
        .collect()
}

/// The replica named `name` in an admin `/admin/replicas` (or status) document.
pub fn replica_entry<'a>(doc: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    doc["pools"][0]["replicas"]
        .as_array()
        .unwrap_or_else(|| panic!("no replicas in {doc}"))
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no replica {name} in {doc}"))
}

/// A `GET` of `path` with an empty body.
pub fn get_request(path: &str, host: &str) -> Request<Full<Bytes>> {
    Request::get(path)
        .header("host", host)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// A `POST` to `path` with an empty body.
pub fn post_request(path: &str, host: &str) -> Request<Full<Bytes>> {
    Request::post(path)
        .header("host", host)
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// Lets `up` finish one held stream and checks that `body` then ends with
/// `[DONE]`; `what` names the stream in the failure.
pub async fn finish_stream(up: &Upstream, body: Incoming, what: &str) {
    up.release_one();
    let rest = body.collect().await.expect("the stream reads").to_bytes();
    assert!(
        rest.ends_with(b"data: [DONE]\n\n"),
        "{what}: {}",
        String::from_utf8_lossy(&rest)
    );
}

/// A chat body for model `llama-3-8b` whose system prompt (one of many,
/// by `system_id`) spans several cache blocks.
pub fn support_chat(system_id: usize, question: &str) -> String {
    let system = format!(
        "You are assistant number {system_id} of the support desk. Answer politely, cite the \
         order number, and never promise a delivery date you cannot check. "
    )
    .repeat(3);
    serde_json::json!({
        "model": "llama-3-8b",
        "max_tokens": 8,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question}
        ]
    })
    .to_string()
}

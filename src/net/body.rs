//! Body types shared by every HTTP front and client in llmlb (the proxy, its
//! admin listener, the simulated replica): the boxed response body, a body of
//! known bytes, reading a request body whole under a size limit, and the
//! OpenAI-style JSON error body.

use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Limited};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type ResponseBody = UnsyncBoxBody<Bytes, BoxError>;

/// A body of known bytes.
pub fn full_body(bytes: impl Into<Bytes>) -> ResponseBody {
    http_body_util::Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// Why a request body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("request body is larger than the limit of {limit} bytes")]
    TooLarge { limit: usize },
    #[error("could not read request body: {0}")]
    Broken(String),
}

/// Reads the whole body, refusing it as soon as it exceeds `limit` (at once
/// when the declared `Content-Length` already does).
pub async fn read_body<B>(headers: &HeaderMap, body: B, limit: usize) -> Result<Bytes, ReadError>
where
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    read_declared(declared, body, limit).await
}

/// [`read_body`] for a caller that has read the declared `Content-Length`
/// (`declared`, when there is a valid one) already.
pub async fn read_declared<B>(
    declared: Option<u64>,
    body: B,
    limit: usize,
) -> Result<Bytes, ReadError>
where
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(ReadError::TooLarge { limit });
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ReadError::TooLarge { limit }),
        Err(e) => Err(ReadError::Broken(e.to_string())),
    }
}

/// An OpenAI-style error: `{"error":{"message","type","param","code"}}`.
pub fn error_response(
    status: StatusCode,
    kind: &str,
    code: &str,
    message: &str,
) -> Response<ResponseBody> {
    json_error(status, kind, code, message, None)
}

/// [`error_response`] naming the offending request field (`param`).
pub fn json_error(
    status: StatusCode,
    kind: &str,
    code: &str,
    message: &str,
    param: Option<&str>,
) -> Response<ResponseBody> {
    let body = serde_json::json!({
        "error": {"message": message, "type": kind, "param": param, "code": code}
    });
    let mut resp = Response::new(full_body(body.to_string()));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    resp
}

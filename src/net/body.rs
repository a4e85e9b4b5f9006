//! Body types shared by every HTTP front and client in llmlb (the proxy, its
//! admin listener, the simulated replica): the boxed response body, a body of
//! known bytes, reading a request body whole under a size limit, and the
//! OpenAI-style JSON error body.

use bytes::{Buf, Bytes};
use http::{Response, StatusCode, header};
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
/// when its declared length already does). The declared length is the
/// body's exact size hint: hyper's from `Content-Length` (it refuses a
/// request whose length does not parse).
pub async fn read_body<B>(body: B, limit: usize) -> Result<Bytes, ReadError>
where
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    let declared = body.size_hint().exact();
    read_declared(declared, body, limit).await
}

/// [`read_body`] with the body's declared length, `declared`.
///
/// A body with a declared length is done once that many bytes are in: the
/// HTTP framing ends it there, so its end is not waited for. hyper hands
/// the end of a request body over one turn of the connection after its
/// last bytes; not waiting for it lets a small request's read finish in
/// the poll that finds its bytes (no timer armed around it, no second
/// wake-up of the connection's task). A body that ends before its
/// declared length is what it is (hyper reports such a body broken).
async fn read_declared<B>(declared: Option<u64>, body: B, limit: usize) -> Result<Bytes, ReadError>
where
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    let Some(expected) = declared else {
        return read_to_end(body, limit).await;
    };
    if expected > limit as u64 {
        return Err(ReadError::TooLarge { limit });
    }
    let expected = expected as usize;
    let mut body = std::pin::pin!(body);
    let mut first = Bytes::new();
    let mut joined: Option<bytes::BytesMut> = None;
    let mut received = 0;
    while received < expected {
        let data = match body.frame().await {
            None => break,
            Some(Err(e)) => return Err(ReadError::Broken(e.into().to_string())),
            Some(Ok(frame)) => match frame.into_data() {
                // `Bytes` (hyper's) hands itself over without a copy.
                Ok(mut data) => data.copy_to_bytes(data.remaining()),
                Err(_trailers) => continue,
            },
        };
        received += data.len();
        if received > limit {
            return Err(ReadError::TooLarge { limit });
        }
        // One chunk (the usual small request) is kept as it came.
        match &mut joined {
            Some(buf) => buf.extend_from_slice(&data),
            None if first.is_empty() => first = data,
            None => {
                let mut buf = bytes::BytesMut::with_capacity(expected.max(received));
                buf.extend_from_slice(&first);
                buf.extend_from_slice(&data);
                joined = Some(buf);
            }
        }
    }
    Ok(joined.map_or(first, bytes::BytesMut::freeze))
}

/// A body without a declared length, read to its end under `limit`.
async fn read_to_end<B>(body: B, limit: usize) -> Result<Bytes, ReadError>
where
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
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

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream::{self, StreamExt};
    use http_body::Frame;
    use http_body_util::StreamBody;
    use std::convert::Infallible;

    /// `chunks` as a body's data frames.
    fn frames(
        chunks: &[&'static str],
    ) -> impl stream::Stream<Item = Result<Frame<Bytes>, Infallible>> {
        let frames: Vec<_> = chunks
            .iter()
            .map(|c| Ok(Frame::data(Bytes::from_static(c.as_bytes()))))
            .collect();
        stream::iter(frames)
    }

    /// A body of `chunks` that never ends after them.
    fn unending(chunks: &[&'static str]) -> impl http_body::Body<Data = Bytes, Error = Infallible> {
        StreamBody::new(frames(chunks).chain(stream::pending()))
    }

    /// A body of `chunks` that ends after them.
    fn ending(chunks: &[&'static str]) -> impl http_body::Body<Data = Bytes, Error = Infallible> {
        StreamBody::new(frames(chunks))
    }

    #[tokio::test]
    async fn a_declared_body_is_done_at_its_length_without_its_end() {
        let one = read_declared(Some(5), unending(&["hello"]), 64)
            .await
            .unwrap();
        assert_eq!(&one[..], b"hello");
        let joined = read_declared(Some(11), unending(&["hello", " ", "world"]), 64)
            .await
            .unwrap();
        assert_eq!(&joined[..], b"hello world");
        let empty = read_declared(Some(0), unending(&[]), 64).await.unwrap();
        assert!(empty.is_empty());
    }

    #[tokio::test]
    async fn limits_hold_with_and_without_a_declared_length() {
        let declared = read_declared(Some(100), unending(&["x"]), 10).await;
        assert!(matches!(declared, Err(ReadError::TooLarge { limit: 10 })));
        // A body longer than it declared is refused past the limit all the same.
        let lying = read_declared(Some(8), ending(&["0123456789ab"]), 10).await;
        assert!(matches!(lying, Err(ReadError::TooLarge { limit: 10 })));
        let unknown = read_declared(None, ending(&["0123456", "789ab"]), 10).await;
        assert!(matches!(unknown, Err(ReadError::TooLarge { limit: 10 })));
        let fits = read_declared(None, ending(&["01234", "56789"]), 10)
            .await
            .unwrap();
        assert_eq!(&fits[..], b"0123456789");
    }

    #[tokio::test]
    async fn a_short_or_broken_body_is_reported_as_it_came() {
        let short = read_declared(Some(10), ending(&["abc"]), 64).await.unwrap();
        assert_eq!(&short[..], b"abc");
        let frames: Vec<Result<Frame<Bytes>, std::io::Error>> = vec![
            Ok(Frame::data(Bytes::from_static(b"ab"))),
            Err(std::io::Error::other("reset")),
        ];
        let broken = read_declared(Some(10), StreamBody::new(stream::iter(frames)), 64).await;
        assert!(matches!(broken, Err(ReadError::Broken(m)) if m.contains("reset")));
    }
}

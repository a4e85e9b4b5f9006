//! An instant OpenAI-compatible backend on loopback: every POST is answered
//! at once with a short canned SSE stream (`tokens` content chunks, a usage
//! chunk, `[DONE]`). It measures the load generator's own ceiling, and gives
//! proxy benchmarks an upstream that is never the bottleneck.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// The canned answer: `tokens` completion chunks, usage, `[DONE]`.
pub fn canned_stream(tokens: usize) -> Bytes {
    let mut s = String::new();
    for i in 0..tokens {
        s.push_str(&format!(
            "data: {{\"id\":\"cmpl-instant\",\"object\":\"text_completion\",\"choices\":[{{\"index\":0,\"text\":\" t{i}\",\"finish_reason\":null}}]}}\n\n"
        ));
    }
    s.push_str(&format!(
        "data: {{\"id\":\"cmpl-instant\",\"object\":\"text_completion\",\"choices\":[],\"usage\":{{\"prompt_tokens\":1,\"completion_tokens\":{tokens},\"total_tokens\":{}}}}}\n\n",
        tokens + 1
    ));
    s.push_str("data: [DONE]\n\n");
    Bytes::from(s)
}

pub struct InstantBackend {
    pub addr: SocketAddr,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl InstantBackend {
    /// Serves on `listener` (bind `127.0.0.1:0`) until [`stop`](Self::stop).
    pub fn start(listener: TcpListener, tokens: usize) -> std::io::Result<InstantBackend> {
        let addr = listener.local_addr()?;
        let body = canned_stream(tokens);
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let builder = auto::Builder::new(TokioExecutor::new()).http1_only();
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        let _ = stream.set_nodelay(true);
                        let body = body.clone();
                        let service = service_fn(move |req: Request<Incoming>| {
                            let body = body.clone();
                            async move { Ok::<_, Infallible>(answer(req, body).await) }
                        });
                        let conn = builder.serve_connection(TokioIo::new(stream), service).into_owned();
                        conns.spawn(async move { let _ = conn.await; });
                        while conns.try_join_next().is_some() {}
                    }
                    _ = stopped.changed() => break,
                }
            }
            conns.shutdown().await;
        });
        Ok(InstantBackend { addr, stop, task })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting and closes every connection.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

async fn answer(req: Request<Incoming>, body: Bytes) -> Response<Full<Bytes>> {
    let post = req.method() == http::Method::POST;
    // Read the request fully, as a real server does.
    let _ = req.into_body().collect().await;
    let mut resp = Response::new(Full::new(if post { body } else { Bytes::new() }));
    if post {
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            header::HeaderValue::from_static("text/event-stream"),
        );
    } else {
        *resp.status_mut() = StatusCode::METHOD_NOT_ALLOWED;
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::sse::{Chunk, SseParser, classify};

    #[test]
    fn canned_stream_is_valid_sse() {
        let mut kinds = Vec::new();
        SseParser::default().feed(&canned_stream(3), |d| kinds.push(classify(d)));
        assert_eq!(kinds.len(), 5);
        assert!(kinds[..3].iter().all(|k| *k
            == Chunk::Data {
                content: true,
                completion_tokens: None,
                prompt_tokens: None,
            }));
        assert_eq!(
            kinds[3],
            Chunk::Data {
                content: false,
                completion_tokens: Some(3),
                prompt_tokens: Some(1),
            }
        );
        assert_eq!(kinds[4], Chunk::Done);
    }
}

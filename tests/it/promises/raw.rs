//! A replica that misbehaves at the TCP level, which a well-behaved hyper
//! server cannot be made to do: it reads a whole request and then closes the
//! connection without answering, or breaks a stream after its first event.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Clone, Copy, Debug)]
pub enum Misbehaviour {
    /// Reads the request, then closes without a byte of answer.
    CloseAfterRequest,
    /// Answers 200 SSE with one event, then closes mid-stream.
    BreakMidStream,
}

pub struct RawUpstream {
    pub addr: SocketAddr,
    /// Complete requests read.
    pub requests: Arc<AtomicUsize>,
}

impl RawUpstream {
    pub async fn start(how: Misbehaviour) -> RawUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let count = requests.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let count = count.clone();
                tokio::spawn(serve(stream, how, count));
            }
        });
        RawUpstream { addr, requests }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

async fn serve(mut stream: TcpStream, how: Misbehaviour, count: Arc<AtomicUsize>) {
    if !read_request(&mut stream).await {
        return;
    }
    count.fetch_add(1, Ordering::SeqCst);
    if let Misbehaviour::BreakMidStream = how {
        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
        let event = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n";
        let chunk = format!("{head}{:x}\r\n{event}\r\n", event.len());
        let _ = stream.write_all(chunk.as_bytes()).await;
        let _ = stream.flush().await;
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Dropping the stream closes it without finishing the answer.
}

/// Reads one request head and its `content-length` body.
async fn read_request(stream: &mut TcpStream) -> bool {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let Ok(n) = stream.read(&mut chunk).await else {
            return false;
        };
        if n == 0 {
            return false;
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if buf.len() >= end + 4 + len {
            return true;
        }
    }
}

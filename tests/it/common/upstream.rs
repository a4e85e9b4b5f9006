//! A scriptable OpenAI-style replica on a real loopback socket: answers
//! JSON, holds streams until released, hangs, or fails with a status.

use super::*;

/// How a fake replica answers.
#[derive(Clone, Debug)]
pub enum Mode {
    /// 200 with a small JSON body naming the replica.
    Json,
    /// 200 SSE: one chunk at once, the rest only after `release()`.
    StreamHeld,
    /// 200 SSE head at once; the first chunk after one `release()`, the
    /// end after another (a prompt still prefilling until released).
    FirstHeld,
    /// Never answers (headers never come).
    Hang,
    /// Answers with this status and an error body.
    Status(u16),
    /// 400 to a body that carries `stream_options` (a server that does not
    /// know the field), else as `Json`.
    NoStreamOptions,
}

/// What the replica saw of one request.
#[derive(Clone, Debug)]
pub struct Seen {
    pub headers: HeaderMap,
    pub body: Bytes,
    pub path: String,
    /// Which connection it came on (in the order they were accepted).
    pub conn: usize,
}

pub struct Upstream {
    pub addr: SocketAddr,
    pub name: String,
    pub mode: Arc<Mutex<Mode>>,
    pub seen: Arc<Mutex<Vec<Seen>>>,
    /// Responses (or pending answers) whose client connection went away.
    pub closed: Arc<AtomicUsize>,
    pub closed_notify: Arc<Notify>,
    pub release: Arc<Notify>,
    /// Streams currently held open.
    pub open_streams: Arc<AtomicUsize>,
    /// Connections accepted.
    pub accepted: Arc<AtomicUsize>,
}

impl Upstream {
    pub async fn start(name: &str, mode: Mode) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let up = Upstream {
            addr,
            name: name.to_string(),
            mode: Arc::new(Mutex::new(mode)),
            seen: Arc::default(),
            closed: Arc::default(),
            closed_notify: Arc::default(),
            release: Arc::default(),
            open_streams: Arc::default(),
            accepted: Arc::default(),
        };
        let shared = up.shared();
        let accepted = Arc::clone(&up.accepted);
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let conn = accepted.fetch_add(1, Ordering::SeqCst);
                let shared = shared.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| {
                        let shared = shared.clone();
                        async move { Ok::<_, Infallible>(shared.answer(req, conn).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        up
    }

    /// Replicas with these names, all answering in `mode`.
    pub async fn many<const N: usize>(names: [&str; N], mode: Mode) -> [Upstream; N] {
        let mut out = Vec::with_capacity(N);
        for name in names {
            out.push(Upstream::start(name, mode.clone()).await);
        }
        out.try_into()
            .unwrap_or_else(|_| unreachable!("N replicas"))
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_mode(&self, mode: Mode) {
        *self.mode.lock().unwrap() = mode;
    }

    pub fn requests(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    pub fn last_seen(&self) -> Seen {
        self.seen
            .lock()
            .unwrap()
            .last()
            .cloned()
            .expect("a request")
    }

    /// Lets one held stream finish.
    pub fn release_one(&self) {
        self.release.notify_one();
    }

    /// Waits until `n` connections have been seen closing early, or panics after `limit`.
    pub async fn wait_closed(&self, n: usize, limit: Duration) {
        tokio::time::timeout(limit, async {
            while self.closed.load(Ordering::SeqCst) < n {
                let notified = self.closed_notify.notified();
                if self.closed.load(Ordering::SeqCst) >= n {
                    break;
                }
                notified.await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{}: connection not closed within {limit:?}", self.name));
    }

    fn shared(&self) -> Shared {
        Shared {
            name: self.name.clone(),
            mode: self.mode.clone(),
            seen: self.seen.clone(),
            closed: self.closed.clone(),
            closed_notify: self.closed_notify.clone(),
            release: self.release.clone(),
            open_streams: self.open_streams.clone(),
        }
    }
}

#[derive(Clone)]
struct Shared {
    name: String,
    mode: Arc<Mutex<Mode>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    closed: Arc<AtomicUsize>,
    closed_notify: Arc<Notify>,
    release: Arc<Notify>,
    open_streams: Arc<AtomicUsize>,
}

impl Shared {
    async fn answer(&self, req: Request<Incoming>, conn: usize) -> Response<ChannelBody> {
        // Active health checks (on by default) get vLLM's answer whatever
        // the mode, and are not counted among the requests the replica saw.
        if req.method() == http::Method::GET && req.uri().path() == "/health" {
            return Response::new(ChannelBody::Fixed(Some(Bytes::new())));
        }
        let (parts, body) = req.into_parts();
        let body = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        self.seen.lock().unwrap().push(Seen {
            headers: parts.headers,
            body,
            path: parts.uri.path().to_string(),
            conn,
        });
        let mut mode = self.mode.lock().unwrap().clone();
        if let Mode::NoStreamOptions = mode {
            let last = self.seen.lock().unwrap().last().map(|s| s.body.clone());
            let named =
                last.is_some_and(|b| String::from_utf8_lossy(&b).contains("stream_options"));
            mode = if named { Mode::Status(400) } else { Mode::Json };
        }
        match mode {
            Mode::NoStreamOptions => unreachable!("resolved above"),
            Mode::Json => {
                let body = format!(
                    r#"{{"replica":"{}","object":"chat.completion","usage":{{"prompt_tokens":4,"completion_tokens":6,"total_tokens":10}}}}"#,
                    self.name
                );
                ChannelBody::fixed(StatusCode::OK, "application/json", body)
            }
            Mode::Status(code) => ChannelBody::fixed(
                StatusCode::from_u16(code).unwrap(),
                "application/json",
                r#"{"error":{"message":"replica says no","type":"server_error","code":null}}"#
                    .into(),
            ),
            Mode::Hang => {
                // Never answer; notice when the caller gives up on us.
                let guard = CloseWatch(self.clone());
                std::future::pending::<()>().await;
                drop(guard);
                unreachable!()
            }
            Mode::FirstHeld => {
                let (tx, rx) = mpsc::channel::<Bytes>(16);
                let me = self.clone();
                self.open_streams.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    me.release.notified().await;
                    let first = format!("data: {{\"replica\":\"{}\",\"n\":1}}\n\n", me.name);
                    let _ = tx.send(Bytes::from(first)).await;
                    me.release.notified().await;
                    let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
                    me.open_streams.fetch_sub(1, Ordering::SeqCst);
                });
                ChannelBody::event_stream(rx)
            }
            Mode::StreamHeld => {
                let (tx, rx) = mpsc::channel::<Bytes>(16);
                let me = self.clone();
                self.open_streams.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let first = format!("data: {{\"replica\":\"{}\",\"n\":1}}\n\n", me.name);
                    let _ = tx.send(Bytes::from(first)).await;
                    tokio::select! {
                        _ = me.release.notified() => {
                            let _ = tx.send(Bytes::from_static(b"data: {\"n\":2}\n\n")).await;
                            let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
                        }
                        _ = tx.closed() => {
                            me.closed.fetch_add(1, Ordering::SeqCst);
                            me.closed_notify.notify_waiters();
                        }
                    }
                    me.open_streams.fetch_sub(1, Ordering::SeqCst);
                });
                ChannelBody::event_stream(rx)
            }
        }
    }
}

/// Counts a pending answer whose future was dropped (the connection closed).
struct CloseWatch(Shared);

impl Drop for CloseWatch {
    fn drop(&mut self) {
        self.0.closed.fetch_add(1, Ordering::SeqCst);
        self.0.closed_notify.notify_waiters();
    }
}

pub enum ChannelBody {
    Fixed(Option<Bytes>),
    Channel(mpsc::Receiver<Bytes>),
}

impl ChannelBody {
    /// A 200 SSE answer whose events come from `rx`.
    fn event_stream(rx: mpsc::Receiver<Bytes>) -> Response<ChannelBody> {
        let mut resp = Response::new(ChannelBody::Channel(rx));
        resp.headers_mut()
            .insert("content-type", "text/event-stream".parse().unwrap());
        resp
    }

    fn fixed(status: StatusCode, content_type: &str, body: String) -> Response<ChannelBody> {
        let mut resp = Response::new(ChannelBody::Fixed(Some(Bytes::from(body))));
        *resp.status_mut() = status;
        resp.headers_mut()
            .insert("content-type", content_type.parse().unwrap());
        resp
    }
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.get_mut() {
            ChannelBody::Fixed(b) => Poll::Ready(b.take().map(|b| Ok(Frame::data(b)))),
            ChannelBody::Channel(rx) => rx.poll_recv(cx).map(|o| o.map(|b| Ok(Frame::data(b)))),
        }
    }
}

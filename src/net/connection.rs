//! One client connection: hyper serves it, llmlb watches it.
//!
//! The socket is wrapped so every byte read or written stamps the
//! connection's [`Activity`], and every request holds a guard until its
//! response body ends. From those two facts the watcher closes a connection
//! that is
//! - idle: no request in flight and no bytes either way for
//!   `client_idle_timeout`, or
//! - slow to send its head: bytes of a new request arrived but the head is
//!   not complete (hyper has not called the service) `header_read_timeout`
//!   after the first of them (slowloris).
//!
//! Timers run on the tokio clock; a connection with a request in flight is
//! never closed by the watcher (the per-pool first-byte and idle-stream
//! timeouts bound those). On listener shutdown the connection is asked to
//! finish gracefully (HTTP/1.1: close after the current response; HTTP/2:
//! GOAWAY), and dropped when the drain timeout forces it.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use futures_util::task::AtomicWaker;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio::time::Instant;

/// What the listener asks of its open connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Serve,
    /// Finish the requests in flight, take no new ones.
    Graceful,
    /// Drain timeout reached: close now.
    Force,
}

const NONE: u64 = u64::MAX;

/// Shared between the socket wrapper, the request guards and the watcher.
#[derive(Debug)]
pub struct Activity {
    opened: Instant,
    /// Milliseconds since `opened` of the last byte read or written, or of
    /// the end of the last response.
    last_io: AtomicU64,
    /// Milliseconds since `opened` of the first byte of a request head not
    /// yet complete; `NONE` when no head is being read.
    head_started: AtomicU64,
    in_flight: AtomicUsize,
}

/// Why the watcher closed a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expiry {
    Idle,
    HeaderTimeout,
}

/// How a connection ended: the `reason` label of
/// `llmlb_client_connections_closed_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The client closed it, or hyper did (protocol error, keep-alive off).
    Normal,
    Idle,
    HeaderTimeout,
    /// Still open when the drain timeout ran out.
    DrainTimeout,
    /// TLS handshake failed or timed out.
    Handshake,
}

impl Ended {
    pub fn label(self) -> &'static str {
        match self {
            Ended::Normal => "normal",
            Ended::Idle => "idle_timeout",
            Ended::HeaderTimeout => "header_timeout",
            Ended::DrainTimeout => "drain_timeout",
            Ended::Handshake => "tls_handshake",
        }
    }
}

impl Activity {
    pub fn new() -> Arc<Activity> {
        Arc::new(Activity {
            opened: Instant::now(),
            last_io: AtomicU64::new(0),
            head_started: AtomicU64::new(NONE),
            in_flight: AtomicUsize::new(0),
        })
    }

    fn now_ms(&self) -> u64 {
        self.opened.elapsed().as_millis() as u64
    }

    fn saw_read(&self) {
        let now = self.now_ms();
        self.last_io.store(now, Ordering::Relaxed);
        if self.in_flight.load(Ordering::Relaxed) == 0 {
            let _ =
                self.head_started
                    .compare_exchange(NONE, now, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    fn saw_write(&self) {
        self.last_io.store(self.now_ms(), Ordering::Relaxed);
    }

    /// Counts a request (its head is complete) until the guard is dropped.
    pub fn begin(self: &Arc<Self>) -> RequestGuard {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.head_started.store(NONE, Ordering::Relaxed);
        RequestGuard(Arc::clone(self))
    }

    /// `Ok(wait)`: check again after `wait`; `Err(why)`: close the connection.
    pub fn check(&self, idle: Duration, header: Duration) -> Result<Duration, Expiry> {
        self.check_at(self.now_ms(), idle, header)
    }

    fn check_at(&self, now: u64, idle: Duration, header: Duration) -> Result<Duration, Expiry> {
        let (idle, header) = (idle.as_millis() as u64, header.as_millis() as u64);
        if self.in_flight.load(Ordering::Relaxed) > 0 {
            return Ok(Duration::from_millis(idle.min(header).max(1)));
        }
        let head = self.head_started.load(Ordering::Relaxed);
        let (deadline, why) = if head != NONE {
            (head.saturating_add(header), Expiry::HeaderTimeout)
        } else {
            let last = self.last_io.load(Ordering::Relaxed);
            (last.saturating_add(idle), Expiry::Idle)
        };
        if now >= deadline {
            Err(why)
        } else {
            Ok(Duration::from_millis(deadline - now))
        }
    }
}

/// One request in flight on a connection.
#[derive(Debug)]
pub struct RequestGuard(Arc<Activity>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.0.saw_write();
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

pin_project_lite::pin_project! {
    /// A socket that reports its traffic to an [`Activity`].
    pub struct TrackedIo<T> {
        #[pin]
        inner: T,
        activity: Arc<Activity>,
    }
}

impl<T> TrackedIo<T> {
    pub fn new(inner: T, activity: Arc<Activity>) -> TrackedIo<T> {
        TrackedIo { inner, activity }
    }
}

impl<T: AsyncRead> AsyncRead for TrackedIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.project();
        let before = buf.filled().len();
        let polled = this.inner.poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.activity.saw_read();
        }
        polled
    }
}

impl<T: AsyncWrite> AsyncWrite for TrackedIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let polled = this.inner.poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.saw_write();
        }
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.project();
        let polled = this.inner.poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            this.activity.saw_write();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.project().inner.poll_shutdown(cx)
    }
}

/// Drives `conn` until it ends, the watcher expires it, or the listener
/// forces it closed; `graceful` asks it to finish (called once, when the
/// listener turns graceful).
pub async fn drive<C, E>(
    conn: C,
    mut graceful: impl FnMut(Pin<&mut C>),
    activity: Arc<Activity>,
    (idle, header): (Duration, Duration),
    mut phase: watch::Receiver<Phase>,
    peer: std::net::SocketAddr,
) -> Ended
where
    C: Future<Output = Result<(), E>>,
    E: std::fmt::Display,
{
    let mut conn = std::pin::pin!(conn);
    let mut finishing = false;
    let mut wait = Duration::ZERO;
    let watchers = Arc::new(Watchers::default());
    let waker = Waker::from(Arc::clone(&watchers));
    loop {
        if !finishing && *phase.borrow() == Phase::Graceful {
            finishing = true;
            graceful(conn.as_mut());
        }
        let woke = {
            let mut sleep = std::pin::pin!(tokio::time::sleep(wait));
            let mut changed = std::pin::pin!(phase.changed());
            // New watchers: polled once whatever woke the task.
            watchers.woken.store(true, Ordering::Relaxed);
            std::future::poll_fn(|cx| {
                if let Poll::Ready(ended) = conn.as_mut().poll(cx) {
                    return Poll::Ready(Woke::Ended(ended));
                }
                if !watchers.woke(cx) {
                    return Poll::Pending;
                }
                let mut cx = Context::from_waker(&waker);
                if sleep.as_mut().poll(&mut cx).is_ready() {
                    return Poll::Ready(Woke::Timer);
                }
                changed
                    .as_mut()
                    .poll(&mut cx)
                    .map(|changed| Woke::Phase(changed.is_ok()))
            })
            .await
        };
        match woke {
            Woke::Ended(ended) => {
                if let Err(e) = ended {
                    tracing::debug!(error = %e, %peer, "connection ended with an error");
                }
                return Ended::Normal;
            }
            Woke::Timer => match activity.check(idle, header) {
                Ok(next) => wait = next,
                Err(why) => {
                    tracing::debug!(%peer, reason = ?why, "closing client connection");
                    return match why {
                        Expiry::Idle => Ended::Idle,
                        Expiry::HeaderTimeout => Ended::HeaderTimeout,
                    };
                }
            },
            Woke::Phase(open) => {
                if !open || *phase.borrow() == Phase::Force {
                    return Ended::DrainTimeout;
                }
            }
        }
    }
}

/// What [`drive`] woke for: the connection ended, its timer fired, or the
/// listener's phase changed (`false`: the listener is gone).
enum Woke<E> {
    Ended(Result<(), E>),
    Timer,
    Phase(bool),
}

/// The waker of a connection's watchers (its timer and the listener's
/// phase): wakes the connection's task and notes that a watcher woke it.
/// The task polls the watchers only then; most wakes are the connection's
/// own (a read, a write, an answer), and polling both watchers on each
/// cost about 0.3 k instructions a wake.
#[derive(Default)]
struct Watchers {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl Watchers {
    /// Whether a watcher woke the task since the last call; `cx`'s waker
    /// is the one a watcher wakes next.
    fn woke(&self, cx: &Context<'_>) -> bool {
        // Registered before the flag is read: a watcher that fires after
        // the read wakes the task again.
        self.task.register(cx.waker());
        self.woken.swap(false, Ordering::Acquire)
    }
}

impl Wake for Watchers {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: Duration = Duration::from_millis(1000);
    const HEAD: Duration = Duration::from_millis(100);

    fn activity() -> Activity {
        Activity {
            opened: Instant::now(),
            last_io: AtomicU64::new(0),
            head_started: AtomicU64::new(NONE),
            in_flight: AtomicUsize::new(0),
        }
    }

    #[test]
    fn idle_connection_expires_after_the_idle_timeout() {
        let a = activity();
        assert_eq!(a.check_at(400, IDLE, HEAD), Ok(Duration::from_millis(600)));
        assert_eq!(a.check_at(1000, IDLE, HEAD), Err(Expiry::Idle));
    }

    #[test]
    fn partial_head_expires_after_the_header_timeout() {
        let a = activity();
        a.head_started.store(50, Ordering::Relaxed);
        a.last_io.store(140, Ordering::Relaxed);
        assert_eq!(a.check_at(140, IDLE, HEAD), Ok(Duration::from_millis(10)));
        assert_eq!(a.check_at(150, IDLE, HEAD), Err(Expiry::HeaderTimeout));
    }

    #[test]
    fn request_in_flight_is_never_expired() {
        let a = Arc::new(activity());
        let g = a.begin();
        assert!(a.check_at(1_000_000, IDLE, HEAD).is_ok());
        drop(g);
        assert_eq!(a.head_started.load(Ordering::Relaxed), NONE);
    }
}

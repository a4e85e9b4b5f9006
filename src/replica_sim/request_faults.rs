//! Faults for one request, asked for by the request itself in an
//! `x-sim-fault` header, so a test or a load run can say exactly which
//! request fails and how (the replica-wide faults of `POST /sim/fault` pick
//! requests by a seeded draw). A proxy in front passes the header on like
//! any other.
//!
//! The header is a comma-separated list:
//!
//! | item | what the replica does |
//! |---|---|
//! | `error` | answers 500 before any work |
//! | `stall` | never answers (the request is held until the replica stops or the client leaves) |
//! | `reset` | closes the connection without a response head |
//! | `break=N` | sends the response head and the first `N` body bytes, then closes the connection mid-body |
//! | `slow=MS` | waits `MS` milliseconds before each body frame and before the body's end |
//!
//! A reset or break is the connection closing while the response is
//! unfinished, as when the replica's process dies: the client sees the
//! connection end without a response, or a body cut short.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use crate::net::{BoxError, ResponseBody};

/// The request header that asks for faults.
pub const FAULT_HEADER: &str = "x-sim-fault";

/// The faults one request asked for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RequestFaults {
    pub error: bool,
    pub stall: bool,
    pub reset: bool,
    /// Body bytes sent before the connection closes.
    pub break_after: Option<u64>,
    /// A wait before each body frame and the body's end.
    pub slow: Option<Duration>,
}

impl RequestFaults {
    /// The faults `headers` ask for (none without the header), or why the
    /// header is not understood.
    pub fn from_headers(headers: &HeaderMap) -> Result<RequestFaults, String> {
        let Some(value) = headers.get(FAULT_HEADER) else {
            return Ok(RequestFaults::default());
        };
        let text = value
            .to_str()
            .map_err(|_| format!("{FAULT_HEADER} is not text"))?;
        RequestFaults::parse(text)
    }

    pub fn parse(text: &str) -> Result<RequestFaults, String> {
        let mut f = RequestFaults::default();
        for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let (name, value) = match item.split_once('=') {
                Some((n, v)) => (n.trim(), Some(v.trim())),
                None => (item, None),
            };
            let number = || -> Result<u64, String> {
                value
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| format!("{FAULT_HEADER}: `{name}` needs a whole number"))
            };
            match (name, value) {
                ("error", None) => f.error = true,
                ("stall", None) => f.stall = true,
                ("reset", None) => f.reset = true,
                ("break", Some(_)) => f.break_after = Some(number()?),
                ("slow", Some(_)) => f.slow = Some(Duration::from_millis(number()?)),
                _ => {
                    return Err(format!(
                        "{FAULT_HEADER}: unknown item `{item}` (error, stall, reset, break=N, slow=MS)"
                    ));
                }
            }
        }
        Ok(f)
    }

    /// Whether the answer's body is to be changed.
    pub fn shape_body(&self) -> bool {
        self.reset || self.break_after.is_some() || self.slow.is_some()
    }

    /// `body` with these faults applied.
    pub fn apply(&self, body: ResponseBody) -> ResponseBody {
        Faulty {
            inner: body,
            left: if self.reset {
                Some(0)
            } else {
                self.break_after
            },
            reset_now: self.reset,
            slow: self.slow,
            wait: None,
            waited: false,
            pending: None,
        }
        .boxed_unsync()
    }
}

/// A body with a wait before each frame and a cut after so many bytes.
struct Faulty {
    inner: ResponseBody,
    /// Bytes still to send before the cut.
    left: Option<u64>,
    /// Fail at the first poll, before the head is written out.
    reset_now: bool,
    slow: Option<Duration>,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
    /// The wait before the next item is over.
    waited: bool,
    /// An item read from the inner body, held for its wait.
    pending: Option<Option<Result<Frame<Bytes>, BoxError>>>,
}

fn cut() -> BoxError {
    "connection closed by an injected fault".into()
}

impl Faulty {
    /// Waits `d` once (`waited` then holds until the next item).
    fn wait(&mut self, d: Duration, cx: &mut Context<'_>) -> Poll<()> {
        if self.waited {
            return Poll::Ready(());
        }
        let sleep = self
            .wait
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(d)));
        match sleep.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.wait = None;
                self.waited = true;
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Body for Faulty {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.reset_now {
            return Poll::Ready(Some(Err(cut())));
        }
        if this.left == Some(0) {
            // What was sent goes out first (a wait lets the server flush
            // it), then the connection closes.
            std::task::ready!(this.wait(Duration::from_millis(20), cx));
            return Poll::Ready(Some(Err(cut())));
        }
        let item = match this.pending.take() {
            Some(item) => item,
            None => match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Ready(item) => item,
                Poll::Pending => return Poll::Pending,
            },
        };
        if let Some(d) = this.slow
            && this.wait(d, cx).is_pending()
        {
            this.pending = Some(item);
            return Poll::Pending;
        }
        this.waited = false;
        let Some(Ok(frame)) = item else {
            return Poll::Ready(item);
        };
        let Some(left) = this.left else {
            return Poll::Ready(Some(Ok(frame)));
        };
        match frame.into_data() {
            Ok(mut data) => {
                if data.len() as u64 >= left {
                    data.truncate(left as usize);
                    this.left = Some(0);
                } else {
                    this.left = Some(left - data.len() as u64);
                }
                Poll::Ready(Some(Ok(Frame::data(data))))
            }
            Err(other) => Poll::Ready(Some(Ok(other))),
        }
    }

    fn is_end_stream(&self) -> bool {
        false
    }

    fn size_hint(&self) -> SizeHint {
        // A cut body keeps the length it announced: the client sees it
        // end short, as when a replica dies mid-answer.
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_header_lists_faults() {
        assert_eq!(RequestFaults::parse("").unwrap(), RequestFaults::default());
        let f = RequestFaults::parse("slow=25, break=100").unwrap();
        assert_eq!(f.slow, Some(Duration::from_millis(25)));
        assert_eq!(f.break_after, Some(100));
        assert!(!f.error && !f.stall && !f.reset);
        assert!(RequestFaults::parse("error,stall,reset").unwrap().stall);
        for bad in ["break", "slow=x", "explode", "error=1"] {
            assert!(RequestFaults::parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn a_broken_body_sends_its_first_bytes_then_fails() {
        let body = crate::net::full_body("0123456789");
        let f = RequestFaults::parse("break=4").unwrap();
        let mut body = f.apply(body);
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(&first[..], b"0123");
        assert!(body.frame().await.unwrap().is_err());
    }
}

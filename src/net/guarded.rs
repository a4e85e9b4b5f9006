//! A response body that tells a watcher about its frames and its end, once:
//! [`Watched`] passes each frame through as it comes and calls the
//! [`Watch`]'s `end` exactly once, when the body ends, fails or is dropped
//! (the client went away). On a drop the inner body (and whatever guards
//! it holds) goes first, then the watcher's end.
//!
//! [`Guarded`] is the simplest watcher: a guard held until the end, used to
//! count a request as pending (per connection) for exactly as long as its
//! answer is streaming. The request's scope (`server::scope`) is another.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use super::body::{BoxError, ResponseBody, full_body};

/// How a watched body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The inner body reached its end.
    Complete,
    /// The inner body failed.
    Failed,
    /// The body was dropped; `at_end`: the inner body said it was at its
    /// end (nothing more to read).
    Dropped { at_end: bool },
}

/// What a [`Watched`] body reports to.
pub trait Watch: Send + Unpin + 'static {
    /// A data frame on its way to the client; `at_end`: the inner body says
    /// nothing follows it.
    fn data(&mut self, _data: &Bytes, _at_end: bool) {}

    /// The body's end, called once.
    fn end(&mut self, how: End);
}

pub struct Watched<W: Watch> {
    inner: ResponseBody,
    watch: W,
    done: bool,
}

impl<W: Watch> Watched<W> {
    pub fn new(inner: ResponseBody, watch: W) -> Watched<W> {
        Watched {
            inner,
            watch,
            done: false,
        }
    }

    /// The watcher (its state, for tests and inspection).
    pub fn watch_mut(&mut self) -> &mut W {
        &mut self.watch
    }

    fn end(&mut self, how: End) {
        if !std::mem::replace(&mut self.done, true) {
            self.watch.end(how);
        }
    }
}

impl<W: Watch> Body for Watched<W> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        // `Watched` is `Unpin`: a boxed body, an `Unpin` watcher and a flag.
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.watch.data(data, this.inner.is_end_stream());
                }
            }
            Poll::Ready(Some(Err(_))) => this.end(End::Failed),
            Poll::Ready(None) => this.end(End::Complete),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<W: Watch> Drop for Watched<W> {
    fn drop(&mut self) {
        let at_end = self.inner.is_end_stream();
        drop(std::mem::replace(&mut self.inner, full_body(Bytes::new())));
        self.end(End::Dropped { at_end });
    }
}

/// A guard held until the body ends.
pub struct Guarded<G>(Option<G>);

impl<G: Send + 'static> Guarded<G> {
    /// Wraps `body`; `guard` is dropped at end of stream or with the body.
    pub fn wrap(body: ResponseBody, guard: G) -> ResponseBody {
        Watched::new(body, Guarded(Some(guard))).boxed_unsync()
    }
}

impl<G: Send + 'static> Watch for Guarded<G> {
    fn end(&mut self, _how: End) {
        self.0 = None;
    }
}

impl<G> Unpin for Guarded<G> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::full_body;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    struct Count(Arc<AtomicUsize>);
    impl Drop for Count {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn guard_released_at_end_of_stream_and_on_drop() {
        let n = Arc::new(AtomicUsize::new(2));
        let mut a = Guarded::wrap(full_body("abc"), Count(Arc::clone(&n)));
        let b = Guarded::wrap(full_body("xyz"), Count(Arc::clone(&n)));
        assert!(a.frame().await.unwrap().is_ok());
        assert!(a.frame().await.is_none());
        assert_eq!(n.load(Ordering::SeqCst), 1, "ended body released");
        drop(b);
        assert_eq!(n.load(Ordering::SeqCst), 0, "dropped body released");
        drop(a);
    }
}

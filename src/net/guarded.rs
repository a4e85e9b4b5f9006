//! A response body that tells a watcher about its frames and its end, once:
//! [`Watched`] passes each frame through as it comes and calls the
//! [`Watch`]'s `end` exactly once, when the body ends, fails or is dropped
//! (the client went away). On a drop the inner body (and whatever guards
//! it holds) goes first, then the watcher's end.
//!
//! `Watched` is generic over its inner body, so watchers stack without a
//! boxed body between them: a frame crosses them as direct, inlinable
//! calls, with one dynamic `poll_frame` at most (wherever a boxed body sits
//! inside).
//!
//! [`Guarded`] is the simplest watcher: a guard held until the end, used to
//! count a request as pending (per connection) for exactly as long as its
//! answer is streaming. The request's scope (`server::scope`) is another.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use super::body::ResponseBody;

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

/// What a [`Watched`] body reports to, `B` the body it watches.
pub trait Watch<B>: Send + Unpin + 'static {
    /// A data frame on its way to the client. `body` is the inner body
    /// after the frame, for a watcher that reads what the body itself found
    /// in it or whether it says nothing follows (`is_end_stream`, asked
    /// only by a watcher that needs it: it is a call down the whole chain).
    fn data(&mut self, _body: &B, _data: &Bytes) {}

    /// The inner body just before its end is told (once, and before the
    /// inner body is dropped when the body is): for a watcher that reads
    /// what the body found at its end rather than after every frame.
    fn last_look(&mut self, _body: &B) {}

    /// The body's end, called once.
    fn end(&mut self, how: End);
}

/// A watcher on the heap: a large one (a request's whole scope) then moves
/// with its body as a pointer, where hyper and the layers above move the
/// response by value a few times per request.
impl<B, W: Watch<B>> Watch<B> for Box<W> {
    fn data(&mut self, body: &B, data: &Bytes) {
        (**self).data(body, data);
    }

    fn last_look(&mut self, body: &B) {
        (**self).last_look(body);
    }

    fn end(&mut self, how: End) {
        (**self).end(how);
    }
}

/// `inner` watched by `watch`. The fields drop in order: the inner body
/// first, then the [`Watcher`], which calls the end of a body that did not
/// reach it.
pub struct Watched<W: Watch<B>, B: Body + Unpin = ResponseBody> {
    inner: B,
    watch: Watcher<W, B>,
}

/// The watcher and whether its end has been called.
struct Watcher<W: Watch<B>, B> {
    watch: W,
    body: std::marker::PhantomData<fn(&B)>,
    done: bool,
    /// Whether the inner body said it was at its end when dropped.
    at_end: bool,
}

impl<W: Watch<B>, B> Watcher<W, B> {
    fn end(&mut self, how: End) {
        if !std::mem::replace(&mut self.done, true) {
            self.watch.end(how);
        }
    }
}

impl<W: Watch<B>, B> Drop for Watcher<W, B> {
    fn drop(&mut self) {
        let at_end = self.at_end;
        self.end(End::Dropped { at_end });
    }
}

impl<W: Watch<B>, B: Body + Unpin> Watched<W, B> {
    pub fn new(inner: B, watch: W) -> Watched<W, B> {
        Watched {
            inner,
            watch: Watcher {
                watch,
                body: std::marker::PhantomData,
                done: false,
                at_end: false,
            },
        }
    }

    /// The watcher (its state, for tests and inspection).
    pub fn watch_mut(&mut self) -> &mut W {
        &mut self.watch.watch
    }

    /// Tells the watcher the body's end (once), after its last look at
    /// the inner body.
    fn end(&mut self, how: End) {
        if !self.watch.done {
            self.watch.watch.last_look(&self.inner);
            self.watch.end(how);
        }
    }
}

impl<W: Watch<B>, B: Body<Data = Bytes> + Unpin> Body for Watched<W, B> {
    type Data = Bytes;
    type Error = B::Error;

    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        // `Watched` is `Unpin`: an `Unpin` body, an `Unpin` watcher and flags.
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.watch.watch.data(&this.inner, data);
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

impl<W: Watch<B>, B: Body + Unpin> Drop for Watched<W, B> {
    /// Notes whether the inner body was at its end and gives the watcher
    /// its last look; the fields then drop in order (the inner body, then
    /// the watcher's end).
    fn drop(&mut self) {
        self.watch.at_end = self.inner.is_end_stream();
        if !self.watch.done {
            self.watch.watch.last_look(&self.inner);
        }
    }
}

/// A guard held until the body ends.
pub struct Guarded<G>(Option<G>);

impl<G: Send + 'static> Guarded<G> {
    /// Wraps `body`; `guard` is dropped at end of stream or with the body.
    pub fn wrap<B: Body + Unpin>(body: B, guard: G) -> Watched<Guarded<G>, B> {
        Watched::new(body, Guarded(Some(guard)))
    }
}

impl<G: Send + 'static, B> Watch<B> for Guarded<G> {
    fn end(&mut self, _how: End) {
        self.0 = None;
    }
}

impl<G> Unpin for Guarded<G> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::full_body;
    use http_body_util::BodyExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

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

    /// Notes each end it is told, with how many inner guards were alive.
    struct Ends {
        alive: Arc<AtomicUsize>,
        seen: Arc<Mutex<Vec<(End, usize)>>>,
    }

    impl<B> Watch<B> for Ends {
        fn end(&mut self, how: End) {
            let alive = self.alive.load(Ordering::SeqCst);
            self.seen.lock().unwrap().push((how, alive));
        }
    }

    #[tokio::test]
    async fn each_end_is_told_once_and_a_drop_after_the_inner_body() {
        let alive = Arc::new(AtomicUsize::new(2));
        let seen = Arc::new(Mutex::new(Vec::new()));
        let ends = || Ends {
            alive: Arc::clone(&alive),
            seen: Arc::clone(&seen),
        };
        let guarded = |text| Guarded::wrap(full_body(text), Count(Arc::clone(&alive)));
        let mut complete = Watched::new(full_body("q"), ends());
        assert!(complete.frame().await.unwrap().is_ok());
        assert!(complete.frame().await.is_none());
        drop(complete);
        // Read to its last byte, then dropped without a poll for its end.
        let mut read = Watched::new(guarded("abc"), ends());
        assert!(read.frame().await.unwrap().is_ok());
        drop(read);
        drop(Watched::new(guarded("xyz"), ends()));
        assert_eq!(
            *seen.lock().unwrap(),
            [
                (End::Complete, 2),
                (End::Dropped { at_end: true }, 1),
                (End::Dropped { at_end: false }, 0),
            ]
        );
    }
}

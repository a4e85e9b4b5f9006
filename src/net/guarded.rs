//! A response body that holds a guard until the body ends or is dropped,
//! used to count a request as pending (per connection, per pool) for exactly
//! as long as its answer is streaming.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use super::body::{BoxError, ResponseBody};

pub struct Guarded<G> {
    inner: ResponseBody,
    guard: Option<G>,
}

impl<G: Send + 'static> Guarded<G> {
    /// Wraps `body`; `guard` is dropped at end of stream or with the body.
    pub fn wrap(body: ResponseBody, guard: G) -> ResponseBody {
        Guarded {
            inner: body,
            guard: Some(guard),
        }
        .boxed_unsync()
    }
}

impl<G: Send + 'static> Body for Guarded<G> {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        // `Guarded` is `Unpin`: its fields are a boxed body and an `Option`.
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(None) | Poll::Ready(Some(Err(_))) = &polled {
            this.guard = None;
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

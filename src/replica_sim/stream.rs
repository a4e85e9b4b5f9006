//! The streaming side of a response: an SSE body fed by the engine driver,
//! and the guard that aborts the request in the engine when the response
//! goes away before its end.
//!
//! hyper drops the response body when the client disconnects; dropping
//! [`SseBody`] drops its [`AbortGuard`], which sends `Abort` to the driver,
//! which removes the request from the engine and frees its KV blocks, as
//! vLLM does when its client closes the connection. Non-streaming handlers
//! hold the same guard across their await, so a client that leaves while its
//! answer is being computed aborts it too.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame};
use tokio::sync::mpsc;

use super::driver::{Command, TokenOut};
use super::responses::Meta;
use crate::net::BoxError;

/// Aborts request `id` in the engine on drop, unless disarmed.
pub struct AbortGuard {
    id: u64,
    commands: mpsc::UnboundedSender<Command>,
    armed: bool,
}

impl AbortGuard {
    pub fn new(id: u64, commands: mpsc::UnboundedSender<Command>) -> AbortGuard {
        AbortGuard {
            id,
            commands,
            armed: true,
        }
    }

    /// The request ended on its own: nothing to abort.
    pub fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for AbortGuard {
    fn drop(&mut self) {
        if self.armed {
            let _ = self.commands.send(Command::Abort { id: self.id });
        }
    }
}

/// `data: {chunk}\n\n` events as tokens arrive, then the usage chunk when
/// asked for, then `data: [DONE]\n\n`.
///
/// A chat stream's opening chunk (the assistant role, empty content) is held
/// back until the first token exists and then sent just before it, as vLLM
/// does: its role chunk is written in the first pass over the engine's
/// outputs, after prefill. The response headers still leave at once, so a
/// client timing the first body byte measures prefill, not the round trip.
pub struct SseBody {
    rx: mpsc::UnboundedReceiver<TokenOut>,
    meta: Meta,
    include_usage: bool,
    guard: AbortGuard,
    /// The role chunk, until the first token releases it.
    role: Option<Bytes>,
    queue: VecDeque<Bytes>,
    done: bool,
}

impl SseBody {
    pub fn new(
        rx: mpsc::UnboundedReceiver<TokenOut>,
        meta: Meta,
        include_usage: bool,
        guard: AbortGuard,
    ) -> SseBody {
        let role = meta.role_chunk().map(|role| event(&role));
        SseBody {
            rx,
            meta,
            include_usage,
            guard,
            role,
            queue: VecDeque::new(),
            done: false,
        }
    }
}

fn event(json: &str) -> Bytes {
    Bytes::from(format!("data: {json}\n\n"))
}

impl Body for SseBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if let Some(b) = this.queue.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(b))));
            }
            if this.done {
                return Poll::Ready(None);
            }
            match this.rx.poll_recv(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    // The replica stopped mid-request: cut the stream.
                    this.done = true;
                    this.guard.disarm();
                    return Poll::Ready(Some(Err("the simulated replica stopped".into())));
                }
                Poll::Ready(Some(t)) => {
                    if let Some(role) = this.role.take() {
                        this.queue.push_back(role);
                    }
                    let chunk = this.meta.token_chunk(t.text, t.finished.as_ref());
                    this.queue.push_back(event(&chunk));
                    if let Some(fin) = &t.finished {
                        this.guard.disarm();
                        if this.include_usage {
                            this.queue.push_back(event(&this.meta.usage_chunk(fin)));
                        }
                        this.queue
                            .push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                        this.done = true;
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done && self.queue.is_empty()
    }
}

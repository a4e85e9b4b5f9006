//! A KV-event publisher speaking vLLM's protocol: a ZMQ PUB socket sending
//! `[topic, seq, payload]` for every batch, and an optional ROUTER socket
//! (the replay endpoint) that answers `["", start_seq]` from a DEALER with
//! every buffered batch from `start_seq` on, each as `["", topic, seq,
//! payload]`, then the end marker `["", "", ffffffffffffffff, ""]`.
//!
//! Used by the simulator (`llmlb replica-sim --kv-events-port`). The owner hands
//! batches to a [`Publisher`] without waiting; one task numbers, encodes,
//! sends and buffers them (the last `buffer` batches, like vLLM's
//! `buffer_steps`). Sequence numbers start at 0 when the task starts, so a
//! restarted replica starts again from 0, as vLLM does.

use std::collections::VecDeque;
use std::net::SocketAddr;

use bytes::Bytes;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::wire::{self, END_OF_REPLAY, EventBatch, KvEvent};

/// Sends batches to the publishing task; cheap to clone.
#[derive(Debug, Clone)]
pub struct Publisher {
    tx: mpsc::UnboundedSender<Vec<KvEvent>>,
}

impl Publisher {
    /// Queues one batch (dropped silently once the task has stopped).
    pub fn publish(&self, events: Vec<KvEvent>) {
        if !events.is_empty() {
            let _ = self.tx.send(events);
        }
    }
}

/// A running publisher: its bound endpoints and task.
pub struct PublisherHandle {
    pub publisher: Publisher,
    pub events_addr: SocketAddr,
    pub replay_addr: Option<SocketAddr>,
    pub task: JoinHandle<()>,
}

#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: zeromq::ZmqError,
    },
    #[error("bound {0}, which is not a TCP address")]
    NotTcp(String),
}

/// Binds the PUB socket (and the replay ROUTER socket) and starts the task,
/// which runs until `shutdown` turns true or every [`Publisher`] is dropped.
pub async fn start(
    events_addr: SocketAddr,
    replay_addr: Option<SocketAddr>,
    topic: &str,
    buffer: usize,
    shutdown: watch::Receiver<bool>,
) -> Result<PublisherHandle, PublishError> {
    let mut publ = PubSocket::new();
    let events_addr = bind(&mut publ, events_addr).await?;
    let (router, replay_addr) = match replay_addr {
        Some(addr) => {
            let mut router = RouterSocket::new();
            let bound = bind(&mut router, addr).await?;
            (Some(router), Some(bound))
        }
        None => (None, None),
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let task = Task {
        topic: Bytes::copy_from_slice(topic.as_bytes()),
        publ,
        router,
        buffer: VecDeque::new(),
        capacity: buffer.max(1),
        next_seq: 0,
    };
    let task = tokio::spawn(task.run(rx, shutdown));
    Ok(PublisherHandle {
        publisher: Publisher { tx },
        events_addr,
        replay_addr,
        task,
    })
}

async fn bind<S: Socket>(socket: &mut S, addr: SocketAddr) -> Result<SocketAddr, PublishError> {
    let bound = socket
        .bind(&format!("tcp://{addr}"))
        .await
        .map_err(|source| PublishError::Bind { addr, source })?;
    match bound {
        zeromq::Endpoint::Tcp(_, port) => Ok(SocketAddr::new(addr.ip(), port)),
        other => Err(PublishError::NotTcp(other.to_string())),
    }
}

struct Task {
    topic: Bytes,
    publ: PubSocket,
    router: Option<RouterSocket>,
    buffer: VecDeque<(u64, Bytes)>,
    capacity: usize,
    next_seq: u64,
}

impl Task {
    async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Vec<KvEvent>>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        loop {
            let replay = async {
                match self.router.as_mut() {
                    Some(r) => r.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        break;
                    }
                }
                events = rx.recv() => match events {
                    Some(events) => self.send(events).await,
                    None => break,
                },
                request = replay => match request {
                    Ok(request) => self.serve_replay(request).await,
                    // Nobody connected yet: do not spin.
                    Err(_) => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
                },
            }
        }
        // Unbind before returning, so a new publisher can take the ports.
        let _ = self.publ.close().await;
        if let Some(router) = self.router {
            let _ = router.close().await;
        }
    }

    async fn send(&mut self, events: Vec<KvEvent>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let batch = EventBatch {
            ts: unix_seconds(),
            events,
            dp_rank: Some(0),
        };
        let payload = Bytes::from(wire::encode_payload(&batch));
        let frames = vec![
            self.topic.clone(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            payload.clone(),
        ];
        if let Ok(m) = ZmqMessage::try_from(frames)
            && let Err(e) = self.publ.send(m).await
        {
            tracing::debug!(error = %e, "kv events: publish failed");
        }
        if self.buffer.len() == self.capacity {
            self.buffer.pop_front();
        }
        self.buffer.push_back((seq, payload));
    }

    async fn serve_replay(&mut self, request: ZmqMessage) {
        let frames = request.into_vec();
        // [identity, "", start_seq]
        let [identity, _, start] = frames.as_slice() else {
            tracing::debug!(frames = frames.len(), "kv events: bad replay request");
            return;
        };
        let Ok(start) = wire::decode_seq(start) else {
            return;
        };
        let Some(router) = self.router.as_mut() else {
            return;
        };
        let empty = Bytes::new();
        for (seq, payload) in self.buffer.iter().filter(|(s, _)| *s >= start) {
            let frames = vec![
                identity.clone(),
                empty.clone(),
                self.topic.clone(),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                payload.clone(),
            ];
            if send(router, frames).await.is_err() {
                return;
            }
        }
        let end = vec![
            identity.clone(),
            empty.clone(),
            empty.clone(),
            Bytes::copy_from_slice(&END_OF_REPLAY),
            empty,
        ];
        let _ = send(router, end).await;
    }
}

async fn send(router: &mut RouterSocket, frames: Vec<Bytes>) -> Result<(), ()> {
    let m = ZmqMessage::try_from(frames).map_err(|_| ())?;
    router.send(m).await.map_err(|e| {
        tracing::debug!(error = %e, "kv events: replay send failed");
    })
}

fn unix_seconds() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

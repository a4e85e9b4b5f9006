//! What `llmlb doctor` hears from a replica's KV-event endpoints: a ZMQ SUB
//! socket opened before the probe is sent, collecting every message for a
//! bounded time, and one replay request to the replay endpoint.
//!
//! Nothing here repairs gaps or keeps a record (that is
//! [`crate::kv_events::subscriber`]); the doctor only needs to know whether
//! events arrive, what block size they carry and which tokens they store.

use std::time::Duration;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zeromq::{DealerSocket, Socket, SocketOptions, SocketRecv, SocketSend, SubSocket, ZmqMessage};

use crate::kv_events::wire::{self, END_OF_REPLAY, KvEvent, Message};

/// A live subscription collecting messages.
pub struct Listening {
    rx: mpsc::UnboundedReceiver<Result<Message, String>>,
    task: JoinHandle<()>,
}

/// What arrived on the event endpoint.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Heard {
    /// Messages decoded.
    pub messages: usize,
    /// Messages that did not decode (with the first reason).
    pub undecodable: Option<String>,
    /// The block size of the stored blocks (the last one seen).
    pub block_size: Option<usize>,
    /// The token ids of every stored block, one entry per `BlockStored`
    /// event, in arrival order.
    pub stored: Vec<Vec<u32>>,
}

impl Heard {
    /// Whether some `BlockStored` event's tokens begin with `first_block`.
    pub fn stored_starting_with(&self, first_block: &[u32]) -> bool {
        !first_block.is_empty() && self.stored.iter().any(|t| t.starts_with(first_block))
    }
}

/// Connects to `endpoint` and starts collecting; Err when the connection
/// cannot be made within `connect_timeout`.
pub async fn listen(endpoint: &str, connect_timeout: Duration) -> Result<Listening, String> {
    let mut options = SocketOptions::default();
    options.connect_timeout(connect_timeout);
    let mut socket = SubSocket::with_options(options);
    match tokio::time::timeout(connect_timeout, socket.connect(endpoint)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => return Err(e.to_string()),
        Err(_) => return Err(format!("no connection within {connect_timeout:?}")),
    }
    socket.subscribe("").await.map_err(|e| e.to_string())?;
    let (tx, rx) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        while let Ok(m) = socket.recv().await {
            let frames = m.into_vec();
            if tx
                .send(wire::decode_frames(&frames).map_err(|e| e.to_string()))
                .is_err()
            {
                return;
            }
        }
    });
    Ok(Listening { rx, task })
}

impl Listening {
    /// Collects for `wait`, returning early once a stored block begins
    /// with `first_block`.
    pub async fn collect(mut self, wait: Duration, first_block: &[u32]) -> Heard {
        let mut heard = Heard::default();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let next = tokio::time::timeout_at(deadline, self.rx.recv()).await;
            match next {
                Ok(Some(Ok(m))) => {
                    heard.messages += 1;
                    add(&mut heard, &m);
                    if heard.stored_starting_with(first_block) {
                        break;
                    }
                }
                Ok(Some(Err(e))) => {
                    heard.undecodable.get_or_insert(e);
                }
                Ok(None) | Err(_) => break,
            }
        }
        self.task.abort();
        heard
    }
}

fn add(heard: &mut Heard, m: &Message) {
    for e in &m.batch.events {
        if let KvEvent::BlockStored {
            token_ids,
            block_size,
            ..
        } = e
        {
            heard.block_size = Some(*block_size);
            heard.stored.push(token_ids.clone());
        }
    }
}

/// Asks the replay endpoint for everything from sequence 0; Ok(messages
/// replayed) when it answers to the end within `timeout`.
pub async fn replay(endpoint: &str, timeout: Duration) -> Result<usize, String> {
    let asked = async {
        let mut dealer = DealerSocket::new();
        dealer.connect(endpoint).await.map_err(|e| e.to_string())?;
        let request = vec![Bytes::new(), Bytes::copy_from_slice(&0u64.to_be_bytes())];
        dealer
            .send(ZmqMessage::try_from(request).expect("two frames"))
            .await
            .map_err(|e| e.to_string())?;
        let mut n = 0;
        loop {
            let frames = dealer.recv().await.map_err(|e| e.to_string())?.into_vec();
            let frames: Vec<Bytes> = frames.into_iter().skip_while(|f| f.is_empty()).collect();
            // The end marker: an empty topic, then the all-ones sequence.
            let seq = frames.iter().find(|f| f.len() == 8);
            if seq.is_some_and(|s| s[..] == END_OF_REPLAY) {
                return Ok(n);
            }
            n += 1;
        }
    };
    match tokio::time::timeout(timeout, asked).await {
        Ok(r) => r,
        Err(_) => Err(format!("no complete answer within {timeout:?}")),
    }
}

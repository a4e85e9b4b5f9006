//! One prefix view for the fleet: every instance publishes what it sent
//! where (a dispatch record: pool, replica, the prompt's block hashes, and
//! in `hash` mode the prefix key) on a Redis stream, and folds the other
//! instances' records into its own prefix index, so `cache` and `hash`
//! routing see the whole fleet's traffic instead of 1/N of it.
//!
//! The request path only puts a record in a bounded channel
//! ([`PrefixOutbox::send`], never waiting; a full channel drops the record
//! and counts it). A task sends them in batches (`XADD`, the stream capped
//! at about [`STREAM_LEN`] entries; a batch whose send failed is tried
//! again, up to the outbox's size) and reads the others' every
//! [`POLL`] (`XREAD`, non-blocking, so it shares the instance's one
//! connection). A new instance reads the stream from its start: it joins
//! with the fleet's recent history. Without the store, each instance routes
//! on its own view, as without `[fleet]`.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::store::Fleet;

/// Entries kept in the stream (approximately, `MAXLEN ~`).
pub const STREAM_LEN: usize = 20_000;
/// How often the other instances' records are read.
pub const POLL: Duration = Duration::from_millis(10);
/// Records waiting to be sent; more are dropped.
const OUTBOX: usize = 4096;

/// One dispatch, as published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixRecord {
    pub pool: Arc<str>,
    pub replica: String,
    /// The prefix key in `hash` mode.
    pub key: Option<u64>,
    pub blocks: Vec<u64>,
}

/// Where the request path drops its records (one per pool, naming it).
#[derive(Debug, Clone)]
pub struct PrefixOutbox {
    pool: Arc<str>,
    tx: mpsc::Sender<PrefixRecord>,
    dropped: prometheus::IntCounter,
}

impl PrefixOutbox {
    /// The same outbox for pool `pool`.
    pub fn for_pool(&self, pool: &str) -> PrefixOutbox {
        PrefixOutbox {
            pool: Arc::from(pool),
            ..self.clone()
        }
    }

    /// Publishes that a request with `blocks` (and `key`) went to `replica`.
    pub fn send(&self, replica: &str, key: Option<u64>, blocks: &[u64]) {
        let record = PrefixRecord {
            pool: Arc::clone(&self.pool),
            replica: replica.to_string(),
            key,
            blocks: blocks.to_vec(),
        };
        if self.tx.try_send(record).is_err() {
            self.dropped.inc();
        }
    }
}

/// The outbox for `fleet` and the receiving end its task reads.
pub fn outbox(fleet: &Fleet) -> (PrefixOutbox, mpsc::Receiver<PrefixRecord>) {
    channel(fleet.metrics().prefix_dropped.clone())
}

/// An outbox and its receiving end, without a store: the caller carries
/// the records (the fleet simulator, on its virtual clock). A full
/// channel counts the dropped record in `dropped`.
pub fn channel(dropped: prometheus::IntCounter) -> (PrefixOutbox, mpsc::Receiver<PrefixRecord>) {
    let (tx, rx) = mpsc::channel(OUTBOX);
    (
        PrefixOutbox {
            pool: Arc::from(""),
            tx,
            dropped,
        },
        rx,
    )
}

fn encode(blocks: &[u64]) -> Vec<u8> {
    blocks.iter().flat_map(|b| b.to_le_bytes()).collect()
}

fn decode(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect()
}

impl Fleet {
    /// Sends this instance's records and folds the others' with `fold`
    /// until shutdown.
    pub async fn run_prefixes<F>(
        self: Arc<Self>,
        mut rx: mpsc::Receiver<PrefixRecord>,
        fold: F,
        mut shutdown: watch::Receiver<bool>,
    ) where
        F: Fn(&PrefixRecord),
    {
        let stream = self.key("dispatch");
        let mut last_id = "0-0".to_string();
        let mut tick = tokio::time::interval(POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Records not yet sent (kept across a failed send, the oldest
        // dropped beyond the outbox's size).
        let mut pending = Vec::new();
        loop {
            tokio::select! {
                got = rx.recv_many(&mut pending, 256) => {
                    if got == 0 {
                        break;
                    }
                    self.publish(&stream, &mut pending).await;
                }
                _ = tick.tick() => {
                    if !pending.is_empty() {
                        self.publish(&stream, &mut pending).await;
                    }
                    self.read_others(&stream, &mut last_id, &fold).await;
                }
                _ = shutdown.changed() => break,
            }
        }
    }

    /// Sends `records` (emptied on success; on failure kept, at most
    /// [`OUTBOX`] of them, for the next try).
    async fn publish(&self, stream: &str, records: &mut Vec<PrefixRecord>) {
        if records.len() > OUTBOX {
            let over = records.len() - OUTBOX;
            records.drain(..over);
            self.metrics().prefix_dropped.inc_by(over as u64);
        }
        let Ok(mut conn) = self.connection().await else {
            return;
        };
        let mut pipe = redis::pipe();
        for r in records.iter() {
            let mut cmd = redis::cmd("XADD");
            cmd.arg(stream)
                .arg("MAXLEN")
                .arg("~")
                .arg(STREAM_LEN)
                .arg("*")
                .arg("i")
                .arg(self.id())
                .arg("p")
                .arg(&*r.pool)
                .arg("r")
                .arg(&r.replica)
                .arg("b")
                .arg(encode(&r.blocks));
            if let Some(k) = r.key {
                cmd.arg("k").arg(k);
            }
            pipe.add_command(cmd).ignore();
        }
        let timeout = self.config().timeout * 2;
        let sent = tokio::time::timeout(timeout, pipe.query_async::<()>(&mut conn)).await;
        if matches!(sent, Ok(Ok(()))) {
            records.clear();
        }
    }

    async fn read_others<F: Fn(&PrefixRecord)>(
        &self,
        stream: &str,
        last_id: &mut String,
        fold: &F,
    ) {
        let Ok(mut conn) = self.connection().await else {
            return;
        };
        let mut cmd = redis::cmd("XREAD");
        cmd.arg("COUNT")
            .arg(1000)
            .arg("STREAMS")
            .arg(stream)
            .arg(&*last_id);
        let timeout = self.config().timeout * 2;
        let Ok(Ok(answer)) =
            tokio::time::timeout(timeout, cmd.query_async::<redis::Value>(&mut conn)).await
        else {
            return;
        };
        for (id, fields) in entries(&answer) {
            *last_id = id;
            let field = |name: &[u8]| {
                fields
                    .iter()
                    .find(|(k, _)| k.as_slice() == name)
                    .map(|(_, v)| v.as_slice())
            };
            if field(b"i") == Some(self.id().as_bytes()) {
                continue;
            }
            let (Some(pool), Some(replica), Some(blocks)) = (field(b"p"), field(b"r"), field(b"b"))
            else {
                continue;
            };
            let record = PrefixRecord {
                pool: Arc::from(String::from_utf8_lossy(pool).as_ref()),
                replica: String::from_utf8_lossy(replica).into_owned(),
                key: field(b"k").and_then(|k| std::str::from_utf8(k).ok()?.parse().ok()),
                blocks: decode(blocks),
            };
            fold(&record);
            self.metrics().prefix_records.inc();
        }
    }
}

/// One stream entry: its id and its `(field, value)` pairs.
type Entry = (String, Vec<(Vec<u8>, Vec<u8>)>);

/// The entries of an `XREAD` answer on one stream.
fn entries(answer: &redis::Value) -> Vec<Entry> {
    use redis::Value;
    let bytes = |v: &Value| match v {
        Value::BulkString(b) => Some(b.clone()),
        Value::SimpleString(s) => Some(s.clone().into_bytes()),
        _ => None,
    };
    let streams = match answer {
        Value::Array(s) => s.clone(),
        Value::Map(m) => m
            .iter()
            .map(|(k, v)| Value::Array(vec![k.clone(), v.clone()]))
            .collect(),
        _ => return Vec::new(),
    };
    let mut out = Vec::new();
    for s in &streams {
        let Value::Array(pair) = s else { continue };
        let Some(Value::Array(items)) = pair.get(1) else {
            continue;
        };
        for item in items {
            let Value::Array(entry) = item else { continue };
            let (Some(id), Some(Value::Array(kv))) = (entry.first().and_then(bytes), entry.get(1))
            else {
                continue;
            };
            let fields = kv
                .chunks_exact(2)
                .filter_map(|c| Some((bytes(&c[0])?, bytes(&c[1])?)))
                .collect();
            out.push((String::from_utf8_lossy(&id).into_owned(), fields));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_round_trip() {
        let blocks = vec![0, 1, u64::MAX, 0x0123_4567_89ab_cdef];
        assert_eq!(decode(&encode(&blocks)), blocks);
    }
}

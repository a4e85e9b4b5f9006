//! Subscribes to one replica's KV events and keeps a sink in step with them,
//! repairing what the network loses.
//!
//! A ZMQ SUB socket (the `zeromq` crate, pure Rust, reconnecting by itself)
//! receives `[topic, seq, payload]` messages. The sequence numbers say what
//! was missed ([`Tracker`]):
//! - the next number: applied;
//! - a jump forward (a reconnect, a slow subscriber): the missed stretch is
//!   asked from the replay endpoint when one is configured, else the sink is
//!   told its view is incomplete ([`EventSink::lost`]);
//! - a number at or below the last one (outside the duplicates a replay can
//!   leave): the publisher started again, so the replica restarted and its
//!   cache is empty ([`EventSink::restarted`]).
//!
//! On connecting, a subscriber with a replay endpoint first asks for the
//! whole history the replica still buffers; a complete one (starting at
//! sequence 0) makes the view known ([`EventSink::caught_up`]) even before
//! the replica publishes again. A replay that skips batches in its middle
//! (vLLM's replay socket drops what a slow reader has no room for) leaves
//! the view incomplete ([`EventSink::lost`]). Without replay, a first
//! message numbered 0 means llmlb saw the replica's whole life; any other
//! first number means it did not.
//!
//! Replay protocol (vLLM's): a DEALER sends `["", start_seq]`; the ROUTER
//! answers `["", topic, seq, payload]` per buffered batch from `start_seq`
//! on, then `["", "", ffffffffffffffff, ""]`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::watch;
use zeromq::{
    DealerSocket, Socket, SocketEvent, SocketOptions, SocketRecv, SocketSend, SubSocket, ZmqMessage,
};

use super::wire::{self, END_OF_REPLAY, EventBatch, Message};
use crate::net::stopped;

/// What the subscriber keeps up to date.
pub trait EventSink: Send + Sync {
    /// A connection was made and the subscription sent.
    fn subscribed(&self) {}
    /// One batch, in sequence order; returns how many of the blocks it
    /// stored the sink had no room for.
    fn apply(&self, batch: &EventBatch) -> u64;
    /// The replica restarted: its cache is empty, and nothing was missed since.
    fn restarted(&self);
    /// Some events were missed: the view is incomplete until it refills.
    fn lost(&self);
    /// Every event since the replica's cache was empty has been applied.
    fn caught_up(&self);
    /// A jump in the sequence numbers: `missed` events never arrived live.
    fn gap_seen(&self, _missed: u64) {}
    /// A replay was asked and ended `complete`, `incomplete` (the replica's
    /// buffer no longer reached back), `failed` or `timeout`.
    fn replay_done(&self, _outcome: &'static str) {}
}

/// Where one replica publishes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Endpoints {
    /// `tcp://host:port` of the PUB socket.
    pub events: String,
    /// `tcp://host:port` of the replay ROUTER socket.
    pub replay: Option<String>,
}

/// How long a replay may take before it counts as failed.
const REPLAY_TIMEOUT: Duration = Duration::from_secs(5);
/// Wait before connecting again after a failure.
const RETRY: Duration = Duration::from_millis(500);

/// What to do with a message, given the sequence numbers seen so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Apply,
    /// A duplicate of what a replay already applied.
    Skip,
    /// Events from `from` up to this one were missed.
    Gap {
        from: u64,
    },
    /// The publisher's numbering started again.
    Restart,
}

/// Sequence bookkeeping, pure.
#[derive(Debug, Clone, Default)]
pub struct Tracker {
    /// The last sequence number applied.
    pub last: Option<u64>,
    /// After a replay, live messages up to `last` are duplicates, not a restart.
    after_replay: bool,
}

impl Tracker {
    pub fn classify(&self, seq: u64) -> Action {
        match self.last {
            None if seq == 0 => Action::Apply,
            None => Action::Gap { from: 0 },
            Some(last) if seq == last + 1 => Action::Apply,
            Some(last) if seq > last => Action::Gap { from: last + 1 },
            Some(_) if self.after_replay => Action::Skip,
            Some(_) => Action::Restart,
        }
    }

    pub fn applied(&mut self, seq: u64) {
        self.last = Some(seq);
        self.after_replay = false;
    }

    pub fn replayed(&mut self, seq: u64) {
        self.last = Some(seq);
        self.after_replay = true;
    }

    pub fn restart(&mut self) {
        *self = Tracker::default();
    }
}

/// Runs the subscription until `shutdown` turns true.
pub async fn run(
    endpoints: Endpoints,
    sink: Arc<dyn EventSink>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut sub = Subscription {
        endpoints,
        sink,
        tracker: Tracker::default(),
    };
    loop {
        tokio::select! {
            biased;
            _ = stopped(&mut shutdown) => return,
            done = sub.session() => {
                if let Err(e) = done {
                    tracing::debug!(endpoint = %sub.endpoints.events, error = %e, "kv events: connection failed");
                }
            }
        }
        tokio::select! {
            _ = stopped(&mut shutdown) => return,
            _ = tokio::time::sleep(RETRY) => {}
        }
    }
}

struct Subscription {
    endpoints: Endpoints,
    sink: Arc<dyn EventSink>,
    tracker: Tracker,
}

impl Subscription {
    /// One connection: connect, catch up, then follow until an error.
    async fn session(&mut self) -> Result<(), zeromq::ZmqError> {
        let mut options = SocketOptions::default();
        options.connect_timeout(Duration::from_secs(2));
        let mut socket = SubSocket::with_options(options);
        // A lost connection ends the session; the next one starts afresh
        // (and catches up through replay when it can).
        let mut monitor = socket.monitor();
        socket.connect(&self.endpoints.events).await?;
        socket.subscribe("").await?;
        tracing::info!(endpoint = %self.endpoints.events, "kv events: subscribed");
        self.sink.subscribed();
        if self.endpoints.replay.is_some() {
            let from = self.tracker.last.map_or(0, |l| l + 1);
            self.catch_up(from).await;
        }
        loop {
            let frames = tokio::select! {
                m = socket.recv() => m?.into_vec(),
                event = monitor.next() => match event {
                    Some(SocketEvent::Disconnected(_)) | None => {
                        tracing::info!(endpoint = %self.endpoints.events, "kv events: disconnected");
                        return Ok(());
                    }
                    Some(_) => continue,
                },
            };
            match wire::decode_frames(&frames) {
                Ok(m) => self.on_message(m).await,
                Err(e) => {
                    tracing::warn!(endpoint = %self.endpoints.events, error = %e, "kv events: undecodable message");
                    // Whatever it said is lost.
                    self.sink.lost();
                }
            }
        }
    }

    async fn on_message(&mut self, m: Message) {
        match self.tracker.classify(m.seq) {
            Action::Skip => return,
            Action::Apply => {
                if self.tracker.last.is_none() {
                    self.sink.caught_up();
                }
            }
            Action::Restart => {
                tracing::info!(endpoint = %self.endpoints.events, seq = m.seq, "kv events: sequence started again (replica restart)");
                self.tracker.restart();
                self.sink.restarted();
                if m.seq != 0 {
                    self.gap(0, m.seq).await;
                }
            }
            Action::Gap { from } => self.gap(from, m.seq).await,
        }
        if self.tracker.last.is_none_or(|l| m.seq > l) {
            self.sink.apply(&m.batch);
            self.tracker.applied(m.seq);
        }
    }

    /// Events `from..upto` were missed.
    async fn gap(&mut self, from: u64, upto: u64) {
        self.sink.gap_seen(upto.saturating_sub(from));
        if self.endpoints.replay.is_some() {
            match self.catch_up(from).await {
                Some(next) if next < upto => {}
                // Filled, or found holed and marked incomplete already.
                _ => return,
            }
        }
        tracing::info!(endpoint = %self.endpoints.events, from, upto, "kv events: missed events; view incomplete");
        self.sink.lost();
    }

    /// Applies what the replay endpoint holds from `from` on; returns the
    /// next sequence number still missing (`from` when nothing came), or
    /// `None` when the replay skipped batches in its middle and the view
    /// was marked incomplete for it.
    async fn catch_up(&mut self, from: u64) -> Option<u64> {
        let Some(replay) = self.endpoints.replay.clone() else {
            return Some(from);
        };
        let mut next = from;
        let mut complete = true;
        // A batch missing between two that were applied: vLLM's replay
        // socket drops what a slow reader has no room for, so a replay can
        // skip batches in its middle, and no later replay fills them in.
        let mut hole = false;
        let result = tokio::time::timeout(REPLAY_TIMEOUT, async {
            let mut dealer = DealerSocket::new();
            dealer.connect(&replay).await?;
            let request = vec![Bytes::new(), Bytes::copy_from_slice(&from.to_be_bytes())];
            dealer
                .send(ZmqMessage::try_from(request).expect("two frames"))
                .await?;
            loop {
                let mut frames = dealer.recv().await?.into_vec();
                if frames.first().is_some_and(|f| f.is_empty()) {
                    frames.remove(0);
                }
                if frames.get(1).is_some_and(|s| s[..] == END_OF_REPLAY) {
                    return Ok::<(), zeromq::ZmqError>(());
                }
                let Ok(m) = wire::decode_frames(&frames) else {
                    complete = false;
                    hole = true;
                    continue;
                };
                if m.seq < next {
                    continue;
                }
                if m.seq > next {
                    // The replica's buffer no longer reaches back to `next`
                    // (the first batch), or batches were dropped on the way.
                    complete = false;
                    hole |= next > from;
                }
                if next == from && from == 0 && m.seq == 0 && self.tracker.last.is_none() {
                    self.sink.caught_up();
                }
                self.sink.apply(&m.batch);
                self.tracker.replayed(m.seq);
                next = m.seq + 1;
            }
        })
        .await;
        if hole {
            tracing::info!(endpoint = %replay, from, "kv events: replay skipped batches; view incomplete");
            self.sink.lost();
        }
        let missing = match result {
            Ok(Ok(())) => {
                tracing::info!(endpoint = %replay, from, upto = next, "kv events: replayed");
                let outcome = if complete { "complete" } else { "incomplete" };
                self.sink.replay_done(outcome);
                if from == 0 && next == 0 && self.tracker.last.is_none() {
                    // Nothing published yet: the replica's cache is empty.
                    self.sink.caught_up();
                }
                if complete { next } else { from }
            }
            Ok(Err(e)) => {
                tracing::warn!(endpoint = %replay, error = %e, "kv events: replay failed");
                self.sink.replay_done("failed");
                from
            }
            Err(_) => {
                tracing::warn!(endpoint = %replay, "kv events: replay timed out");
                self.sink.replay_done("timeout");
                from
            }
        };
        (!hole).then_some(missing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_follows_the_sequence() {
        let mut t = Tracker::default();
        assert_eq!(t.classify(0), Action::Apply);
        assert_eq!(t.classify(4), Action::Gap { from: 0 });
        t.applied(0);
        assert_eq!(t.classify(1), Action::Apply);
        t.applied(1);
        assert_eq!(t.classify(5), Action::Gap { from: 2 });
        assert_eq!(t.classify(1), Action::Restart);
        assert_eq!(t.classify(0), Action::Restart);
        t.replayed(7);
        assert_eq!(
            t.classify(6),
            Action::Skip,
            "a live duplicate after a replay"
        );
        assert_eq!(t.classify(8), Action::Apply);
        t.applied(8);
        assert_eq!(t.classify(3), Action::Restart);
    }

    /// What the subscriber told its sink, in order (batches as `apply`).
    #[derive(Default)]
    struct Calls(std::sync::Mutex<Vec<&'static str>>);

    impl Calls {
        fn push(&self, what: &'static str) {
            self.0.lock().unwrap().push(what);
        }
        fn list(&self) -> Vec<&'static str> {
            self.0.lock().unwrap().clone()
        }
    }

    impl EventSink for Calls {
        fn apply(&self, _: &EventBatch) -> u64 {
            self.push("apply");
            0
        }
        fn restarted(&self) {
            self.push("restarted");
        }
        fn lost(&self) {
            self.push("lost");
        }
        fn caught_up(&self) {
            self.push("caught_up");
        }
        fn replay_done(&self, _: &'static str) {
            self.push("replay_done");
        }
    }

    async fn bound<S: Socket>(socket: &mut S) -> String {
        match socket.bind("tcp://127.0.0.1:0").await.unwrap() {
            zeromq::Endpoint::Tcp(_, port) => format!("tcp://127.0.0.1:{port}"),
            other => panic!("not tcp: {other}"),
        }
    }

    /// A replay socket on loopback that answers one request with the
    /// batches `seqs`, then the end marker; its endpoint, and the task
    /// that serves it (it returns the socket, kept open until dropped).
    async fn replay_server(
        seqs: &'static [u64],
    ) -> (String, tokio::task::JoinHandle<zeromq::RouterSocket>) {
        let mut router = zeromq::RouterSocket::new();
        let replay = bound(&mut router).await;
        let server = tokio::spawn(async move {
            let request = router.recv().await.unwrap().into_vec();
            let identity = request[0].clone();
            let batch = EventBatch {
                ts: 0.0,
                events: Vec::new(),
                dp_rank: None,
            };
            let answer = |frames: Vec<Bytes>| {
                let mut all = vec![identity.clone(), Bytes::new()];
                all.extend(frames);
                ZmqMessage::try_from(all).unwrap()
            };
            for &seq in seqs {
                let frames = wire::encode_frames(b"kv", seq, &batch).map(Bytes::from);
                router.send(answer(frames.to_vec())).await.unwrap();
            }
            let end = vec![
                Bytes::new(),
                Bytes::copy_from_slice(&END_OF_REPLAY),
                Bytes::new(),
            ];
            router.send(answer(end)).await.unwrap();
            router
        });
        (replay, server)
    }

    /// A subscriber's first replay answered with the batches `seqs`, then the
    /// end marker, by a replay socket on loopback; returns what its sink was
    /// told by the end of the replay.
    async fn first_replay(seqs: &'static [u64]) -> Vec<&'static str> {
        let mut publ = zeromq::PubSocket::new();
        let events = bound(&mut publ).await;
        let (replay, server) = replay_server(seqs).await;
        let calls = Arc::new(Calls::default());
        let (stop, shutdown) = watch::channel(false);
        let endpoints = Endpoints {
            events,
            replay: Some(replay),
        };
        let sub = tokio::spawn(run(endpoints, calls.clone(), shutdown));
        let _router = server.await.unwrap();
        for _ in 0..500 {
            if calls.list().contains(&"replay_done") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop.send(true).unwrap();
        sub.await.unwrap();
        calls.list()
    }

    /// A gap whose replay skips a batch marks the view incomplete once.
    #[tokio::test]
    async fn a_gap_whose_replay_skips_a_batch_marks_the_view_incomplete_once() {
        let (replay, server) = replay_server(&[3, 4, 6, 7]).await;
        let calls = Arc::new(Calls::default());
        let mut sub = Subscription {
            endpoints: Endpoints {
                events: "tcp://127.0.0.1:9".into(),
                replay: Some(replay),
            },
            sink: calls.clone(),
            tracker: Tracker::default(),
        };
        sub.tracker.applied(2);
        sub.gap(3, 8).await;
        let _router = server.await.unwrap();
        assert_eq!(
            calls.list(),
            ["apply", "apply", "apply", "apply", "lost", "replay_done"]
        );
    }

    #[tokio::test]
    async fn a_replay_that_skips_a_batch_leaves_the_view_incomplete() {
        let whole = first_replay(&[0, 1, 2]).await;
        assert_eq!(
            whole,
            ["caught_up", "apply", "apply", "apply", "replay_done"],
            "a whole replay from 0 makes the view known"
        );
        // Batch 2 dropped on the way: known at batch 0, incomplete after.
        let skipped = first_replay(&[0, 1, 3]).await;
        assert_eq!(
            skipped,
            [
                "caught_up",
                "apply",
                "apply",
                "apply",
                "lost",
                "replay_done"
            ]
        );
        // A buffer that no longer reaches back to 0 is no hole: the view
        // was never known.
        let late = first_replay(&[5, 6]).await;
        assert_eq!(late, ["apply", "apply", "replay_done"]);
    }
}

//! Slots handed between instances at once: an instance that gave slots
//! back for another instance's waiters ([`super::Fleet::release`]) publishes
//! its id on the store's `wake` channel after the refresh that recorded the
//! smaller lease, and every other instance, subscribed to that channel,
//! refreshes at once instead of at its next tick. So a freed slot reaches
//! the waiter that goes first in two refreshes' round trips, not in up to
//! two refresh intervals; without it, slots freed on one instance while
//! waiters elsewhere go first stayed idle for most of an interval and then
//! went out together, and a replica received them in one burst (one long
//! prefill step for all of them: a higher time to first token for each).
//!
//! The channel is a hint: a lost message (store down, connection lost)
//! costs one interval, as before. The subscription is made again at most
//! once per refresh interval after it failed.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::watch;

use super::client::StoreClient;

/// Listens on `channel` until `shutdown`, waking this instance's refresh
/// loop ([`super::nudge`]) on every message not sent by `me`; `wakes`
/// counts them.
pub(super) async fn listen(
    client: Arc<StoreClient>,
    channel: String,
    me: String,
    retry: Duration,
    wakes: prometheus::IntCounter,
    mut shutdown: watch::Receiver<bool>,
) {
    if client.is_cluster() {
        // No channel on a cluster: refreshes keep their interval.
        let _ = shutdown.changed().await;
        return;
    }
    loop {
        let session = async {
            let mut pubsub = tokio::time::timeout(retry.max(Duration::from_millis(100)), async {
                client.client().await?.get_async_pubsub().await
            })
            .await
            .map_err(|_| redis::RedisError::from((redis::ErrorKind::Io, "connect timed out")))??;
            pubsub.subscribe(&channel).await?;
            let mut messages = pubsub.on_message();
            while let Some(msg) = messages.next().await {
                let from: String = msg.get_payload().unwrap_or_default();
                if from != me {
                    wakes.inc();
                    super::nudge();
                }
            }
            Ok::<(), redis::RedisError>(())
        };
        tokio::select! {
            outcome = session => {
                if let Err(e) = outcome {
                    tracing::debug!(error = %e, "fleet wake channel lost; refreshes keep their interval until it is back");
                }
            }
            _ = shutdown.changed() => return,
        }
        tokio::select! {
            _ = tokio::time::sleep(retry) => {}
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
    }
}

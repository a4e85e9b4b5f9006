//! The stop signal every loop and listener in llmlb watches: a
//! `watch::Receiver<bool>` that turns `true` once.

use tokio::sync::watch;

/// Resolves once `rx` holds `true` or its sender is gone.
pub async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// Sleeps until `deadline` unless the stop signal comes first: `true` when
/// the caller should stop.
pub async fn sleep_or_stop(deadline: tokio::time::Instant, rx: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        _ = tokio::time::sleep_until(deadline) => false,
        _ = stopped(rx) => true,
    }
}

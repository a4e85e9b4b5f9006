//! The stop signal every loop and listener in llmlb watches: a
//! `watch::Receiver<bool>` that turns `true` once.

use tokio::sync::watch;

/// Resolves once `rx` holds `true` or its sender is gone.
pub async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

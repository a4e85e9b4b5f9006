//! Bounded polling: wait for a condition, fail with its name after a deadline.

use super::*;

/// Polls `cond` until it holds, panicking with `what` after 5 s.
pub async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    tokio::time::timeout(Duration::from_secs(5), async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

/// Polls the async `cond` every 10 ms until it holds, panicking with `what`
/// after `limit`.
pub async fn until_async(what: &str, limit: Duration, mut cond: impl AsyncFnMut() -> bool) {
    tokio::time::timeout(limit, async {
        while !cond().await {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out after {limit:?} waiting for {what}"));
}

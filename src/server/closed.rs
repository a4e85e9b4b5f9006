//! Counts a request whose client went away before its response started
//! (while it was read, queued, or waiting for the replica's headers): hyper
//! drops the handler's future, and this guard, still armed, records the
//! request as `status="499"` in `llmlb_requests_total`, as NGINX names a
//! client-closed request. Every request then ends in exactly one of:
//! answered (the response body's record), refused (`llmlb_rejections_total`)
//! or client-closed.

use std::sync::Arc;

use crate::telemetry::Metrics;

#[derive(Debug)]
pub struct ClientClosed {
    metrics: Arc<Metrics>,
    /// The pool, once known.
    pub pool: Option<String>,
    armed: bool,
}

impl ClientClosed {
    pub fn new(metrics: &Arc<Metrics>) -> ClientClosed {
        ClientClosed {
            metrics: Arc::clone(metrics),
            pool: None,
            armed: true,
        }
    }

    /// The handler produced a response (or an error response).
    pub fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for ClientClosed {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let pool = self.pool.as_deref().unwrap_or("");
        self.metrics
            .requests
            .with_label_values(&[pool, "", "499"])
            .inc();
        tracing::debug!(
            pool,
            "client closed the request before the response started"
        );
    }
}

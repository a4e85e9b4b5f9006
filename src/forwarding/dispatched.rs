//! Where a forwarded request went, carried by the response body
//! (`ProxyBody::dispatched`) for the access log and metrics above the
//! forwarding layer.

use std::sync::Arc;

#[derive(Debug, Clone)]
pub struct Dispatched {
    /// The replica that answered (its configured name).
    pub replica: Arc<str>,
    /// The balancer branch that picked it.
    pub branch: &'static str,
    /// Attempts made, this one included (1 = no retry).
    pub attempts: u32,
    /// Cached prompt tokens the routing stage predicted for this replica
    /// (prefix modes other than `off`).
    pub predicted_cached: Option<u64>,
    /// The cost model's expected time to first token there, in seconds,
    /// when it picked this replica (`cache` and `exact` modes).
    pub predicted_ttft: Option<f64>,
    /// The request's kind for the closed-loop metrics (`plain`, `tools`,
    /// `template_args`, `adapter`).
    pub kind: &'static str,
}

/// How far forwarding got, written into the caller's record as it goes:
/// it outlives a forward the client abandoned, so a request whose client
/// left while it waited for a replica still names its attempts.
#[derive(Debug, Default)]
pub struct Progress {
    /// Replicas the request was sent to (1 = no re-send).
    pub attempts: u32,
    /// The last of them.
    pub replica: Option<Arc<crate::replica::Replica>>,
}

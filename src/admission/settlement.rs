//! Settling a caller's token charge when its answer ends: the rate-limit
//! buckets were charged an estimate up front (prompt plus output allowance);
//! the replica's reported `usage.total_tokens` replaces it when there is one.
//! Without a report the charge stays at its estimate. Pure arithmetic on the
//! caller's buckets and one counter; the response body that observes the
//! usage lives at the edge (`server::scope`).

use std::sync::Arc;
use std::time::Instant;

use super::AdmissionMetrics;
use crate::gateway::Caller;

/// What to settle when the response ends.
#[derive(Debug)]
pub struct Settlement {
    pub caller: Caller,
    /// Tokens charged up front (prompt estimate plus output allowance).
    pub estimated: u64,
    /// The process's, shared (a request holds a count, not a copy).
    pub metrics: Arc<AdmissionMetrics>,
}

impl Settlement {
    /// Settles with the tokens the replica reported (`None`: keep the
    /// estimate) and counts the tenant's tokens. Returns the tokens counted.
    pub fn settle(self, reported: Option<u64>) -> u64 {
        let used = reported.unwrap_or(self.estimated);
        if reported.is_some() {
            self.caller.settle(self.estimated, used, Instant::now());
        }
        if let Some(tenant) = &self.caller.tenant {
            self.metrics
                .tenant_tokens
                .with_label_values(&[tenant])
                .inc_by(used);
        }
        used
    }
}

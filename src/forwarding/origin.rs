//! Whom a forwarded request is for and where its facts go, made once per
//! request and borrowed by each upstream request it leads to (the answer's
//! and a disaggregated pool's prefill).

use std::net::IpAddr;
use std::sync::Arc;

use http::HeaderValue;

use super::RecentDispatches;
use crate::telemetry::Metrics;
use crate::telemetry::trace::RequestTrace;

/// The request's id and trace, the client's address, and the process's
/// metrics and list of recent dispatches that each attempt writes to.
pub struct Origin<'a> {
    /// Sent upstream as `x-request-id` and put on the answer.
    pub request_id: &'a HeaderValue,
    /// Appended to `x-forwarded-for`.
    pub client_ip: IpAddr,
    /// Each attempt gets a span and sends its context.
    pub trace: Option<&'a RequestTrace>,
    pub metrics: &'a Arc<Metrics>,
    /// The last dispatch decisions, shown on the status page.
    pub recent: &'a RecentDispatches,
}

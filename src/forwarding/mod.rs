//! Forwarding: send the original request bytes to the chosen replica, retry on
//! another replica while nothing has reached the client, and stream the answer
//! back frame by frame.

mod body;
mod client;
mod dispatched;
mod forward;
mod headers;
mod recent;
mod tls;
mod usage;

pub use body::{BoxError, ProxyBody, ResponseBody, STREAM_ERROR, StreamBroken, full_body};
pub use client::{UpstreamClient, client, error_chain, tls_client};
pub use dispatched::Dispatched;
pub use forward::{ForwardRequest, forward};
pub use headers::{CONTROL_PREFIX, REPLICA_HEADER, REQUEST_ID, strip_hop_by_hop, strip_private};
pub use recent::{Dispatch, RecentDispatches};
pub use tls::{UpstreamTls, UpstreamTlsError};
pub use usage::usage_tokens;

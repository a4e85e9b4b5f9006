//! Forwarding: send the original request bytes to the chosen replica, retry on
//! another replica while nothing has reached the client, and stream the answer
//! back frame by frame.

mod body;
mod disaggregation_metrics;
mod dispatched;
mod error;
mod forward;
mod headers;
mod idle;
mod observed;
mod origin;
mod outbound;
mod prefill;
mod recent;
mod stream_usage;
mod usage_strip;

pub use body::ProxyBody;
pub use disaggregation_metrics::DisaggregationMetrics;
pub use dispatched::{Dispatched, Progress};
pub use error::ForwardError;
pub use forward::{ForwardRequest, forward};
pub use headers::{CONTROL_PREFIX, REPLICA_HEADER, REQUEST_ID, strip_hop_by_hop, strip_private};
pub use observed::{Observed, Observer};
pub use origin::Origin;
pub use outbound::Outbound;
pub use prefill::{PrefillError, PrefillRequest, Prefilled, prefill};
pub use recent::{Dispatch, Outcome, RecentDispatches};
pub use stream_usage::StreamOptions;

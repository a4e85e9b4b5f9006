//! HTTP plumbing shared by the proxy, its admin listener and the simulated
//! replica, below every stage of the request path: body types and the JSON
//! error body ([`body`]), one accept loop with its connection watcher and
//! optional TLS ([`accept`], [`connection`], [`client_tls`]), a body that
//! reports its frames and its end once ([`guarded`]: `Watched`, and
//! `Guarded` that holds a guard until then), and the pooled client that
//! reaches replicas ([`upstream`], [`upstream_tls`]) and the small one the
//! health and scrape loops probe them with ([`probe`]); reading `usage` from
//! a response's bytes ([`UsageScan`], [`find_usage`]) and waiting for a stop
//! signal ([`stopped`]).
//!
//! It imports only `config` (the settings it is built from); nothing here
//! knows about pools, routing or the daemon's state.

pub mod accept;
pub mod body;
pub mod client_tls;
pub mod connection;
pub mod guarded;
mod head_deadline;
pub mod probe;
mod shutdown;
pub mod upstream;
pub mod upstream_tls;
mod usage;

pub use accept::{ConnMetrics, Limits};
pub use body::{
    BoxError, ReadError, ResponseBody, error_response, full_body, json_error, read_body,
};
pub use guarded::{End, Guarded, Watch, Watched};
pub use probe::{ProbeError, Prober};
pub use shutdown::{sleep_or_stop, stopped};
pub use upstream::{
    IdleConns, Lent, UpstreamBody, UpstreamClient, UpstreamError, client, error_chain, tls_client,
};
pub use upstream_tls::UpstreamTls;
pub use usage::{Details, USAGE_KEY, Usage, UsageScan, find_usage, usage_value, value_after_key};

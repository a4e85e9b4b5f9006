//! Gateway: who is calling (API key → tenant and tier), at which priority, and
//! whether their rate limits allow another request.
//!
//! [`auth`] identifies the caller, [`key_state`] holds each key's buckets
//! across reloads, [`charging`] charges, refunds and settles them (locally,
//! or in Redis through [`shared_limits`] with a local fallback), and
//! [`Charge`] refunds a charge on every path that does not commit it.
//! Refusals are typed ([`AuthError`], [`RateLimited`]); their HTTP form is
//! the server's business. Keys never appear in logs or metric labels;
//! tenant names do.

pub mod auth;
mod charge;
pub mod charging;
mod error;
pub mod key_state;
pub mod keys;
mod lua;
pub mod rate_limit;
pub mod shared_limits;

pub use auth::{Caller, Gateway};
pub use charge::Charge;
pub use charging::RateHeaders;
pub use error::{AuthError, LimitKind, RateLimited};
pub use key_state::KeyState;
pub use shared_limits::redact_url;

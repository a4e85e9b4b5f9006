//! Replica state: everything llmlb knows about one replica, at the bottom
//! of the request path so that every layer above can read it.
//!
//! A [`Replica`] ([`state`]) holds the atomics the request path moves (in-flight
//! requests and tokens, what was sent since the last scrape) and the state
//! the loops beside it write: the last scrape ([`LoadSnapshot`]), the
//! restart watch ([`restart`]), the learned rates ([`learned`]), active
//! health ([`health`]), passive outlier ejection ([`outlier`]) and the LoRA
//! adapters it holds ([`adapters`]).
//! [`ReplicaView`] ([`view`]) is the copy of those numbers a balancer
//! compares at pick time.
//!
//! Imports only the bottom layer (`config`, `telemetry`, `net`); the scrape
//! and health loops (`signals`, `health`) write into it, the balancers and
//! the pool stack read it.

pub mod adapters;
pub mod carried;
pub mod health;
pub mod learned;
pub mod outlier;
pub mod restart;
mod snapshot;
pub mod state;
pub mod view;

pub use health::{ActiveHealth, Transition};
pub use learned::{LearnedRates, Rates};
pub use restart::RestartWatch;
pub use snapshot::{EngineTiming, LoadSnapshot};
pub use state::{InFlightGuard, PrefillHook, Replica, ReplicaId};
pub use view::{KvRoom, ReplicaView, ScrapedLoad};

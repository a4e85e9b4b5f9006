//! Health: the active-check loop (`GET /health` on a cadence, HAProxy's
//! fall/rise). The state it writes lives on the replica
//! (`replica::health`); passive outlier ejection is `replica::outlier`; the
//! HTTP client it probes with is `net::probe`.

pub mod checker;

//! A rate-limit charge that refunds itself unless committed: a request
//! refused after it was charged (queue full, no replica, upstream error) or
//! whose client went away before the response started gives the caller's
//! request and tokens back, on every path, without a hand-written refund.

use std::time::Instant;

use super::Caller;

/// `tokens` charged to `caller`; refunded on drop unless [`Charge::commit`]ted.
#[derive(Debug)]
pub struct Charge<'a> {
    caller: &'a Caller,
    tokens: u64,
    armed: bool,
}

impl<'a> Charge<'a> {
    pub fn new(caller: &'a Caller, tokens: u64) -> Charge<'a> {
        Charge {
            caller,
            tokens,
            armed: true,
        }
    }

    /// The request goes ahead: the response body settles the charge.
    pub fn commit(mut self) {
        self.armed = false;
    }
}

impl Drop for Charge<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.caller.refund(self.tokens, Instant::now());
        }
    }
}

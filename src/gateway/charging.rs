//! Charging a caller's rate limits: one request and an estimated number of
//! tokens per request, given back when the request is not served and
//! settled with the tokens the response reports.
//!
//! With a shared backend (Redis) the key's shared buckets are charged; when
//! the backend fails the request is checked against the local buckets
//! instead ([`super::shared_limits`] counts and logs the fallback). A
//! refused charge takes nothing: when the token bucket refuses after the
//! request bucket agreed, the request is given back. A refund or settlement
//! goes to the buckets the charge was taken from (the caller's `Ledger`):
//! a charge that fell back to the local buckets is given back locally, not
//! credited to Redis. Refunds and settlements of shared charges run in the
//! background
//! ([`SharedLimits::adjust_later`](super::shared_limits::SharedLimits::adjust_later)).
//!
//! Cost: one bucket lock per limit locally, one Redis round trip shared.

use std::time::Instant;

use super::auth::Ledger;
use super::rate_limit::BucketStatus;
use super::shared_limits::SharedCharge;
use super::{Caller, LimitKind, RateLimited};

/// How the caller's buckets stand after a charge: what the `x-ratelimit-*`
/// headers report.
#[derive(Debug, Clone, Default)]
pub struct RateHeaders {
    pub requests: Option<BucketStatus>,
    pub tokens: Option<BucketStatus>,
}

impl Caller {
    /// Charges one request and `tokens` estimated tokens against the key's
    /// limits: the shared buckets when configured (falling back to local ones
    /// when the backend fails), else the local ones.
    pub async fn charge(&self, tokens: u64, now: Instant) -> Result<RateHeaders, RateLimited> {
        let (Some(key), Some(shared)) = (&self.key, &self.shared) else {
            return self.charge_local(tokens, now);
        };
        if key.requests_per_minute.is_none() && key.tokens_per_minute.is_none() {
            return Ok(RateHeaders::default());
        }
        // The round trip's future is kilobytes: on the heap, so that the
        // future of every request, charged here or not, does not carry it.
        let charged = Box::pin(shared.charge(
            &key.id,
            key.requests_per_minute,
            key.tokens_per_minute,
            tokens,
        ));
        match charged.await {
            Ok(SharedCharge::Admitted { requests, tokens }) => {
                let _ = self.ledger.set(Ledger::Shared);
                Ok(RateHeaders { requests, tokens })
            }
            Ok(SharedCharge::Denied {
                kind,
                wait,
                requests,
                tokens,
            }) => Err(RateLimited {
                kind,
                retry_after: wait,
                headers: RateHeaders { requests, tokens },
            }),
            Err(_) => {
                let _ = self.ledger.set(Ledger::Local);
                self.charge_local(tokens, now)
            }
        }
    }

    /// Charges the local buckets. Nothing is charged when either refuses.
    pub fn charge_local(&self, tokens: u64, now: Instant) -> Result<RateHeaders, RateLimited> {
        let Some(key) = &self.key else {
            return Ok(RateHeaders::default());
        };
        let mut headers = RateHeaders::default();
        if let Some(b) = &key.requests {
            match b.try_take(1, now) {
                Ok(s) => headers.requests = Some(s),
                Err((s, wait)) => {
                    headers.requests = Some(s);
                    headers.tokens = key.tokens.as_ref().map(|t| t.peek(now));
                    return Err(RateLimited {
                        kind: LimitKind::Requests,
                        retry_after: wait,
                        headers,
                    });
                }
            }
        }
        if let Some(b) = &key.tokens {
            match b.try_take(tokens, now) {
                Ok(s) => headers.tokens = Some(s),
                Err((s, wait)) => {
                    if let Some(r) = &key.requests {
                        r.adjust(1, now);
                        headers.requests = Some(r.peek(now));
                    }
                    headers.tokens = Some(s);
                    return Err(RateLimited {
                        kind: LimitKind::Tokens,
                        retry_after: wait,
                        headers,
                    });
                }
            }
        }
        Ok(headers)
    }

    /// Hands a shared-bucket adjustment to the background; false when the
    /// caller has no shared buckets or its charge fell back to local ones.
    fn adjust_shared(&self, token_delta: i64, refund_request: bool) -> bool {
        let (Some(key), Some(shared)) = (&self.key, &self.shared) else {
            return false;
        };
        if self.ledger.get() == Some(&Ledger::Local) {
            return false;
        }
        shared.adjust_later(
            &key.id,
            key.requests_per_minute,
            key.tokens_per_minute,
            token_delta,
            refund_request,
        );
        true
    }

    /// Gives back a whole charge (the request was not served).
    pub fn refund(&self, tokens: u64, now: Instant) {
        if self.adjust_shared(tokens as i64, true) {
            return;
        }
        if let Some(key) = &self.key {
            if let Some(b) = &key.requests {
                b.adjust(1, now);
            }
            if let Some(b) = &key.tokens {
                b.adjust(tokens as i64, now);
            }
        }
    }

    /// Settles an estimated token charge with what the response reported.
    pub fn settle(&self, estimated: u64, actual: u64, now: Instant) {
        if self.adjust_shared(estimated as i64 - actual as i64, false) {
            return;
        }
        if let Some(b) = self.key.as_ref().and_then(|k| k.tokens.as_ref()) {
            b.adjust(estimated as i64 - actual as i64, now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::auth::tests::{acme, gateway};

    #[test]
    fn request_and_token_limits() {
        let c = acme(&gateway(true));
        let now = Instant::now();
        let h = c.charge_local(40, now).unwrap();
        assert_eq!(h.requests.unwrap().remaining, 1);
        assert_eq!(h.tokens.unwrap().remaining, 60);
        // Tokens refuse: the request charge is given back.
        let refused = c.charge_local(80, now).unwrap_err();
        assert_eq!(refused.kind, LimitKind::Tokens);
        assert_eq!(refused.headers.requests.unwrap().remaining, 1);
        c.charge_local(10, now).unwrap();
        assert_eq!(
            c.charge_local(1, now).unwrap_err().kind,
            LimitKind::Requests
        );
    }

    #[test]
    fn a_refund_gives_the_request_and_tokens_back() {
        let c = acme(&gateway(true));
        let now = Instant::now();
        c.charge_local(70, now).unwrap();
        c.refund(70, now);
        let h = c.charge_local(0, now).unwrap();
        assert_eq!(h.requests.unwrap().remaining, 1);
        assert_eq!(h.tokens.unwrap().remaining, 100);
        // An estimate of 90 that used 30: 60 come back.
        c.charge_local(90, now).unwrap();
        c.settle(90, 30, now);
        assert_eq!(
            c.charge_local(0, now).unwrap_err().kind,
            LimitKind::Requests
        );
        let key = c.key.as_ref().unwrap();
        assert_eq!(key.tokens.as_ref().unwrap().peek(now).remaining, 70);
    }

    #[tokio::test]
    async fn a_charge_that_fell_back_to_local_buckets_is_given_back_there() {
        // Redis on a loopback port where nothing listens: every call fails.
        let g = crate::gateway::auth::tests::gateway_from(
            "limits = { backend = \"redis\", url = \"redis://127.0.0.1:9/0\", timeout = \"200ms\" }",
            "auth = true",
        );
        let c = acme(&g);
        assert!(c.shared.is_some());
        let now = Instant::now();
        let h = c.charge(70, now).await.unwrap();
        assert_eq!(h.tokens.unwrap().remaining, 30, "charged locally");
        c.refund(70, now);
        let key = c.key.as_ref().unwrap();
        assert_eq!(key.tokens.as_ref().unwrap().peek(now).remaining, 100);
        assert_eq!(key.requests.as_ref().unwrap().peek(now).remaining, 2);
        // A settlement of a fallen-back charge is local too.
        let c = acme(&g);
        c.charge(90, now).await.unwrap();
        c.settle(90, 30, now);
        assert_eq!(key.tokens.as_ref().unwrap().peek(now).remaining, 70);
    }
}

//! The `x-ratelimit-*` response headers, in OpenAI's format, from how the
//! caller's buckets stand after a charge ([`RateHeaders`]).
//!
//! For each of `requests` and `tokens` with a limit: `x-ratelimit-limit-*`,
//! `x-ratelimit-remaining-*` and `x-ratelimit-reset-*` (time until the
//! bucket is full again: `250ms`, `1s`, `6m0s`, `1h2m5s`). A key without
//! limits, or a request without a key, gets none.

use std::time::Duration;

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

use crate::gateway::RateHeaders;

/// Writes the headers for `rate` into `headers`.
pub fn apply(rate: &RateHeaders, headers: &mut HeaderMap) {
    for (kind, status) in [("requests", rate.requests), ("tokens", rate.tokens)] {
        if let Some(s) = status {
            let pairs = [
                (format!("x-ratelimit-limit-{kind}"), s.limit.to_string()),
                (
                    format!("x-ratelimit-remaining-{kind}"),
                    s.remaining.to_string(),
                ),
                (format!("x-ratelimit-reset-{kind}"), format_reset(s.reset)),
            ];
            for (name, value) in pairs {
                if let (Ok(n), Ok(v)) = (
                    HeaderName::from_bytes(name.as_bytes()),
                    HeaderValue::from_str(&value),
                ) {
                    headers.insert(n, v);
                }
            }
        }
    }
}

/// OpenAI's reset format: `1s`, `6m0s`, `250ms`.
pub fn format_reset(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let secs = d.as_secs_f64().ceil() as u64;
    let (h, m, s) = (secs / 3600, (secs % 3600) / 60, secs % 60);
    if h > 0 {
        format!("{h}h{m}m{s}s")
    } else if m > 0 {
        format!("{m}m{s}s")
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::rate_limit::BucketStatus;

    #[test]
    fn reset_format() {
        assert_eq!(format_reset(Duration::from_millis(250)), "250ms");
        assert_eq!(format_reset(Duration::from_secs(1)), "1s");
        assert_eq!(format_reset(Duration::from_secs(360)), "6m0s");
        assert_eq!(format_reset(Duration::from_secs(3725)), "1h2m5s");
    }

    #[test]
    fn only_limited_kinds_get_headers() {
        let rate = RateHeaders {
            requests: Some(BucketStatus {
                limit: 60,
                remaining: 59,
                reset: Duration::from_secs(1),
            }),
            tokens: None,
        };
        let mut h = HeaderMap::new();
        apply(&rate, &mut h);
        assert_eq!(h["x-ratelimit-limit-requests"], "60");
        assert_eq!(h["x-ratelimit-remaining-requests"], "59");
        assert_eq!(h["x-ratelimit-reset-requests"], "1s");
        assert_eq!(h.len(), 3);
    }
}

//! Header hygiene between client and replica: hop-by-hop headers are removed
//! (RFC 9110 §7.6.1), everything else passes through unchanged.

use http::HeaderMap;
use http::header::{self, HeaderName};

pub const REQUEST_ID: &str = "x-request-id";
/// Response header naming the replica that served the request (opt-in).
pub const REPLICA_HEADER: &str = "x-llmlb-replica";

const HOP_BY_HOP: &[HeaderName] = &[
    header::CONNECTION,
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Prefix of llmlb's own request headers (tier, version, ...): read by
/// llmlb, never forwarded.
pub const CONTROL_PREFIX: &str = "x-llmlb-";

/// Headers that carry a client's API key.
const CLIENT_KEY: &[&str] = &["authorization", "x-api-key"];

/// Prepares the client's headers for the replica: llmlb's control headers
/// go; the client's key goes when it was llmlb's (`strip_key`) or when the
/// pool sends its own (`upstream_auth`), which then takes its place.
pub fn strip_private(
    headers: &mut HeaderMap,
    strip_key: bool,
    upstream_auth: Option<&http::HeaderValue>,
) {
    // Most requests carry none: look before collecting.
    let is_control = |k: &HeaderName| k.as_str().starts_with(CONTROL_PREFIX);
    if headers.keys().any(is_control) {
        let control: Vec<HeaderName> = headers.keys().filter(|k| is_control(k)).cloned().collect();
        for name in control {
            headers.remove(name);
        }
    }
    if strip_key || upstream_auth.is_some() {
        for name in CLIENT_KEY {
            headers.remove(*name);
        }
    }
    if let Some(v) = upstream_auth {
        headers.insert(header::AUTHORIZATION, v.clone());
    }
}

/// Removes hop-by-hop headers, including any the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if headers.contains_key(header::CONNECTION) {
        let named: Vec<HeaderName> = headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
            .collect();
        for name in named {
            headers.remove(name);
        }
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_listed_and_named_headers() {
        let mut h = HeaderMap::new();
        h.insert("connection", "close, x-secret".parse().unwrap());
        h.insert("x-secret", "1".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("transfer-encoding", "chunked".parse().unwrap());
        h.insert("authorization", "Bearer k".parse().unwrap());
        h.insert("x-custom", "kept".parse().unwrap());
        strip_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, vec!["authorization", "x-custom"]);
    }
}

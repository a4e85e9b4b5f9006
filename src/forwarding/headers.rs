//! Header hygiene between client and replica: hop-by-hop headers are removed
//! (RFC 9110 §7.6.1), everything else passes through unchanged.

use http::HeaderMap;
use http::header::{self, HeaderName};

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
/// Response header naming the replica that served the request (opt-in).
pub const REPLICA_HEADER: HeaderName = HeaderName::from_static("x-llmlb-replica");
pub const FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

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

const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");

fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(name) || *name == KEEP_ALIVE || *name == PROXY_CONNECTION
}

/// Whether a `Connection` option names a header to remove (`close` and
/// `keep-alive` are the usual ones and name nothing else).
fn names_other_header(option: &[u8]) -> bool {
    !(option.is_empty()
        || option.eq_ignore_ascii_case(b"close")
        || option.eq_ignore_ascii_case(b"keep-alive"))
}

/// Removes hop-by-hop headers, including any the `Connection` header names.
///
/// A message has a handful of headers and usually no hop-by-hop one but
/// `Connection: keep-alive` (or `close`): the headers are scanned, and only
/// those present are removed (a removal by name hashes it, a scan compares
/// a few). One scan finds the first, counts the others and sees whether a
/// `Connection` value may name other headers (its options are split only
/// then); each removal after the first scans again, so the headers are
/// removed in the order a scan after each removal finds them.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let (mut first, mut count, mut names_others) = (None, 0, false);
    let mut last: Option<&HeaderName> = None;
    // A name's values come one after another.
    for (name, value) in headers.iter().filter(|(k, _)| is_hop_by_hop(k)) {
        names_others |= *name == header::CONNECTION && !names_nothing(value.as_bytes());
        if last != Some(name) {
            first.get_or_insert(name);
            count += 1;
            last = Some(name);
        }
    }
    let Some(first) = first.cloned() else {
        return;
    };
    // The headers `Connection` names besides its own options (rarely any).
    let named: Vec<HeaderName> = match names_others {
        true => headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(str::trim)
            .filter(|o| names_other_header(o.as_bytes()))
            .filter_map(|o| HeaderName::from_bytes(o.as_bytes()).ok())
            .collect(),
        false => Vec::new(),
    };
    if named.is_empty() {
        headers.remove(first);
        for _ in 1..count {
            if let Some(name) = next_hop_by_hop(headers) {
                headers.remove(name);
            }
        }
        return;
    }
    for name in named {
        headers.remove(name);
    }
    // The names removed may have been hop-by-hop ones: scan until none is left.
    while let Some(name) = next_hop_by_hop(headers) {
        headers.remove(name);
    }
}

/// Whether a `Connection` value, read whole, is one option that names no
/// header (the usual `keep-alive` or `close`): a value with a comma is
/// never one option, so it is split.
fn names_nothing(value: &[u8]) -> bool {
    !names_other_header(value.trim_ascii())
}

/// The first hop-by-hop header name in the map's order.
fn next_hop_by_hop(headers: &HeaderMap) -> Option<HeaderName> {
    headers.keys().find(|k| is_hop_by_hop(k)).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names left, sorted, once `headers` (appended in order) are
    /// stripped.
    fn left_after_strip(headers: &[(&'static str, &'static str)]) -> Vec<String> {
        let mut h = HeaderMap::new();
        for (name, value) in headers {
            h.append(*name, http::HeaderValue::from_static(value));
        }
        strip_hop_by_hop(&mut h);
        let mut left: Vec<String> = h.keys().map(|k| k.to_string()).collect();
        left.sort();
        left
    }

    #[test]
    fn strips_listed_and_named_headers() {
        let left = left_after_strip(&[
            ("connection", "close, x-secret"),
            ("x-secret", "1"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("authorization", "Bearer k"),
            ("x-custom", "kept"),
        ]);
        assert_eq!(left, vec!["authorization", "x-custom"]);
        // A second `Connection` value may name a header when the first names none.
        let left = left_after_strip(&[
            ("connection", " Keep-Alive "),
            ("connection", "x-secret"),
            ("x-secret", "1"),
            ("x-custom", "kept"),
        ]);
        assert_eq!(left, vec!["x-custom"]);
        assert!(names_nothing(b"CLOSE") && names_nothing(b" keep-alive"));
        assert!(!names_nothing(b"keep-alive, x-a") && !names_nothing(b"upgrade"));
    }

    /// The headers left, in the map's order, are those a new scan after
    /// each removal leaves (a removal moves the last entry into its place).
    #[test]
    fn the_headers_left_keep_the_order_of_one_removal_per_scan() {
        let lists: [&[(&str, &str)]; 3] = [
            &[
                ("te", "trailers"),
                ("a", "1"),
                ("connection", "keep-alive"),
                ("b", "2"),
                ("upgrade", "h2c"),
                ("c", "3"),
                ("keep-alive", "timeout=5"),
                ("d", "4"),
            ],
            &[("a", "1"), ("connection", "close"), ("b", "2"), ("c", "3")],
            &[
                ("connection", "x-a, te"),
                ("x-a", "1"),
                ("te", "t"),
                ("b", "2"),
                ("c", "3"),
            ],
        ];
        for list in lists {
            let mut h = HeaderMap::new();
            for (name, value) in list {
                h.append(
                    HeaderName::from_bytes(name.as_bytes()).unwrap(),
                    http::HeaderValue::from_static(value),
                );
            }
            // The names `Connection` gives, then one hop-by-hop name a scan.
            let mut rescanned = h.clone();
            let named: Vec<String> = h
                .get_all("connection")
                .iter()
                .flat_map(|v| v.to_str().unwrap().split(','))
                .map(|o| o.trim().to_owned())
                .filter(|o| names_other_header(o.as_bytes()))
                .collect();
            for name in named {
                rescanned.remove(name.as_str());
            }
            while let Some(name) = next_hop_by_hop(&rescanned) {
                rescanned.remove(name);
            }
            strip_hop_by_hop(&mut h);
            let order = |m: &HeaderMap| m.keys().map(|k| k.to_string()).collect::<Vec<_>>();
            assert_eq!(order(&h), order(&rescanned), "{list:?}");
        }
    }

    #[test]
    fn keeps_everything_else_when_connection_names_only_its_own_options() {
        let left = left_after_strip(&[
            ("connection", "keep-alive"),
            ("connection", "Close"),
            ("proxy-connection", "keep-alive"),
            ("content-type", "text/event-stream"),
            ("x-request-id", "abc"),
        ]);
        assert_eq!(left, vec!["content-type", "x-request-id"]);
    }
}

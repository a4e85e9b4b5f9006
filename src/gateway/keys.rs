//! API keys: stored as SHA-256 digests, looked up in constant time.
//!
//! The presented key is hashed once; the digest is then compared with every
//! configured digest without early exit (`subtle`), so response timing says
//! nothing about how close a guess was.

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// SHA-256 of a key, as lowercase hex (what `llmlb hash-key` prints).
pub fn hash_key(key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses 64 hex digits into a digest.
pub fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// Index of the digest matching `presented`, comparing against all of them.
pub fn find(digests: &[[u8; 32]], presented: &str) -> Option<usize> {
    let h: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
    let mut found: Option<usize> = None;
    for (i, d) in digests.iter().enumerate() {
        if bool::from(d.ct_eq(&h)) {
            found = Some(i);
        }
    }
    found
}

/// The other header a client may carry its key in.
const X_API_KEY: http::HeaderName = http::HeaderName::from_static("x-api-key");

/// The key a request presents: `Authorization: Bearer KEY` or `x-api-key: KEY`.
pub fn presented_key(headers: &http::HeaderMap) -> Option<&str> {
    if let Some(v) = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    {
        let v = v.trim();
        if v.len() > 7 && v[..7].eq_ignore_ascii_case("bearer ") {
            return Some(v[7..].trim());
        }
    }
    headers
        .get(X_API_KEY)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|k| !k.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_matches_known_vector() {
        assert_eq!(
            hash_key("test"),
            "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
    }

    #[test]
    fn finds_only_the_right_key() {
        let digests = [
            parse_digest(&hash_key("alpha")).unwrap(),
            parse_digest(&hash_key("beta")).unwrap(),
        ];
        assert_eq!(find(&digests, "beta"), Some(1));
        assert_eq!(find(&digests, "alpha"), Some(0));
        assert_eq!(find(&digests, "gamma"), None);
        assert_eq!(find(&digests, ""), None);
    }

    #[test]
    fn reads_bearer_and_x_api_key() {
        let mut h = http::HeaderMap::new();
        h.insert("authorization", "Bearer sk-1".parse().unwrap());
        assert_eq!(presented_key(&h), Some("sk-1"));
        let mut h = http::HeaderMap::new();
        h.insert("x-api-key", "sk-2".parse().unwrap());
        assert_eq!(presented_key(&h), Some("sk-2"));
        let mut h = http::HeaderMap::new();
        h.insert("authorization", "Basic abc".parse().unwrap());
        assert_eq!(presented_key(&h), None);
    }

    #[test]
    fn rejects_malformed_digests() {
        assert!(parse_digest("abc").is_none());
        assert!(parse_digest(&"g".repeat(64)).is_none());
    }
}

//! Reads token counts from the `usage` object a replica reports, in a JSON
//! body or an SSE event (vLLM sends it in the last event when asked with
//! `stream_options.include_usage`, and in every event with
//! `continuous_usage_stats`). A byte scan, no JSON parse: it runs on every
//! chunk of every response.
//!
//! [`ReportedUsage`] carries the usage event llmlb asked a stream for and
//! kept from the client (see `forwarding::usage_strip`) to the layers above
//! the forwarding body: settlement and the access log read it there.

use std::sync::{Arc, LazyLock, OnceLock};

use bytes::Bytes;
use memchr::memmem;

/// The usage event a replica sent in a stream that llmlb removed before the
/// client saw it. Shared through the response's extensions; set at most once.
#[derive(Debug, Clone, Default)]
pub struct ReportedUsage(Arc<OnceLock<Bytes>>);

impl ReportedUsage {
    /// Keeps the removed event (the first one only).
    pub fn set(&self, event: Bytes) {
        let _ = self.0.set(event);
    }

    /// The removed event's bytes, when there was one.
    pub fn event(&self) -> Option<&Bytes> {
        self.0.get()
    }

    /// `usage.FIELD` of the removed event.
    pub fn tokens(&self, field: &str) -> Option<u64> {
        self.event().and_then(|e| usage_tokens(e, field))
    }
}

/// The `"usage"` key, its searcher built once (building one costs more
/// than searching a short chunk with it).
pub static USAGE_KEY: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new(b"\"usage\""));

/// The usage fields llmlb reads, their searchers built once too.
static FIELD_KEYS: LazyLock<[memmem::Finder<'static>; 3]> = LazyLock::new(|| {
    [&b"prompt_tokens"[..], b"completion_tokens", b"total_tokens"].map(memmem::Finder::new)
});

/// Finds `"FIELD": N` inside a `"usage"` object in one chunk. Usage that
/// straddles two chunks is not seen (vLLM sends each event, and small JSON
/// bodies, in one chunk). Both searches are `memchr::memmem`'s; nothing is
/// allocated.
pub fn usage_tokens(chunk: &[u8], field: &str) -> Option<u64> {
    usage_tokens_after(chunk, USAGE_KEY.find(chunk)?, field)
}

/// [`usage_tokens`] for a caller that has found `"usage"` in `chunk`
/// already, at `usage`.
pub fn usage_tokens_after(chunk: &[u8], usage: usize, field: &str) -> Option<u64> {
    let rest = chunk.get(usage..)?;
    let field = field.as_bytes();
    // `"FIELD"`: the name with a quote on each side.
    let quoted = |at: usize| {
        let quoted = at > 0 && rest[at - 1] == b'"' && rest.get(at + field.len()) == Some(&b'"');
        quoted.then(|| &rest[at + field.len() + 1..])
    };
    let after = match FIELD_KEYS.iter().find(|f| f.needle() == field) {
        Some(finder) => finder.find_iter(rest).find_map(quoted),
        None => memmem::find_iter(rest, field).find_map(quoted),
    }?;
    let digits = after
        .iter()
        .skip_while(|b| **b == b':' || b.is_ascii_whitespace());
    let mut value: Option<u64> = None;
    for b in digits.take_while(|b| b.is_ascii_digit()) {
        value = Some(
            value
                .unwrap_or(0)
                .checked_mul(10)?
                .checked_add(u64::from(b - b'0'))?,
        );
    }
    value
}

#[cfg(test)]
mod tests {
    use super::{ReportedUsage, usage_tokens};

    #[test]
    fn reported_usage_keeps_the_first_event() {
        let r = ReportedUsage::default();
        assert_eq!(r.tokens("total_tokens"), None);
        let shared = r.clone();
        shared.set(bytes::Bytes::from_static(
            br#"data: {"choices":[],"usage":{"total_tokens":9}}"#,
        ));
        shared.set(bytes::Bytes::from_static(
            b"data: {\"usage\":{\"total_tokens\":1}}",
        ));
        assert_eq!(r.tokens("total_tokens"), Some(9));
    }

    #[test]
    fn reads_usage_from_sse_and_json() {
        let sse = br#"data: {"id":"x","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}"#;
        assert_eq!(usage_tokens(sse, "total_tokens"), Some(42));
        assert_eq!(usage_tokens(sse, "completion_tokens"), Some(30));
        let json = b"{\"usage\": {\"total_tokens\" : 7}}";
        assert_eq!(usage_tokens(json, "total_tokens"), Some(7));
        assert_eq!(
            usage_tokens(
                b"data: {\"choices\":[{\"text\":\"total_tokens\"}]}",
                "total_tokens"
            ),
            None
        );
        assert_eq!(
            usage_tokens(b"data: {\"usage\":null}", "total_tokens"),
            None
        );
    }
}

//! Keeping the usage event llmlb asked for out of the client's stream.
//!
//! When llmlb added `stream_options.include_usage` to a request
//! ([`super::stream_usage`]), the replica's stream carries one extra event:
//! `data: {..., "choices": [], "usage": {...}}`. [`UsageStrip`] removes that
//! event (and only it) from the bytes going to the client and hands it over
//! for accounting; every other byte, `data: [DONE]` included, passes
//! unchanged and in order.
//!
//! Events are cut at their blank line. A chunk that ends on an event
//! boundary and mentions no `"usage"` passes as the same buffer (vLLM sends
//! one event per chunk, so this is the usual case); otherwise complete
//! events are copied out and an unfinished one waits for its rest. Only an
//! event that mentions `"usage"` is parsed. At the end of the stream,
//! whatever is left passes as it is.

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde::de::IgnoredAny;

#[derive(Debug, Default)]
pub struct UsageStrip {
    /// Bytes of an event not finished yet.
    carry: BytesMut,
}

/// What one chunk becomes.
#[derive(Debug, Default, PartialEq)]
pub struct Filtered {
    /// For the client (may be empty).
    pub pass: Bytes,
    /// The removed usage event.
    pub usage: Option<Bytes>,
}

impl UsageStrip {
    pub fn filter(&mut self, chunk: Bytes) -> Filtered {
        if self.carry.is_empty() && ends_event(&chunk) && !contains(&chunk, b"\"usage\"") {
            return Filtered {
                pass: chunk,
                usage: None,
            };
        }
        self.carry.extend_from_slice(&chunk);
        let mut out = Filtered::default();
        let mut pass = BytesMut::new();
        while let Some(end) = event_end(&self.carry) {
            let event = self.carry.split_to(end).freeze();
            if out.usage.is_none() && is_usage_only(&event) {
                out.usage = Some(event);
            } else {
                pass.extend_from_slice(&event);
            }
        }
        out.pass = pass.freeze();
        out
    }

    /// What is left at the end of the stream (an event without its blank line).
    pub fn flush(&mut self) -> Bytes {
        std::mem::take(&mut self.carry).freeze()
    }
}

/// Whether `chunk` ends with a blank line (`\n\n`, or `\r\n\r\n`).
fn ends_event(chunk: &[u8]) -> bool {
    chunk.ends_with(b"\n\n") || chunk.ends_with(b"\n\r\n")
}

/// The length of the first complete event in `buf`, its blank line included.
fn event_end(buf: &[u8]) -> Option<usize> {
    let mut i = 0;
    while i + 1 < buf.len() {
        if buf[i] == b'\n' {
            if buf[i + 1] == b'\n' {
                return Some(i + 2);
            }
            if buf[i + 1] == b'\r' && buf.get(i + 2) == Some(&b'\n') {
                return Some(i + 3);
            }
        }
        i += 1;
    }
    None
}

/// An event whose single `data:` line is a chunk with no choices and a usage
/// object: the one `include_usage` adds.
fn is_usage_only(event: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Chunk {
        choices: Option<Vec<IgnoredAny>>,
        usage: Option<IgnoredAny>,
    }
    if !contains(event, b"\"usage\"") {
        return false;
    }
    let text = event.trim_ascii();
    let Some(json) = text.strip_prefix(b"data:") else {
        return false;
    };
    if json.contains(&b'\n') {
        return false;
    }
    serde_json::from_slice::<Chunk>(json.trim_ascii())
        .is_ok_and(|c| c.choices.is_some_and(|v| v.is_empty()) && c.usage.is_some())
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str =
        "data: {\"choices\":[{\"delta\":{\"content\":\"a b\"}}],\"usage\":null}\n\n";
    const USAGE: &str = "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    fn run(chunks: &[&str]) -> (String, Option<String>) {
        let mut s = UsageStrip::default();
        let mut text = Vec::new();
        let mut usage = None;
        for c in chunks {
            let f = s.filter(Bytes::from(c.to_string()));
            text.extend_from_slice(&f.pass);
            usage = usage.or(f.usage);
        }
        text.extend_from_slice(&s.flush());
        let usage = usage.map(|u| String::from_utf8(u.to_vec()).unwrap());
        (String::from_utf8(text).unwrap(), usage)
    }

    #[test]
    fn removes_the_usage_event_only() {
        let (text, usage) = run(&[TOKEN, TOKEN, USAGE, DONE]);
        assert_eq!(text, format!("{TOKEN}{TOKEN}{DONE}"));
        assert_eq!(usage.as_deref(), Some(USAGE));
    }

    #[test]
    fn works_across_and_within_chunk_boundaries() {
        let all = format!("{TOKEN}{USAGE}{DONE}");
        for cut in [1, 10, TOKEN.len(), TOKEN.len() + 5, all.len() - 3] {
            let (a, b) = all.split_at(cut);
            let (text, usage) = run(&[a, b]);
            assert_eq!(text, format!("{TOKEN}{DONE}"), "cut at {cut}");
            assert_eq!(usage.as_deref(), Some(USAGE), "cut at {cut}");
        }
        let (text, usage) = run(&[&all]);
        assert_eq!(
            (text, usage.as_deref()),
            (format!("{TOKEN}{DONE}"), Some(USAGE))
        );
    }

    #[test]
    fn passes_everything_else_unchanged() {
        let crlf = "data: {\"choices\":[]}\r\n\r\n: keep-alive\n\n";
        let (text, usage) = run(&[
            crlf,
            "data: {\"choices\":[{}],\"usage\":{\"a\":1}}\n\n",
            "tail",
        ]);
        assert_eq!(
            text,
            format!("{crlf}data: {{\"choices\":[{{}}],\"usage\":{{\"a\":1}}}}\n\ntail")
        );
        assert_eq!(usage, None);
    }
}

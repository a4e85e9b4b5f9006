//! Keeping the usage event llmlb asked for out of the client's stream.
//!
//! When llmlb added `stream_options.include_usage` to a request
//! ([`super::stream_usage`]), the replica's stream carries one extra event:
//! `data: {..., "choices": [], "usage": {...}}`. [`UsageStrip`] removes that
//! event (and only it) from the bytes going to the client and hands it over
//! for accounting; every other byte, `data: [DONE]` included, passes
//! unchanged and in order.
//!
//! Events are cut at their blank line. The complete events of a chunk pass
//! as a slice of the same buffer when none of them is the usage event (vLLM
//! sends one event per chunk, so this is the usual case); an unfinished
//! event waits for its rest. Only an event that mentions `"usage"` is
//! read ([`super::usage_event`]), and the search for it and for the blank
//! lines is `memchr`'s (one pass over the bytes, no per-byte comparison
//! loop). Removing the event copies the rest of the chunk once. At the end
//! of the stream, whatever is left passes as it is.

use bytes::{Bytes, BytesMut};

use super::usage_event::is_usage_only;

// The key every usage event carries.
use crate::net::USAGE_KEY;

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
    /// Where the first `"usage"` is in `pass` (`None`: not in it), known
    /// from the walk: the forwarding body does not search `pass` again.
    pub usage_in_pass: Option<usize>,
}

impl UsageStrip {
    /// `chunk`'s complete events, the usage event taken out. `usage_at` is
    /// where the caller found the first `"usage"` in `chunk` (`None`: not
    /// in it), so that the first search is not made twice.
    pub fn filter(&mut self, chunk: Bytes, usage_at: Option<usize>) -> Filtered {
        // Without a carried start, the events are the chunk's own bytes and
        // the caller's search holds for them.
        let searched = self.carry.is_empty();
        let buf = if searched {
            chunk
        } else {
            self.carry.extend_from_slice(&chunk);
            self.carry.split().freeze()
        };
        // One walk over the events, from one blank line to the next: the
        // ones that mention "usage" are looked at as it passes them, and
        // where it stops the unfinished event begins. (A "usage" key holds
        // no line break, so a hit never spans two events.)
        let search = |from: usize| USAGE_KEY.find(&buf[from..]).map(|i| i + from);
        let mut hit = if searched { usage_at } else { search(0) };
        let first = hit;
        let (mut start, mut usage) = (0, None);
        while let Some(len) = event_end(&buf[start..]) {
            let end = start + len;
            if usage.is_none() && hit.is_some_and(|h| h < end) {
                if is_usage_only(&buf[start..end]) {
                    usage = Some((start, end));
                } else {
                    hit = search(end);
                }
            }
            start = end;
        }
        let complete = start;
        if complete < buf.len() {
            self.carry.extend_from_slice(&buf[complete..]);
        }
        // A hit before `complete` ends before it: the blank line that ends
        // an event is not part of a key.
        let Some((start, end)) = usage else {
            return Filtered {
                pass: buf.slice(..complete),
                usage: None,
                usage_in_pass: first.filter(|&h| h < complete),
            };
        };
        // The first hit, when it comes before the usage event, is where it
        // was; otherwise the first is after the event, in the bytes that
        // follow it in `pass` (those before it hold none).
        let usage_in_pass = match first {
            Some(h) if h < start => Some(h),
            _ => USAGE_KEY.find(&buf[end..complete]).map(|i| start + i),
        };
        let pass = if start == 0 {
            buf.slice(end..complete)
        } else if end == complete {
            buf.slice(..start)
        } else {
            Bytes::from([&buf[..start], &buf[end..complete]].concat())
        };
        Filtered {
            pass,
            usage: Some(buf.slice(start..end)),
            usage_in_pass,
        }
    }

    /// What is left at the end of the stream (an event without its blank line).
    pub fn flush(&mut self) -> Bytes {
        std::mem::take(&mut self.carry).freeze()
    }
}

/// The length of the first complete event in `buf`, its blank line included
/// (`\n\n`, or `\n\r\n`).
fn event_end(buf: &[u8]) -> Option<usize> {
    memchr::memchr_iter(b'\n', buf).find_map(|i| match buf.get(i + 1) {
        Some(b'\n') => Some(i + 2),
        Some(b'\r') if buf.get(i + 2) == Some(&b'\n') => Some(i + 3),
        _ => None,
    })
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
            let f = s.filter(Bytes::from(c.to_string()), USAGE_KEY.find(c.as_bytes()));
            assert_eq!(f.usage_in_pass, USAGE_KEY.find(&f.pass), "{c:?}");
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

    /// Wherever the stream is cut, what the filter says of "usage" in the
    /// bytes it passes is what a search of them finds (`run` checks it):
    /// before the usage event, after it, or nowhere.
    #[test]
    fn says_where_usage_is_in_what_it_passes() {
        let plain = "data: {\"choices\":[{\"text\":\"a\"}]}\n\n";
        for all in [
            format!("{TOKEN}{USAGE}{TOKEN}{USAGE}{DONE}"),
            format!("{plain}{USAGE}{plain}{DONE}"),
            format!("{plain}{USAGE}{TOKEN}"),
            format!("{USAGE}{plain}"),
        ] {
            for a in 0..=all.len() {
                let (text, usage) = run(&[&all[..a], &all[a..]]);
                assert_eq!(usage.as_deref(), Some(USAGE), "cut at {a}");
                // Only usage events are taken out (one a chunk at most).
                assert!(text.len() < all.len(), "cut at {a}");
                assert_eq!(
                    text.replace(USAGE, ""),
                    all.replace(USAGE, ""),
                    "cut at {a}"
                );
            }
        }
    }

    #[test]
    fn strips_the_first_usage_event_of_a_chunk_among_others() {
        let chunk = format!("{TOKEN}{TOKEN}{USAGE}{TOKEN}{USAGE}{DONE}data: {{");
        let (text, usage) = run(&[&chunk]);
        assert_eq!(text, format!("{TOKEN}{TOKEN}{TOKEN}{USAGE}{DONE}data: {{"));
        assert_eq!(usage.as_deref(), Some(USAGE));
        let (text, usage) = run(&[&format!("{USAGE}{DONE}")]);
        assert_eq!((text, usage.as_deref()), (DONE.to_string(), Some(USAGE)));
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

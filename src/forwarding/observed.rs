//! What an answer showed on its way to the client, observed once per frame
//! for the request's end-of-request record and its settlement: when its
//! first byte and its first generated content went by, whether a stream's
//! closing `data: [DONE]` did, and the replica's `usage`.
//!
//! The forwarding body ([`super::ProxyBody`]) feeds its [`Observer`] with
//! each frame it hands on, reusing its own search for `"usage"`, and with
//! the usage event it kept from the client; the request's scope above
//! reads the [`Observed`] snapshot. Nothing of the body is copied (a frame
//! that ends inside a `usage` object keeps that object's start until the
//! next frame, see `net::UsageScan`).
//!
//! Cost per frame: a clock read until the first byte, a content scan of
//! SSE frames until the first content, the `[DONE]` check at a stream
//! frame's end, and a `usage` parse only in a frame that holds one.

use std::time::Instant;

use crate::net::{Usage, UsageScan};

/// An answer as it went by, so far.
#[derive(Debug, Default, Clone, Copy)]
pub struct Observed {
    /// The first non-empty frame.
    pub first_byte: Option<Instant>,
    /// The first generated content: the first SSE frame carrying text, or
    /// the first byte of an answer that is not a stream.
    pub first_content: Option<Instant>,
    /// A stream's closing `data: [DONE]` went by.
    pub done: bool,
    /// The last `usage` object in what the client was sent.
    pub sent: Option<Usage>,
    /// The usage event llmlb asked a stream for and kept from the client.
    pub kept: Option<Usage>,
}

impl Observed {
    /// The replica's usage for the record (the client's copy first, else
    /// the kept event) and the token total the charge is settled with
    /// (the kept event's first).
    pub fn usage(&self) -> (Option<Usage>, Option<u64>) {
        let total = self
            .kept
            .and_then(|u| u.total_tokens)
            .or(self.sent.and_then(|u| u.total_tokens));
        (self.sent.or(self.kept), total)
    }
}

/// Builds an [`Observed`] from an answer's frames.
#[derive(Debug, Default)]
pub struct Observer {
    seen: Observed,
    sse: bool,
    usage: UsageScan,
    /// Whether a usage event was kept already (only the first one counts).
    kept: bool,
    /// The completion tokens of a `usage` read since [`Observer::take_report`]
    /// last looked (`Some(None)`: a value without them, `null` say).
    report: Option<Option<u64>>,
}

impl Observer {
    /// `sse`: the answer is a server-sent event stream.
    pub fn new(sse: bool) -> Observer {
        Observer {
            sse,
            ..Observer::default()
        }
    }

    /// A frame handed on to the client; `usage_at`: where the first
    /// `"usage"` is in it (`None`: not in it).
    #[inline]
    pub fn frame(&mut self, data: &[u8], usage_at: Option<usize>) {
        // A frame of a stream under way (its first content went by), with
        // no `usage` in it or cut before it: only its end is looked at.
        if self.seen.first_content.is_some() && usage_at.is_none() && self.usage.is_idle(data) {
            if self.sse && ends_stream(data) {
                self.seen.done = true;
            }
            return;
        }
        self.frame_with_usage(data, usage_at);
    }

    fn frame_with_usage(&mut self, data: &[u8], usage_at: Option<usize>) {
        if !data.is_empty() {
            let seen = &mut self.seen;
            if seen.first_content.is_none() {
                let now = Instant::now();
                seen.first_byte.get_or_insert(now);
                if !self.sse || has_content(data) {
                    seen.first_content = Some(now);
                }
            }
            if self.sse && ends_stream(data) {
                seen.done = true;
            }
        }
        let read = self.usage.push(data, usage_at);
        self.seen.sent = self.usage.usage();
        if read {
            self.report = Some(self.seen.sent.and_then(|u| u.completion_tokens));
        }
    }

    /// The `usage` of the usage event kept from the client, as its parse
    /// read it (the first event only).
    pub fn kept(&mut self, usage: Option<Usage>) {
        if !std::mem::replace(&mut self.kept, true) {
            self.seen.kept = usage;
            self.report = Some(usage.and_then(|u| u.completion_tokens));
        }
    }

    /// The replica's output token count when a `usage` was read since the
    /// last call, in what the client was sent or in the kept event
    /// (`Some(None)`: one was read that holds no count).
    pub fn take_report(&mut self) -> Option<Option<u64>> {
        self.report.take()
    }

    /// The answer so far.
    pub fn observed(&self) -> &Observed {
        &self.seen
    }
}

/// Whether an SSE frame ends with the stream's closing `data: [DONE]`.
fn ends_stream(data: &[u8]) -> bool {
    data.trim_ascii_end().ends_with(b"data: [DONE]")
}

/// Whether an SSE frame carries generated text: a non-empty `content`,
/// `reasoning_content`, `reasoning` or `text` string, or a tool call's first
/// delta (its id and function name are generated output too).
///
/// Each key is looked for where it ends, at a colon: one `memchr` scan
/// of the frame, which stops at the first content (usually in the first
/// event), where a search of each key cost a pass per key. Every colon
/// is looked at: the `data:` of each event, a colon in a string, each
/// key's own.
pub fn has_content(frame: &[u8]) -> bool {
    memchr::memchr_iter(b':', frame).any(|colon| content_at(frame, colon))
}

/// Whether the colon at `colon` ends a content key (`content`, which
/// `reasoning_content` ends with too, `"text`, `"reasoning`) whose value
/// is a non-empty string, or `"tool_calls` followed by an array that
/// opens an object; one space may follow the colon.
fn content_at(frame: &[u8], colon: usize) -> bool {
    let Some(key) = frame[..colon].strip_suffix(b"\"") else {
        return false;
    };
    let after = &frame[colon + 1..];
    let value = after.strip_prefix(b" ").unwrap_or(after);
    if key.ends_with(b"content") || key.ends_with(b"\"text") || key.ends_with(b"\"reasoning") {
        return value.first() == Some(&b'"') && value.get(1).is_some_and(|&c| c != b'"');
    }
    key.ends_with(b"\"tool_calls") && value.starts_with(b"[{")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::{USAGE_KEY, find_usage};

    fn feed(sse: bool, frames: &[&str]) -> Observed {
        let mut o = Observer::new(sse);
        for f in frames {
            o.frame(f.as_bytes(), USAGE_KEY.find(f.as_bytes()));
        }
        *o.observed()
    }

    #[test]
    fn a_stream_shows_its_first_content_its_end_and_its_usage() {
        let role =
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
        let token = "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n";
        let usage = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}\n\n";
        let seen = feed(true, &[role]);
        assert!(seen.first_byte.is_some() && seen.first_content.is_none());
        let seen = feed(true, &[role, token, usage, "data: [DONE]\n\n"]);
        assert!(seen.first_content > seen.first_byte);
        assert!(seen.done);
        assert_eq!(seen.usage().1, Some(4));
        assert!(!feed(true, &[role, token]).done);
    }

    #[test]
    fn the_kept_event_settles_and_the_clients_copy_is_recorded() {
        let mut o = Observer::new(true);
        let sent = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1,\"total_tokens\":4}}\n\n";
        o.frame(sent.as_bytes(), USAGE_KEY.find(sent.as_bytes()));
        o.kept(find_usage(br#"data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}"#));
        o.kept(find_usage(
            br#"data: {"choices":[],"usage":{"total_tokens":99}}"#,
        ));
        let (usage, total) = o.observed().usage();
        assert_eq!(total, Some(5));
        assert_eq!(usage.and_then(|u| u.completion_tokens), Some(1));
        let mut only_kept = Observer::new(true);
        only_kept.kept(find_usage(
            br#"data: {"choices":[],"usage":{"completion_tokens":2}}"#,
        ));
        assert_eq!(
            only_kept
                .observed()
                .usage()
                .0
                .and_then(|u| u.completion_tokens),
            Some(2)
        );
    }

    /// Content as a search of the frame for each key finds it (how it
    /// was told before the colon scan).
    fn searched_content(frame: &[u8]) -> bool {
        let keys: [&[u8]; 6] = [
            b"content\":\"",
            b"\"text\":\"",
            b"content\": \"",
            b"\"text\": \"",
            b"\"reasoning\":\"",
            b"\"reasoning\": \"",
        ];
        let tool_calls: [&[u8]; 2] = [b"\"tool_calls\":[{", b"\"tool_calls\": [{"];
        keys.iter().any(|key| {
            memchr::memmem::find_iter(frame, key)
                .any(|i| frame.get(i + key.len()).is_some_and(|&c| c != b'"'))
        }) || tool_calls
            .iter()
            .any(|key| memchr::memmem::find(frame, key).is_some())
    }

    /// The colon scan finds content where a search for each key does: on
    /// every frame of up to three events below, and each of their cuts.
    #[test]
    fn content_found_at_colons_is_content_found_by_searching_each_key() {
        let events = [
            "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"content\": \"hi\"}}]}\n\n",
            "data: {\"choices\":[{\"text\":\"\"}]}\r\n\r\n",
            "data: {\"choices\":[{\"text\":\" w:\"}]}\n\n\n",
            "data: {\"choices\":[{\"delta\":{\"reasoning\":  \"x\",\"tool_calls\":[]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"tool_calls\": [{\"id\":\"c\"}]}}]}\n\n",
            "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"a\"}}]}\n\n",
            ": keep-alive\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3}}",
            "data: {\"choices\":[{\"text\":",
        ];
        for a in events {
            for b in events {
                for c in events {
                    let frame = format!("{a}{b}{c}");
                    for end in 0..=frame.len() {
                        let cut = &frame.as_bytes()[..end];
                        assert_eq!(
                            has_content(cut),
                            searched_content(cut),
                            "{:?}",
                            &frame[..end]
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn an_answer_that_is_not_a_stream_has_content_with_its_first_byte() {
        let seen = feed(false, &["{\"choices\":[]", "}"]);
        assert_eq!(seen.first_content, seen.first_byte);
        assert!(seen.first_byte.is_some() && !seen.done);
    }

    #[test]
    fn content_frames_are_told_from_role_and_usage_frames() {
        assert!(has_content(
            br#"data: {"choices":[{"delta":{"content":"Hi"}}]}"#
        ));
        assert!(has_content(br#"data: {"choices":[{"text":" w"}]}"#));
        // A reasoning model's first tokens are its first content.
        assert!(has_content(
            br#"data: {"choices":[{"delta":{"reasoning_content":"Let"}}]}"#
        ));
        assert!(has_content(
            br#"data: {"choices":[{"delta":{"reasoning": "Let"}}]}"#
        ));
        assert!(has_content(
            br#"data: {"choices":[{"delta":{"tool_calls":[{"id":"c1","type":"function","index":0,"function":{"name":"f","arguments":""}}]}}]}"#
        ));
        assert!(!has_content(
            br#"data: {"choices":[{"delta":{"tool_calls":[]}}]}"#
        ));
        assert!(!has_content(
            br#"data: {"choices":[{"delta":{"role":"assistant","content":""}}]}"#
        ));
        assert!(!has_content(
            br#"data: {"choices":[],"usage":{"prompt_tokens":1}}"#
        ));
    }
}

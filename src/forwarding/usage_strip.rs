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
//! parsed (`serde_json`), and that one parse also gives the removed
//! event's `usage` for accounting; the searches for it and for the blank
//! lines are `memchr`'s, and the events are not walked one by one: the
//! blank lines are looked for back from each hit and from the chunk's end
//! (a chunk that ends with its event's blank line, the usual case, costs
//! one look at its last bytes). Removing the event copies the rest of the
//! chunk once. At the end of the stream,
//! whatever is left passes as it is.

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

// The key every usage event carries.
use crate::net::{USAGE_KEY, Usage, usage_value, value_after_key};

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
    /// The removed usage event's `usage` (`Some(None)`: an event was
    /// removed, its `usage` is not an object that reads as one).
    pub usage: Option<Option<Usage>>,
    /// Where the first `"usage"` is in `pass` (`None`: not in it), known
    /// from the walk: the forwarding body does not search `pass` again.
    pub usage_in_pass: Option<usize>,
}

impl UsageStrip {
    /// `chunk`'s complete events, the usage event taken out. `usage_at` is
    /// where the caller found the first `"usage"` in `chunk` (`None`: not
    /// in it), so that the first search is not made twice.
    #[inline]
    pub fn filter(&mut self, chunk: Bytes, usage_at: Option<usize>) -> Filtered {
        // The usual chunk: nothing carried, no `"usage"`, and it ends with
        // its event's blank line. It passes whole.
        if self.carry.is_empty() && usage_at.is_none() && ends_an_event(&chunk) {
            return Filtered {
                pass: chunk,
                usage: None,
                usage_in_pass: None,
            };
        }
        self.filter_events(chunk, usage_at)
    }

    fn filter_events(&mut self, chunk: Bytes, usage_at: Option<usize>) -> Filtered {
        // Without a carried start, the events are the chunk's own bytes and
        // the caller's search holds for them.
        let searched = self.carry.is_empty();
        let buf = if searched {
            chunk
        } else {
            self.carry.extend_from_slice(&chunk);
            self.carry.split().freeze()
        };
        // The events that mention "usage" are looked at, each found from
        // the last blank line before its hit, and the unfinished event
        // begins after the last blank line. (A "usage" key holds no line
        // break, so a hit never spans two events.)
        let search = |from: usize| USAGE_KEY.find(&buf[from..]).map(|i| i + from);
        let mut hit = if searched { usage_at } else { search(0) };
        let first = hit;
        // Where an event ends: the events before it are looked at.
        let mut from = 0;
        let (mut usage, mut unfinished) = (None, None);
        while let Some(h) = hit {
            match event_around(&buf, from, h) {
                Ok((start, end)) if let Some(read) = usage_only(&buf[start..end], h - start) => {
                    usage = Some((start, end, read));
                    from = end;
                    break;
                }
                Ok((_, end)) => {
                    from = end;
                    hit = search(end);
                }
                Err(last) => {
                    unfinished = Some(last);
                    break;
                }
            }
        }
        let complete = unfinished.unwrap_or_else(|| last_event_end(&buf, from));
        if complete < buf.len() {
            self.carry.extend_from_slice(&buf[complete..]);
        }
        // A hit before `complete` ends before it: the blank line that ends
        // an event is not part of a key.
        let Some((start, end, read)) = usage else {
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
            usage: Some(read),
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
///
/// The events of a buffer are what a walk from its start finds, one
/// `event_end` after another; the functions below find the same ends
/// without walking every event (a `memchr` call each).
fn event_end(buf: &[u8]) -> Option<usize> {
    memchr::memchr_iter(b'\n', buf).find_map(|i| match buf.get(i + 1) {
        Some(b'\n') => Some(i + 2),
        Some(b'\r') if buf.get(i + 2) == Some(&b'\n') => Some(i + 3),
        _ => None,
    })
}

/// An event's end at or before `at`, at or after `from` (an event's end
/// itself): the last `\n\n` before `at`, when the byte before it is
/// neither `\n` nor `\r`, else `from`. Such a blank line ends an event:
/// a walk that reaches its first `\n` stops after its second, and no
/// step of the walk ends between the two (that takes a `\n` or a `\r`
/// before the first).
fn resume_point(buf: &[u8], from: usize, at: usize) -> usize {
    let last_blank = memchr::memrchr_iter(b'\n', &buf[from..at])
        .map(|i| from + i)
        .find(|&i| i > from && buf[i - 1] == b'\n');
    match last_blank {
        Some(i) if i - 1 == from || !matches!(buf[i - 2], b'\n' | b'\r') => i + 1,
        _ => from,
    }
}

/// The complete event holding byte `at`, found from `from` (an event's
/// end at or before `at`): `Err` with the last event's end when `at` is
/// in the unfinished rest.
fn event_around(buf: &[u8], from: usize, at: usize) -> Result<(usize, usize), usize> {
    let mut start = resume_point(buf, from, at);
    loop {
        match event_end(&buf[start..]) {
            Some(len) if start + len > at => return Ok((start, start + len)),
            Some(len) => start += len,
            None => return Err(start),
        }
    }
}

/// The end of the last complete event, found from `from` (an event's end):
/// no complete event holds the byte past the buffer's end.
fn last_event_end(buf: &[u8], from: usize) -> usize {
    if ends_an_event(&buf[from..]) {
        return buf.len();
    }
    event_around(buf, from, buf.len()).map_or_else(|end| end, |(_, end)| end)
}

/// Whether `buf` (from an event's end) ends where an event ends: the usual
/// chunk ends with its event's blank line after the event's last
/// character, which ends its last event without a look further back.
#[inline]
fn ends_an_event(buf: &[u8]) -> bool {
    match buf {
        [.., before, b'\n', b'\n'] => !matches!(before, b'\n' | b'\r'),
        _ => buf == b"\n\n",
    }
}

/// An event whose single `data:` line is a chunk with no choices and a usage
/// object, the one `include_usage` adds: its `usage` as [`usage_value`]
/// reads it, from the same parse (`None`: not such an event). The caller
/// has found the event's first `"usage"` at `at`.
///
/// Servers that follow OpenAI's API put `"usage":null` in every other
/// chunk of the stream; an event whose only `"usage"` is that is told
/// apart without parsing it (its top-level `usage`, if it has one, is
/// null, so it is not the usage event).
fn usage_only(event: &[u8], at: usize) -> Option<Option<Usage>> {
    let after_key = event.get(at + USAGE_KEY.needle().len()..);
    if after_key.is_some_and(null_and_alone) {
        return None;
    }
    #[derive(Deserialize)]
    struct Chunk<'a> {
        choices: Option<Vec<IgnoredAny>>,
        #[serde(borrow)]
        usage: Option<&'a RawValue>,
    }
    let json = event.trim_ascii().strip_prefix(b"data:")?;
    if memchr::memchr(b'\n', json).is_some() {
        return None;
    }
    let json = json.trim_ascii();
    // As text when it is UTF-8 (the parse then checks no string again),
    // else as bytes (only the strings it reads must be UTF-8).
    let chunk: Chunk = match std::str::from_utf8(json) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(json),
    }
    .ok()?;
    let usage = chunk
        .usage
        .filter(|_| chunk.choices.is_some_and(|v| v.is_empty()))?;
    Some(usage_value(usage.get().as_bytes()))
}

/// Whether `after` (an event's bytes after its first `"usage"`) starts
/// with the value `null` and holds no other `"usage"`.
fn null_and_alone(after: &[u8]) -> bool {
    value_after_key(after).is_some_and(|v| v.starts_with(b"null"))
        && USAGE_KEY.find(after).is_none()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str =
        "data: {\"choices\":[{\"delta\":{\"content\":\"a b\"}}],\"usage\":null}\n\n";
    const USAGE: &str = "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":4}}\n\n";
    const DONE: &str = "data: [DONE]\n\n";

    /// Where the first `"usage"` of `event` is.
    fn first(event: impl AsRef<[u8]>) -> usize {
        USAGE_KEY
            .find(event.as_ref())
            .expect("the event has a usage key")
    }

    /// What the filter says of a removed event: its usage, as
    /// `find_usage` reads it from the event.
    fn removed(event: &str) -> Option<Option<Usage>> {
        Some(crate::net::find_usage(event.as_bytes()))
    }

    fn run(chunks: &[&str]) -> (String, Option<Option<Usage>>) {
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
        (String::from_utf8(text).unwrap(), usage)
    }

    /// The ends every event by event walk finds, from the buffer's start.
    fn walked(buf: &[u8]) -> Vec<usize> {
        let mut ends = vec![0];
        while let Some(len) = event_end(&buf[*ends.last().unwrap()..]) {
            ends.push(ends.last().unwrap() + len);
        }
        ends
    }

    /// Found without walking every event, the events are the walk's: on
    /// every buffer of up to eight bytes from `\n`, `\r` and `x`, from
    /// every event's end, around every byte.
    #[test]
    fn events_found_from_a_blank_line_are_the_walks() {
        let mut buf = Vec::new();
        for len in 0..=8u32 {
            for n in 0..3usize.pow(len) {
                buf.clear();
                buf.extend((0..len).map(|i| b"\n\rx"[n / 3usize.pow(i) % 3]));
                let ends = walked(&buf);
                let last = *ends.last().unwrap();
                for &from in &ends {
                    assert_eq!(last_event_end(&buf, from), last, "{buf:?} from {from}");
                    for at in from..buf.len() {
                        let around = match ends.iter().position(|&e| e > at) {
                            Some(k) => Ok((ends[k - 1], ends[k])),
                            None => Err(last),
                        };
                        assert_eq!(event_around(&buf, from, at), around, "{buf:?} {from} {at}");
                    }
                }
            }
        }
    }

    /// One parse tells the usage event and reads its `usage`: the verdict
    /// of the check that ignored the value, and the usage `find_usage`
    /// reads from the event, on values and events of every kind.
    #[test]
    fn the_usage_event_and_its_usage_come_from_one_parse() {
        #[derive(Deserialize)]
        struct Ignored {
            choices: Option<Vec<IgnoredAny>>,
            usage: Option<IgnoredAny>,
        }
        let is_usage_only = |event: &str| {
            let json = event.trim().strip_prefix("data:")?;
            let c: Ignored = serde_json::from_str(json.trim()).ok()?;
            let only = !json.contains('\n') && c.choices.is_some_and(|v| v.is_empty());
            (only && c.usage.is_some()).then_some(())
        };
        let values = [
            r#"{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}"#,
            r#"{ "prompt_tokens" : 3 , "prompt_tokens_details" : {"cached_tokens": 2} }"#,
            r#"{"prompt_tokens_details":null,"completion_tokens":1}"#,
            r#"{"prompt_tokens":"3"}"#,
            r#"{"prompt_tokens":1.5}"#,
            r#"{"prompt_tokens":1,"prompt_tokens":2}"#,
            r#"{"x":{"y":[1,{}]},"total_tokens":9}"#,
            r#"{"prompt_\u0074okens":4}"#,
            "{}",
            "null",
            "5",
            r#""usage""#,
            "[1,2]",
        ];
        let events = [
            r#"data: {"id":"c","choices":[],"usage":V}"#,
            r#"data:{"usage":V , "choices":[]}"#,
            r#"data: {"choices":[{}],"usage":V}"#,
            r#"data: {"usage":V}"#,
            r#"data: {"choices":[],"usage":V,}"#,
            "data: {\"choices\":[],\n\"usage\":V}",
            r#"{"choices":[],"usage":V}"#,
            r#"data: {"x":{"usage":null},"choices":[],"usage":V}"#,
            r#"data: {"choices":[],"usage" : null,"y":{"usage":V}}"#,
            r#"data: {"choices":[],"usage"	:	V}"#,
        ];
        for value in values {
            for event in events {
                let event = format!("{}\n\n", event.replace('V', value));
                let expected =
                    is_usage_only(&event).map(|()| crate::net::find_usage(event.as_bytes()));
                assert_eq!(
                    usage_only(event.as_bytes(), first(&event)),
                    expected,
                    "{event}"
                );
            }
        }
    }

    /// An event that is not UTF-8 is read as bytes, as before: a byte that
    /// is not UTF-8 in a string the parse skips does not keep it from
    /// being the usage event.
    #[test]
    fn an_event_that_is_not_utf8_reads_as_bytes() {
        let event = b"data: {\"id\":\"\xff\",\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\n";
        let usage = Usage {
            prompt_tokens: Some(1),
            ..Usage::default()
        };
        assert_eq!(usage_only(event, first(event)), Some(Some(usage)));
        let not_choices = b"data: {\"choices\":[\xff],\"usage\":{}}\n\n";
        assert_eq!(usage_only(not_choices, first(not_choices)), None);
    }

    /// A key position the event does not reach leaves the verdict to the
    /// parse, without a panic.
    #[test]
    fn a_key_position_past_the_event_is_parsed() {
        let usage = Usage {
            prompt_tokens: Some(3),
            completion_tokens: Some(4),
            ..Usage::default()
        };
        assert_eq!(usage_only(USAGE.as_bytes(), USAGE.len()), Some(Some(usage)));
        assert_eq!(usage_only(TOKEN.as_bytes(), TOKEN.len() + 9), None);
    }

    #[test]
    fn removes_the_usage_event_only() {
        let (text, usage) = run(&[TOKEN, TOKEN, USAGE, DONE]);
        assert_eq!(text, format!("{TOKEN}{TOKEN}{DONE}"));
        assert_eq!(usage, removed(USAGE));
    }

    #[test]
    fn works_across_and_within_chunk_boundaries() {
        let all = format!("{TOKEN}{USAGE}{DONE}");
        for cut in [1, 10, TOKEN.len(), TOKEN.len() + 5, all.len() - 3] {
            let (a, b) = all.split_at(cut);
            let (text, usage) = run(&[a, b]);
            assert_eq!(text, format!("{TOKEN}{DONE}"), "cut at {cut}");
            assert_eq!(usage, removed(USAGE), "cut at {cut}");
        }
        let (text, usage) = run(&[&all]);
        assert_eq!((text, usage), (format!("{TOKEN}{DONE}"), removed(USAGE)));
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
                assert_eq!(usage, removed(USAGE), "cut at {a}");
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
        assert_eq!(usage, removed(USAGE));
        let (text, usage) = run(&[&format!("{USAGE}{DONE}")]);
        assert_eq!((text, usage), (DONE.to_string(), removed(USAGE)));
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

//! Reads the `usage` object a replica reports, in a JSON body or an SSE
//! event (vLLM sends it in the last event when asked with
//! `stream_options.include_usage`, and in every event with
//! `continuous_usage_stats`). The object is parsed once where it is found
//! ([`UsageScan`], fed each frame as it passes, so no copy of the body is
//! kept); the request's record, its settlement and the balancer's token
//! count all read that one parse.

use std::sync::LazyLock;

use memchr::memmem;
use serde::Deserialize;

/// The `"usage"` key, its searcher built once (building one costs more
/// than searching a short chunk with it).
pub static USAGE_KEY: LazyLock<memmem::Finder<'static>> =
    LazyLock::new(|| memmem::Finder::new(b"\"usage\""));

/// Token counts from the replica's `usage`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub completion_tokens: Option<u64>,
    #[serde(default)]
    pub total_tokens: Option<u64>,
    #[serde(default)]
    pub prompt_tokens_details: Option<Details>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Details {
    #[serde(default)]
    pub cached_tokens: Option<u64>,
}

/// What follows a `"usage"` key.
#[derive(Debug, PartialEq)]
enum Object {
    /// The object, or `None` when the value is not an object that parses
    /// (`null`, say).
    Read(Option<Usage>),
    /// An object not closed yet: its rest is in a later frame.
    Open,
}

/// The value after the `"usage"` key that `after` starts behind.
fn object_after(after: &[u8]) -> Object {
    if let Some((usage, _)) = flat_after(after) {
        return Object::Read(usage);
    }
    value_start(after).map_or_else(|value| value, counted)
}

/// The value after the key as the usual flat object, and the length of
/// `after` up to its `}`. It holds no brace but its own: it is read up to
/// the first `}` without counting braces first. Where that reads, counting
/// would have closed the object at the same `}`.
fn flat_after(after: &[u8]) -> Option<(Option<Usage>, usize)> {
    let object = value_start(after).ok()?;
    let close = memchr::memchr(b'}', object)?;
    let usage = flat_usage(&object[..=close])?;
    Some((usage, after.len() - object.len() + close + 1))
}

/// `after` from the `{` that opens the value, or what the value is when it
/// is not an object: only a separator so far (the value may start in the
/// next frame), or anything else.
fn value_start(after: &[u8]) -> Result<&[u8], Object> {
    let separator = |b: &[u8]| b.iter().all(|b| b.is_ascii_whitespace() || *b == b':');
    match after.iter().position(|&b| b == b'{') {
        None if separator(after) => Err(Object::Open),
        Some(open) if separator(&after[..open]) => Ok(&after[open..]),
        _ => Err(Object::Read(None)),
    }
}

/// The object `object` opens, closed where its braces balance.
fn counted(object: &[u8]) -> Object {
    let mut depth = 0usize;
    for (i, &b) in object.iter().enumerate() {
        match b {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    let json = &object[..=i];
                    let usage =
                        flat_usage(json).unwrap_or_else(|| serde_json::from_slice(json).ok());
                    return Object::Read(usage);
                }
            }
            _ => {}
        }
    }
    Object::Open
}

/// The usage object in the shape replicas send it, read without `serde`:
/// `{` ... `}` holding only the three counts (unsigned integers or `null`)
/// and `prompt_tokens_details` as `null`, each at most once, no escapes,
/// JSON whitespace anywhere between. That is about a tenth of the
/// instructions of a `serde_json` parse. `None` for anything else (the
/// caller parses it with `serde_json`, which decides); where it answers, the
/// answer is `serde_json`'s (a unit test holds the two together).
fn flat_usage(json: &[u8]) -> Option<Option<Usage>> {
    let mut usage = Usage::default();
    let mut seen = [false; 4];
    let mut rest = skip_space(json.strip_prefix(b"{")?);
    if rest == b"}" {
        return Some(Some(usage));
    }
    loop {
        let member = rest.strip_prefix(b"\"")?;
        let (slot, after) = usage_key(member)?;
        let (value, after) = count_or_null(value_after_key(after)?)?;
        let field = match slot {
            0 => &mut usage.prompt_tokens,
            1 => &mut usage.completion_tokens,
            2 => &mut usage.total_tokens,
            _ if value.is_none() => &mut None,
            _ => return None,
        };
        if std::mem::replace(&mut seen[slot], true) {
            return None;
        }
        *field = value;
        rest = skip_space(after);
        match rest {
            [b'}'] => return Some(Some(usage)),
            [b',', more @ ..] => rest = skip_space(more),
            _ => return None,
        }
    }
}

/// Which of the usage object's keys `member` starts with (its slot: the
/// three counts, then `prompt_tokens_details`), and what follows the key.
/// Each key is matched with its closing quote (no name holds a quote or a
/// backslash, so the key ends where it would end read up to its first
/// quote); its first byte picks the one to compare.
fn usage_key(member: &[u8]) -> Option<(usize, &[u8])> {
    match member.first()? {
        b'p' => match member.strip_prefix(b"prompt_tokens") {
            Some([b'"', after @ ..]) => Some((0, after)),
            Some(more) => Some((3, more.strip_prefix(b"_details\"")?)),
            None => None,
        },
        b'c' => Some((1, member.strip_prefix(b"completion_tokens\"")?)),
        b't' => Some((2, member.strip_prefix(b"total_tokens\"")?)),
        _ => None,
    }
}

/// An unsigned integer (no sign, fraction, exponent or leading zero, at
/// most 19 digits) or `null`, and what follows it.
fn count_or_null(bytes: &[u8]) -> Option<(Option<u64>, &[u8])> {
    if let Some(after) = bytes.strip_prefix(b"null") {
        return Some((None, after));
    }
    let digits = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 19 || (digits > 1 && bytes[0] == b'0') {
        return None;
    }
    let (number, after) = bytes.split_at(digits);
    if matches!(after.first(), Some(b'.' | b'e' | b'E')) {
        return None;
    }
    let value = number
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some((Some(value), after))
}

/// What follows a key's closing quote, from its value on: past JSON
/// whitespace, the `:` and JSON whitespace again (`None` without the `:`).
pub fn value_after_key(after: &[u8]) -> Option<&[u8]> {
    Some(skip_space(skip_space(after).strip_prefix(b":")?))
}

/// `bytes` after the JSON whitespace it starts with.
fn skip_space(bytes: &[u8]) -> &[u8] {
    let n = bytes
        .iter()
        .take_while(|b| matches!(b, b' ' | b'\t' | b'\n' | b'\r'))
        .count();
    &bytes[n..]
}

/// The last `"usage": {...}` object in `bytes`, when it parses.
pub fn find_usage(bytes: &[u8]) -> Option<Usage> {
    // The last match, found forwards: the forward searcher is the vectorised one.
    let at = USAGE_KEY.find_iter(bytes).last()?;
    usage_value(&bytes[at + USAGE_KEY.needle().len()..])
}

/// A `usage` key's value, as a parse of its event or body found it: the
/// object read as [`find_usage`] reads the one after a key (`None` when
/// the value is not an object that reads as a [`Usage`]).
pub fn usage_value(value: &[u8]) -> Option<Usage> {
    match object_after(value) {
        Object::Read(usage) => usage,
        Object::Open => None,
    }
}

/// How much of an unfinished `usage` object is kept for the next frame; a
/// longer one is given up (vLLM's is a few hundred bytes).
const OPEN_LIMIT: usize = 8 * 1024;

/// The `usage` of a body read frame by frame: the object after the last
/// `"usage"` key seen, as [`find_usage`] would read it from the whole body.
/// A frame is searched once and an object parsed once; bytes are copied only
/// when a frame ends inside a key or an object (kept until the next frame
/// completes it), never otherwise.
#[derive(Debug, Default)]
pub struct UsageScan {
    /// The object after the last key, once read.
    usage: Option<Usage>,
    /// The start of a key or object cut by the end of the last frame.
    open: Vec<u8>,
}

/// Whether `bytes` ends with a byte that a start of the key (all of it but
/// its last byte, `"usage`) ends with.
#[inline]
fn ends_in_key_start(bytes: &[u8]) -> bool {
    matches!(bytes.last(), Some(b'"' | b'u' | b's' | b'a' | b'g' | b'e'))
}

impl UsageScan {
    /// The next frame; `first`: where the first `"usage"` is in `frame`
    /// (`None`: not in it), when the caller has searched already. Whether a
    /// `usage` value (`null` too) was read in it: the replica reported
    /// again.
    #[inline]
    pub fn push(&mut self, frame: &[u8], first: Option<usize>) -> bool {
        (first.is_some() || !self.is_idle(frame)) && self.push_cut(frame, first)
    }

    /// Whether `frame`, holding no `"usage"`, leaves the scan as it is:
    /// no key was cut before it and it ends with a byte no start of the
    /// key ends with (`}`, a line break: the usual frame).
    #[inline]
    pub fn is_idle(&self, frame: &[u8]) -> bool {
        self.open.is_empty() && !ends_in_key_start(frame)
    }

    fn push_cut(&mut self, frame: &[u8], first: Option<usize>) -> bool {
        if !self.open.is_empty() {
            let mut joined = std::mem::take(&mut self.open);
            joined.extend_from_slice(frame);
            let first = USAGE_KEY.find(&joined);
            self.read(&joined, first)
        } else {
            self.read(frame, first)
        }
    }

    fn read(&mut self, bytes: &[u8], first: Option<usize>) -> bool {
        let key = USAGE_KEY.needle().len();
        let Some(mut at) = first else {
            self.keep_cut_key(bytes);
            return false;
        };
        // A flat object holds no key but its own counts: the next
        // `"usage"` is after its `}`, and the search for the last one goes
        // on from there (a JSON answer's object is followed by a brace).
        while let Some((usage, len)) = flat_after(&bytes[at + key..]) {
            let end = at + key + len;
            match USAGE_KEY.find(&bytes[end..]) {
                Some(next) => at = end + next,
                None => {
                    self.usage = usage;
                    self.keep_cut_key(bytes);
                    return true;
                }
            }
        }
        let last = at
            + USAGE_KEY
                .find_iter(&bytes[at + 1..])
                .last()
                .map_or(0, |i| i + 1);
        match object_after(&bytes[last + key..]) {
            Object::Read(usage) => {
                self.usage = usage;
                self.keep_cut_key(bytes);
                true
            }
            Object::Open if bytes.len() - last <= OPEN_LIMIT => {
                self.usage = None;
                self.open = bytes[last..].to_vec();
                false
            }
            Object::Open => {
                self.usage = None;
                false
            }
        }
    }

    /// Keeps the end of `bytes` when it is the start of a key (`"us`).
    fn keep_cut_key(&mut self, bytes: &[u8]) {
        let needle = USAGE_KEY.needle();
        // A frame usually ends with a byte no start of the key ends with
        // (`}`, a line break): one look instead of a comparison per length.
        if !ends_in_key_start(bytes) {
            return;
        }
        if let Some(n) = (1..needle.len())
            .rev()
            .find(|&n| bytes.ends_with(&needle[..n]))
        {
            self.open = bytes[bytes.len() - n..].to_vec();
        }
    }

    /// The `usage` read so far (an object still open counts as none).
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bytes_a_cut_key_may_end_with_are_those_of_its_starts() {
        let needle = USAGE_KEY.needle();
        for b in 0..=u8::MAX {
            let start = needle[..needle.len() - 1].contains(&b);
            assert_eq!(ends_in_key_start(&[b]), start, "{}", b as char);
        }
        assert!(!ends_in_key_start(b""));
    }

    /// Usage objects in the flat shape and around it: every key with
    /// every kind of value, spaced, doubled, misplaced commas.
    fn variants() -> Vec<String> {
        let keys = [
            "\"prompt_tokens\"",
            "\"completion_tokens\"",
            "\"total_tokens\"",
            "\"prompt_tokens_details\"",
            "\"other\"",
            "\"prompt_\\u0074okens\"",
        ];
        let values = [
            "16",
            "0",
            "null",
            "007",
            "1.5",
            "-3",
            "1e2",
            "18446744073709551615",
            "99999999999999999999",
            "{\"cached_tokens\":4}",
            "\"7\"",
            "true",
            "nul",
        ];
        let spaces = ["", " ", "\n\t", "\r "];
        let mut objects = vec!["{}".to_string(), "{ }".to_string(), "{,}".to_string()];
        let mut n = 0usize;
        for a in keys {
            for v in values {
                for b in keys.iter().take(4) {
                    let s = spaces[n % spaces.len()];
                    let w = values[n % 3];
                    n += 1;
                    objects.push(format!("{{{s}{a}{s}:{s}{v}{s}}}"));
                    objects.push(format!("{{{a}:{v},{s}{b}:{w}}}"));
                    objects.push(format!("{{{a}:{v},{b}:{w},}}"));
                    objects.push(format!("{{{a}:{v} {b}:{w}}}"));
                    objects.push(format!(
                        "{{\"prompt_tokens\":{w},{a}:{v},\"total_tokens\":{w}{s}}}"
                    ));
                }
            }
        }
        objects
    }

    #[test]
    fn the_flat_reading_is_serdes_wherever_it_answers() {
        let objects = variants();
        let mut answered = 0;
        for o in &objects {
            let serde = serde_json::from_slice::<Usage>(o.as_bytes()).ok();
            if let Some(flat) = flat_usage(o.as_bytes()) {
                assert_eq!(flat, serde, "{o}");
                answered += 1;
            }
        }
        // Most of the variants are ones it leaves to serde_json; enough are not.
        assert!(answered >= 50, "{answered} of {}", objects.len());
        let vllm = br#"{"prompt_tokens":16,"total_tokens":32,"completion_tokens":16,"prompt_tokens_details":null}"#;
        assert_eq!(
            flat_usage(vllm),
            Some(Some(Usage {
                prompt_tokens: Some(16),
                completion_tokens: Some(16),
                total_tokens: Some(32),
                prompt_tokens_details: None,
            }))
        );
    }

    /// What follows the key, found by counting braces from the first one
    /// (as [`object_after`] reads an object not in the flat shape).
    fn counted_after(after: &[u8]) -> Object {
        value_start(after).map_or_else(|value| value, counted)
    }

    /// Reading a flat object up to its first `}` finds what counting
    /// braces finds, whatever follows it or is nested in it, and whether
    /// it is cut short.
    #[test]
    fn the_flat_object_read_to_its_first_brace_is_the_counted_one() {
        let mut flat = 0;
        for o in variants() {
            for tail in [
                "",
                "}",
                ",\"x\":{\"y\":1}}",
                "{}",
                ",\"usage\":{\"prompt_tokens\":9}}",
            ] {
                for lead in [":", ": ", " :\n"] {
                    let after = format!("{lead}{o}{tail}");
                    for end in [after.len(), after.len() / 2, lead.len() + 1] {
                        let cut = &after.as_bytes()[..end];
                        assert_eq!(object_after(cut), counted_after(cut), "{}", &after[..end]);
                    }
                }
            }
            flat += usize::from(flat_usage(o.as_bytes()).is_some());
        }
        assert!(flat >= 50, "{flat}");
        for nested in [
            r#": {"prompt_tokens_details":{"cached_tokens":4},"prompt_tokens":1}"#,
            r#": {"prompt_tokens":1,"x":{"y":{}}}"#,
            r#": {"prompt_tokens":1,"x":"}"}"#,
        ] {
            assert_eq!(
                object_after(nested.as_bytes()),
                counted_after(nested.as_bytes())
            );
        }
    }

    #[test]
    fn reads_usage_from_sse_and_json() {
        let sse = br#"data: {"id":"x","choices":[],"usage":{"prompt_tokens":12,"completion_tokens":30,"total_tokens":42}}"#;
        let u = find_usage(sse).unwrap();
        assert_eq!((u.completion_tokens, u.total_tokens), (Some(30), Some(42)));
        let json = b"{\"usage\": {\"total_tokens\" : 7}}";
        assert_eq!(find_usage(json).unwrap().total_tokens, Some(7));
        assert_eq!(
            find_usage(b"data: {\"choices\":[{\"text\":\"total_tokens\"}]}"),
            None
        );
        assert_eq!(find_usage(b"data: {\"usage\":null}"), None);
    }

    #[test]
    fn finds_the_last_usage_object() {
        let tail = br#"data: {"usage":{"prompt_tokens":1}}

data: {"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":1}}}

data: [DONE]"#;
        let u = find_usage(tail).unwrap();
        assert_eq!((u.prompt_tokens, u.completion_tokens), (Some(2), Some(3)));
        assert_eq!(u.prompt_tokens_details.unwrap().cached_tokens, Some(1));
        assert_eq!(find_usage(br#"{"usage":null}"#), None);
        assert_eq!(find_usage(br#"{"usage":{"prompt_tokens":1"#), None);
    }

    /// The scan fed any cut of a body reads what `find_usage` reads from
    /// the whole of it.
    #[test]
    fn the_scan_reads_across_any_cut_what_the_whole_body_says() {
        let bodies: [&[u8]; 7] = [
            br#"{"id":"x","choices":[{"text":"a \"usage\" b"}],"usage":{"prompt_tokens":5,"total_tokens":9,"completion_tokens":4},"kv":null}"#,
            b"data: {\"usage\":{\"prompt_tokens\":1}}\n\ndata: {\"usage\":{\"prompt_tokens\":2}}\n\ndata: [DONE]\n\n",
            b"data: {\"usage\":{\"prompt_tokens\":1}}\n\ndata: {\"usage\":null}\n\n",
            br#"{"no":"usage here"}"#,
            br#"{"usage": {"prompt_tokens":7, "x":{"y":1}}}"#,
            br#"{"usage":{"total_tokens":1},"x":{"usage":{"total_tokens":2}},"usage":null}"#,
            br#"{"usage":{"total_tokens":1},"x":{"usage":{"total_tokens":2, "y":{}}}}"#,
        ];
        for body in bodies {
            let whole = find_usage(body);
            for a in 0..=body.len() {
                for b in a..=body.len() {
                    let mut scan = UsageScan::default();
                    for frame in [&body[..a], &body[a..b], &body[b..]] {
                        scan.push(frame, USAGE_KEY.find(frame));
                    }
                    assert_eq!(scan.usage(), whole, "cut at {a} and {b}");
                }
            }
        }
    }
}

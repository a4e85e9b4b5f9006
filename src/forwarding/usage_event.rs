//! Whether an SSE event is the one `stream_options.include_usage` adds: a
//! single `data:` line holding a chunk with no choices and a usage object
//! (`{"id": ..., "choices": [], "usage": {...}}`).
//!
//! The verdict is `serde_json`'s on `{choices: Option<Vec<_>>, usage:
//! Option<_>}`, values ignored. What vLLM writes (printable ASCII without a
//! backslash: objects, arrays, strings, integers, `true`, `false`, `null`)
//! is read here without serde, in one pass that checks the JSON as serde
//! would and reaches the same verdict (a unit test compares the two on
//! several thousand variants); anything else goes to `serde_json`.
//!
//! Cost: 1.9 k instructions for the 130-byte usage event of
//! `scripts/callgrind_overhead.sh`'s SSE answer (serde took 2.6 k).

use serde::Deserialize;
use serde::de::IgnoredAny;

/// `event` (one complete event, which holds the text `"usage"`): whether
/// it is the usage event.
pub(super) fn is_usage_only(event: &[u8]) -> bool {
    let text = event.trim_ascii();
    let Some(json) = text.strip_prefix(b"data:") else {
        return false;
    };
    // A plain document has no line break (`text` ends without white space).
    if let Some(verdict) = plain_verdict(json) {
        return verdict;
    }
    if memchr::memchr(b'\n', json).is_some() {
        return false;
    }
    serde_verdict(json.trim_ascii())
}

fn serde_verdict(json: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Chunk {
        choices: Option<Vec<IgnoredAny>>,
        usage: Option<IgnoredAny>,
    }
    serde_json::from_slice::<Chunk>(json)
        .is_ok_and(|c| c.choices.is_some_and(|v| v.is_empty()) && c.usage.is_some())
}

/// A value's kind, as far as the verdict needs it.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Null,
    EmptyArray,
    /// Anything else: a non-empty array, an object, a string, a number, a
    /// boolean.
    Other,
}

/// Nesting deeper than this goes to serde (its own limit is 128).
const MAX_DEPTH: u32 = 32;

/// [`serde_verdict`] of a plain document (see the module's docs), spaces
/// before it allowed; `None` for anything else, serde's to read. A
/// document that is not JSON within that form is never given a verdict
/// here.
fn plain_verdict(json: &[u8]) -> Option<bool> {
    let mut r = Reader { s: json, i: 0 };
    r.skip_space();
    if r.next()? != b'{' {
        return None;
    }
    let (mut choices, mut usage) = (None, None);
    let mut duplicate = false;
    r.skip_space();
    if r.peek() == Some(b'}') {
        r.i += 1;
    } else {
        loop {
            let key = r.key()?;
            let kind = r.value(1)?;
            let field = match key {
                b"choices" => Some(&mut choices),
                b"usage" => Some(&mut usage),
                _ => None,
            };
            if let Some(field) = field {
                duplicate |= field.replace(kind).is_some();
            }
            if r.after_member(b'}')? {
                break;
            }
        }
    }
    if r.i != json.len() {
        return None;
    }
    // serde refuses a field given twice and a `choices` that is no array.
    let valid = !duplicate && matches!(choices, None | Some(Kind::Null | Kind::EmptyArray));
    Some(valid && choices == Some(Kind::EmptyArray) && usage.is_some_and(|k| k != Kind::Null))
}

/// The bytes a plain string holds: printable ASCII but `"` and `\`.
static IN_STRING: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = b' ';
    while b <= b'~' {
        table[b as usize] = b != b'"' && b != b'\\';
        b += 1;
    }
    table
};

/// A cursor over a plain document. Only the bytes JSON's structure needs
/// are accepted outside strings, only printable ASCII without `\` in them:
/// a string ends at the next quote, and every byte is one character.
struct Reader<'a> {
    s: &'a [u8],
    i: usize,
}

impl<'a> Reader<'a> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.i += 1;
        Some(b)
    }

    /// JSON's white space in a plain document: spaces only (a tab or a
    /// line break goes to serde).
    fn skip_space(&mut self) {
        while self.peek() == Some(b' ') {
            self.i += 1;
        }
    }

    /// A string's content, the cursor on its opening quote.
    fn string(&mut self) -> Option<&'a [u8]> {
        let s = self.s;
        let start = self.i + 1;
        let mut end = start;
        while end < s.len() && IN_STRING[usize::from(s[end])] {
            end += 1;
        }
        if s.get(end) != Some(&b'"') {
            return None;
        }
        self.i = end + 1;
        Some(&s[start..end])
    }

    /// An object member's name and its colon, white space on both sides.
    fn key(&mut self) -> Option<&'a [u8]> {
        if self.peek() != Some(b'"') {
            return None;
        }
        let key = self.string()?;
        self.skip_space();
        if self.next()? != b':' {
            return None;
        }
        self.skip_space();
        Some(key)
    }

    /// After a member or an element: `true` at the `close` that ends its
    /// container, `false` at a comma (white space skipped on both sides).
    fn after_member(&mut self, close: u8) -> Option<bool> {
        self.skip_space();
        match self.next()? {
            b',' => {
                self.skip_space();
                Some(false)
            }
            b if b == close => Some(true),
            _ => None,
        }
    }

    /// One value at nesting `depth`, the cursor on its first byte.
    fn value(&mut self, depth: u32) -> Option<Kind> {
        if depth > MAX_DEPTH {
            return None;
        }
        match self.peek()? {
            b'"' => self.string().map(|_| Kind::Other),
            b'{' => {
                self.i += 1;
                self.skip_space();
                if self.peek() == Some(b'}') {
                    self.i += 1;
                    return Some(Kind::Other);
                }
                loop {
                    self.key()?;
                    self.value(depth + 1)?;
                    if self.after_member(b'}')? {
                        return Some(Kind::Other);
                    }
                }
            }
            b'[' => {
                self.i += 1;
                self.skip_space();
                if self.peek() == Some(b']') {
                    self.i += 1;
                    return Some(Kind::EmptyArray);
                }
                loop {
                    self.value(depth + 1)?;
                    if self.after_member(b']')? {
                        return Some(Kind::Other);
                    }
                }
            }
            b'n' => self.word(b"null").map(|_| Kind::Null),
            b't' => self.word(b"true").map(|_| Kind::Other),
            b'f' => self.word(b"false").map(|_| Kind::Other),
            _ => self.integer().map(|_| Kind::Other),
        }
    }

    fn word(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i + word.len();
        (self.s.get(self.i..end)? == word).then(|| self.i = end)
    }

    /// `-?(0|[1-9][0-9]*)`, not followed by a digit, a fraction or an
    /// exponent (those go to serde).
    fn integer(&mut self) -> Option<()> {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.next()? {
            b'0' => {}
            b'1'..=b'9' => {
                while self.peek().is_some_and(|b| b.is_ascii_digit()) {
                    self.i += 1;
                }
            }
            _ => return None,
        }
        match self.peek() {
            Some(b'0'..=b'9' | b'.' | b'e' | b'E') => None,
            _ => Some(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = r#"{"id":"cmpl-1","object":"chat.completion.chunk","created":1733,"model":"m","choices":[],"usage":{"prompt_tokens":16,"total_tokens":32,"completion_tokens":16,"prompt_tokens_details":null}}"#;

    #[test]
    fn the_usage_event_and_others() {
        let event = |json: &str| format!("data: {json}\n\n");
        assert!(is_usage_only(event(VLLM).as_bytes()));
        assert!(is_usage_only(
            b"data:{\"choices\": [ ], \"usage\" : {}}\r\n\r\n"
        ));
        for other in [
            r#"{"choices":[{"text":"a"}],"usage":{"total_tokens":1}}"#,
            r#"{"choices":[],"usage":null}"#,
            r#"{"usage":{"total_tokens":1}}"#,
            r#"{"choices":[],"choices":[],"usage":{}}"#,
            r#"{"choices":{},"usage":{}}"#,
            r#"{"choices":[],"usage":{}"#,
            r#"{"choices":[],"usage":{}} x"#,
        ] {
            assert!(!is_usage_only(event(other).as_bytes()), "{other}");
        }
        assert!(!is_usage_only(
            b"event: x\ndata: {\"choices\":[],\"usage\":{}}\n\n"
        ));
        assert!(!is_usage_only(b": {\"choices\":[],\"usage\":{}}\n\n"));
    }

    /// Wherever the plain reader gives a verdict, it is serde's: on the
    /// documents below and on every variant made by deleting, repeating or
    /// replacing one byte of them (with bytes that matter to JSON).
    #[test]
    fn its_verdict_is_serdes() {
        let docs = [
            VLLM,
            r#"{"choices":[],"usage":{"a":[1,-2,0,{"b":[]}],"c":true,"d":false,"e":"x y"}}"#,
            r#"{ "choices" : [ ] , "usage" : [ null ] , "x" : { } }"#,
            r#"{"choices":[0],"usage":-10}"#,
            r#"{"usage":{},"choices":[]}"#,
            r#"{"choices":null,"usage":1}"#,
            "{}",
        ];
        let bytes = b"{}[]\",: 0-19.eE+atrufsn\\\t";
        let mut checked = 0;
        let mut compare = |doc: &[u8]| {
            if let Some(verdict) = plain_verdict(doc) {
                assert_eq!(
                    verdict,
                    serde_verdict(doc),
                    "{}",
                    String::from_utf8_lossy(doc)
                );
                checked += 1;
            }
        };
        for doc in docs {
            let doc = doc.as_bytes();
            compare(doc);
            for at in 0..doc.len() {
                let mut v = doc.to_vec();
                v.remove(at);
                compare(&v);
                let mut v = doc.to_vec();
                v.insert(at, doc[at]);
                compare(&v);
                for &b in bytes {
                    let mut v = doc.to_vec();
                    v[at] = b;
                    compare(&v);
                    let mut v = doc.to_vec();
                    v.insert(at, b);
                    compare(&v);
                }
            }
        }
        assert!(checked > 3000, "{checked} variants checked");
    }

    #[test]
    fn deep_or_unusual_documents_go_to_serde() {
        let deep = format!(
            "{{\"choices\":[],\"usage\":{}{}}}",
            "[".repeat(40),
            "]".repeat(40)
        );
        assert_eq!(plain_verdict(deep.as_bytes()), None);
        assert!(is_usage_only(format!("data: {deep}\n\n").as_bytes()));
        for doc in [
            r#"{"choices":[],"usage":{"a":1.5}}"#,
            r#"{"choices":[],"us\u0061ge":{}}"#,
            "{\"choices\":[],\t\"usage\":{}}",
            r#"[[],{}]"#,
        ] {
            assert_eq!(plain_verdict(doc.as_bytes()), None, "{doc}");
        }
        assert!(is_usage_only(
            b"data: {\"choices\":[],\"usage\":{\"a\":1.5}}"
        ));
    }
}

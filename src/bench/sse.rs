//! Incremental parser for the server-sent events of an OpenAI streaming
//! answer: `data: {json}` events separated by a blank line, ending with
//! `data: [DONE]`.
//!
//! Bytes arrive in arbitrary pieces; the parser keeps the unfinished tail and
//! yields each complete event's data (several `data:` lines joined by `\n`;
//! comments and other fields ignored; `\n`, `\r\n` and `\r` line ends).
//! Each event is then read as a [`Chunk`]: whether it carries content, the
//! `usage` token counts, or an error.

use serde::Deserialize;

#[derive(Default)]
pub struct SseParser {
    buf: Vec<u8>,
    data: String,
    has_data: bool,
}

impl SseParser {
    /// Feeds bytes; calls `on_event` with each completed event's data.
    pub fn feed(&mut self, bytes: &[u8], mut on_event: impl FnMut(&str)) {
        self.buf.extend_from_slice(bytes);
        let mut start = 0;
        while let Some(pos) = self.buf[start..]
            .iter()
            .position(|&b| b == b'\n' || b == b'\r')
        {
            let end = start + pos;
            let mut next = end + 1;
            if self.buf[end] == b'\r' {
                match self.buf.get(next) {
                    Some(b'\n') => next += 1,
                    Some(_) => {}
                    // A lone `\r` at the end may be the first half of `\r\n`.
                    None => break,
                }
            }
            let line = String::from_utf8_lossy(&self.buf[start..end]).into_owned();
            self.line(&line, &mut on_event);
            start = next;
        }
        self.buf.drain(..start);
    }

    fn line(&mut self, line: &str, on_event: &mut impl FnMut(&str)) {
        if line.is_empty() {
            if self.has_data {
                on_event(&self.data);
            }
            self.data.clear();
            self.has_data = false;
            return;
        }
        if let Some(value) = line.strip_prefix("data:") {
            let value = value.strip_prefix(' ').unwrap_or(value);
            if self.has_data {
                self.data.push('\n');
            }
            self.data.push_str(value);
            self.has_data = true;
        }
    }
}

/// What one event tells the client.
#[derive(Debug, PartialEq, Eq)]
pub enum Chunk {
    Done,
    Data {
        /// A generated token: a completions choice's `text` (empty too: vLLM
        /// streams one chunk per step, with empty text while the tokens so
        /// far do not complete a character), or non-empty chat
        /// `delta.content`, `delta.reasoning_content` or `delta.reasoning`,
        /// or a tool call's delta (the first chat chunk carries only the
        /// role, with empty content).
        content: bool,
        completion_tokens: Option<u64>,
        /// `usage.prompt_tokens`: the prompt length in the server's tokenizer.
        prompt_tokens: Option<u64>,
    },
    Error(String),
}

#[derive(Deserialize)]
struct Wire {
    #[serde(default)]
    choices: Vec<WireChoice>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct WireChoice {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    delta: Option<WireDelta>,
}

#[derive(Deserialize)]
struct WireDelta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    /// A tool call's deltas are generated output too.
    #[serde(default)]
    tool_calls: Option<Vec<serde::de::IgnoredAny>>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens: Option<u64>,
}

/// Reads one event's data.
pub fn classify(data: &str) -> Chunk {
    let data = data.trim();
    if data == "[DONE]" {
        return Chunk::Done;
    }
    let wire: Wire = match serde_json::from_str(data) {
        Ok(w) => w,
        Err(e) => return Chunk::Error(format!("unreadable event: {e}")),
    };
    if let Some(err) = wire.error {
        let msg = err
            .get("message")
            .and_then(|m| m.as_str())
            .map_or_else(|| err.to_string(), str::to_owned);
        return Chunk::Error(msg);
    }
    let non_empty = |s: &Option<String>| s.as_deref().is_some_and(|s| !s.is_empty());
    let content = wire.choices.iter().any(|c| {
        c.text.is_some()
            || c.delta.as_ref().is_some_and(|d| {
                non_empty(&d.content)
                    || non_empty(&d.reasoning_content)
                    || non_empty(&d.reasoning)
                    || d.tool_calls.as_ref().is_some_and(|t| !t.is_empty())
            })
    });
    let usage = wire.usage.as_ref();
    Chunk::Data {
        content,
        completion_tokens: usage.and_then(|u| u.completion_tokens),
        prompt_tokens: usage.and_then(|u| u.prompt_tokens),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(pieces: &[&[u8]]) -> Vec<String> {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        for piece in pieces {
            p.feed(piece, |d| out.push(d.to_owned()));
        }
        out
    }

    #[test]
    fn events_split_anywhere_are_reassembled() {
        let whole = b"data: {\"a\":1}\n\n: comment\n\ndata: x\ndata: y\n\ndata: [DONE]\n\n";
        let expected = vec!["{\"a\":1}", "x\ny", "[DONE]"];
        assert_eq!(events(&[whole]), expected);
        for cut in 0..whole.len() {
            assert_eq!(
                events(&[&whole[..cut], &whole[cut..]]),
                expected,
                "cut {cut}"
            );
        }
        let bytes: Vec<&[u8]> = whole.chunks(1).collect();
        assert_eq!(events(&bytes), expected);
    }

    #[test]
    fn crlf_line_ends() {
        assert_eq!(
            events(&[b"data: a\r", b"\n\r\ndata:b\r\n\r\n"]),
            vec!["a", "b"]
        );
    }

    #[test]
    fn classifies_openai_chunks() {
        assert_eq!(classify("[DONE]"), Chunk::Done);
        let text = r#"{"choices":[{"index":0,"text":" hi","finish_reason":null}]}"#;
        assert_eq!(
            classify(text),
            Chunk::Data {
                content: true,
                completion_tokens: None,
                prompt_tokens: None,
            }
        );
        // A token whose text is held back (an incomplete character).
        let held = r#"{"choices":[{"index":0,"text":"","finish_reason":null}]}"#;
        assert_eq!(
            classify(held),
            Chunk::Data {
                content: true,
                completion_tokens: None,
                prompt_tokens: None,
            }
        );
        let role = r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#;
        assert_eq!(
            classify(role),
            Chunk::Data {
                content: false,
                completion_tokens: None,
                prompt_tokens: None,
            }
        );
        let usage =
            r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}"#;
        assert_eq!(
            classify(usage),
            Chunk::Data {
                content: false,
                completion_tokens: Some(7),
                prompt_tokens: Some(5),
            }
        );
        let err = r#"{"error":{"message":"boom","type":"server_error","param":null,"code":"x"}}"#;
        for generated in [
            r#"{"choices":[{"delta":{"reasoning":"Let"}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"c1","index":0,"function":{"name":"f","arguments":""}}]}}]}"#,
        ] {
            assert!(
                matches!(classify(generated), Chunk::Data { content: true, .. }),
                "{generated}"
            );
        }
        assert!(matches!(
            classify(r#"{"choices":[{"delta":{"tool_calls":[]}}]}"#),
            Chunk::Data { content: false, .. }
        ));
        assert_eq!(classify(err), Chunk::Error("boom".into()));
        assert!(matches!(classify("{not json"), Chunk::Error(_)));
    }
}

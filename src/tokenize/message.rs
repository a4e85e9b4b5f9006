//! A chat message as both the router and the simulator read it from an
//! OpenAI-style request: a role and either a string or a list of text parts.
//!
//! Only text parts count; image, audio and other parts add nothing (llmlb
//! does not model multimodal prompts). Other message fields (`name`,
//! `tool_calls`, ...) are not read.

use serde_json::Value;

/// One chat message's content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MessageContent {
    /// `"content": "..."` (a missing or null content is an empty string).
    Text(String),
    /// `"content": [{"type": "text", "text": "..."}, ...]`: the text parts.
    Parts(Vec<String>),
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    pub role: String,
    pub content: MessageContent,
}

impl ChatMessage {
    /// A message with string content.
    pub fn new(role: impl Into<String>, text: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: MessageContent::Text(text.into()),
        }
    }

    /// Reads a message's `content` JSON value. `None`: neither a string, a
    /// list, nor null.
    pub fn from_json(role: &str, content: Option<&Value>) -> Option<ChatMessage> {
        let content = match content {
            None | Some(Value::Null) => MessageContent::Text(String::new()),
            Some(Value::String(s)) => MessageContent::Text(s.clone()),
            Some(Value::Array(items)) => MessageContent::Parts(
                items
                    .iter()
                    .filter_map(|item| match item {
                        Value::String(s) => Some(s.clone()),
                        Value::Object(o) => o.get("text").and_then(Value::as_str).map(String::from),
                        _ => None,
                    })
                    .collect(),
            ),
            Some(_) => return None,
        };
        Some(ChatMessage {
            role: role.to_string(),
            content,
        })
    }

    /// The text parts, in order (one part for string content).
    pub fn parts(&self) -> &[String] {
        match &self.content {
            MessageContent::Text(t) => std::slice::from_ref(t),
            MessageContent::Parts(p) => p,
        }
    }

    /// The content's text, parts joined with `sep`.
    pub fn joined(&self, sep: &str) -> String {
        self.parts().join(sep)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_strings_parts_and_null() {
        let parts: Value = serde_json::json!([
            {"type": "text", "text": "a"},
            {"type": "image_url", "image_url": {"url": "x"}},
            {"type": "text", "text": "b"}
        ]);
        let m = ChatMessage::from_json("user", Some(&parts)).unwrap();
        assert_eq!(m.parts(), ["a", "b"]);
        assert_eq!(m.joined("\n"), "a\nb");
        let m = ChatMessage::from_json("user", Some(&Value::Null)).unwrap();
        assert_eq!(m, ChatMessage::new("user", ""));
        assert!(ChatMessage::from_json("user", Some(&serde_json::json!(3))).is_none());
    }
}

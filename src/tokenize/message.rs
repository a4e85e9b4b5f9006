//! A chat message as both the router and the simulator read it from an
//! OpenAI-style request: a role, either a string or a list of text parts,
//! and the other fields vLLM hands the chat template.
//!
//! Only text parts count as content; a request with image, audio, video or
//! file parts is marked unpredictable by the caller
//! ([`super::Unpredictable::Multimodal`]), since their placeholder tokens
//! depend on the model's processor. The other fields vLLM passes on are kept
//! in [`ChatMessage::fields`]: an assistant's `tool_calls` (their
//! `arguments` parsed from JSON text into an object, as vLLM does before
//! rendering), `reasoning` (also given as `reasoning_content`), a tool
//! result's `tool_call_id`, and `name`.

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
    /// The other fields the template sees, in the order vLLM sets them.
    pub fields: Vec<(String, Value)>,
}

impl ChatMessage {
    /// A message with string content.
    pub fn new(role: impl Into<String>, text: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: MessageContent::Text(text.into()),
            fields: Vec::new(),
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
            fields: Vec::new(),
        })
    }

    /// Adds the fields vLLM passes to the template from a message's JSON
    /// object `m` (see the module docs); others are ignored.
    pub fn with_fields_of(mut self, m: &serde_json::Map<String, Value>) -> ChatMessage {
        if self.role == "assistant" {
            if let Some(Value::Array(calls)) = m.get("tool_calls")
                && !calls.is_empty()
            {
                let calls = calls.iter().map(parse_arguments).collect();
                self.fields.push(("tool_calls".into(), Value::Array(calls)));
            }
            if let Some(r) = m.get("reasoning").filter(|r| !r.is_null()) {
                self.fields.push(("reasoning".into(), r.clone()));
                self.fields.push(("reasoning_content".into(), r.clone()));
            }
        }
        if self.role == "tool"
            && let Some(id) = m.get("tool_call_id")
        {
            self.fields.push(("tool_call_id".into(), id.clone()));
        }
        if let Some(name @ Value::String(_)) = m.get("name") {
            self.fields.push(("name".into(), name.clone()));
        }
        self
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

/// A tool call with its `function.arguments` JSON text parsed into a value
/// (left as text when it does not parse).
fn parse_arguments(call: &Value) -> Value {
    let mut call = call.clone();
    if let Some(f) = call.get_mut("function").and_then(Value::as_object_mut)
        && let Some(Value::String(text)) = f.get("arguments")
        && let Ok(parsed) = serde_json::from_str::<Value>(text)
    {
        f.insert("arguments".into(), parsed);
    }
    call
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

    #[test]
    fn keeps_the_fields_vllm_passes_on() {
        let m = serde_json::json!({
            "role": "assistant", "content": null, "reasoning": "hm", "other": 1,
            "tool_calls": [{"id": "c1", "type": "function",
                            "function": {"name": "f", "arguments": "{\"x\": 1}"}}]
        });
        let msg = ChatMessage::new("assistant", "").with_fields_of(m.as_object().unwrap());
        let names: Vec<&str> = msg.fields.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(names, ["tool_calls", "reasoning", "reasoning_content"]);
        assert_eq!(msg.fields[0].1[0]["function"]["arguments"]["x"], 1);
        let t = serde_json::json!({"role": "tool", "tool_call_id": "c1", "name": "f"});
        let msg = ChatMessage::new("tool", "42").with_fields_of(t.as_object().unwrap());
        assert_eq!(msg.fields.len(), 2);
        let empty = serde_json::json!({"tool_calls": []});
        let msg = ChatMessage::new("assistant", "").with_fields_of(empty.as_object().unwrap());
        assert!(msg.fields.is_empty(), "vLLM drops an empty tool_calls");
    }
}

//! What a chat request hands the chat template besides its messages, read
//! as vLLM reads it, and the reasons a prompt cannot be predicted exactly.
//!
//! vLLM's chat endpoint renders with:
//! - `tools`: each tool as its request model dumps it: `{"type":
//!   "function", "function": {"name", "description", "parameters"}}` with
//!   `description` and `parameters` present (null when the request left
//!   them out) and `strict` only when set; absent tools are `none`;
//! - `documents` as given (`none` when absent);
//! - `chat_template_kwargs`, overridden by the request's own
//!   `add_generation_prompt` (default true), `continue_final_message`
//!   (default false) and `reasoning_effort` (which also sets
//!   `enable_thinking` unless the kwargs do);
//! - encoding with `add_special_tokens` (default false for chat).

use serde_json::{Map, Value};

/// Why a request's cached prefix cannot be predicted exactly: it is routed
/// by load and counted (`llmlb_prefix_unpredictable_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Unpredictable {
    /// Image, audio, video or file content: the placeholder tokens depend
    /// on the model's processor.
    Multimodal,
    /// The request brings its own `chat_template`.
    RequestTemplate,
    /// `prompt_embeds`: cached by embedding, not by token.
    PromptEmbeds,
    /// Several completion prompts in one request.
    PromptBatch,
    /// A `/v1/responses` body (its items are not rendered by llmlb).
    ResponsesApi,
    /// A `/v1/messages` (Anthropic-style) body.
    MessagesApi,
    /// The chat template failed on the request (vLLM answers 400).
    TemplateError,
    /// The tokenizer failed on the rendered prompt.
    EncodeError,
}

impl Unpredictable {
    pub const ALL: [Unpredictable; 8] = [
        Unpredictable::Multimodal,
        Unpredictable::RequestTemplate,
        Unpredictable::PromptEmbeds,
        Unpredictable::PromptBatch,
        Unpredictable::ResponsesApi,
        Unpredictable::MessagesApi,
        Unpredictable::TemplateError,
        Unpredictable::EncodeError,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Unpredictable::Multimodal => "multimodal",
            Unpredictable::RequestTemplate => "request_template",
            Unpredictable::PromptEmbeds => "prompt_embeds",
            Unpredictable::PromptBatch => "prompt_batch",
            Unpredictable::ResponsesApi => "responses_api",
            Unpredictable::MessagesApi => "messages_api",
            Unpredictable::TemplateError => "template_error",
            Unpredictable::EncodeError => "encode_error",
        }
    }
}

/// The template inputs of a chat request other than its messages.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatOptions {
    /// The tool list as vLLM hands it to the template.
    pub tools: Option<Value>,
    pub documents: Option<Value>,
    /// Template variables: `chat_template_kwargs` with the request-level
    /// overrides applied.
    pub kwargs: Map<String, Value>,
    /// Whether the tokenizer adds its special tokens (BOS) when encoding.
    pub add_special_tokens: bool,
}

/// The request fields that feed [`ChatOptions::from_request`].
#[derive(Debug, Clone, Default)]
pub struct ChatFields {
    pub tools: Option<Value>,
    pub documents: Option<Value>,
    pub chat_template_kwargs: Option<Value>,
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: Option<bool>,
    pub reasoning_effort: Option<String>,
    pub add_special_tokens: Option<bool>,
}

impl ChatOptions {
    /// The options of a request's fields, merged as vLLM merges them.
    pub fn from_request(f: ChatFields) -> ChatOptions {
        let mut kwargs = match f.chat_template_kwargs {
            Some(Value::Object(m)) => m,
            _ => Map::new(),
        };
        if let Some(effort) = &f.reasoning_effort
            && !kwargs.contains_key("enable_thinking")
        {
            kwargs.insert("enable_thinking".into(), Value::Bool(effort != "none"));
        }
        kwargs.insert(
            "add_generation_prompt".into(),
            Value::Bool(f.add_generation_prompt.unwrap_or(true)),
        );
        kwargs.insert(
            "continue_final_message".into(),
            Value::Bool(f.continue_final_message.unwrap_or(false)),
        );
        if let Some(effort) = f.reasoning_effort {
            kwargs.insert("reasoning_effort".into(), Value::String(effort));
        }
        ChatOptions {
            tools: f.tools.filter(|t| !t.is_null()).map(dump_tools),
            documents: f.documents.filter(|d| !d.is_null()),
            kwargs,
            add_special_tokens: f.add_special_tokens.unwrap_or(false),
        }
    }

    /// vLLM's defaults: a generation prompt, nothing else.
    pub fn plain() -> ChatOptions {
        ChatOptions::from_request(ChatFields::default())
    }

    pub fn add_generation_prompt(&self) -> bool {
        self.kwargs
            .get("add_generation_prompt")
            .and_then(Value::as_bool)
            .unwrap_or(true)
    }

    pub fn continue_final_message(&self) -> bool {
        self.kwargs
            .get("continue_final_message")
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }

    /// Whether any template argument differs from a plain request's: kwargs
    /// beyond the defaults, documents, or special tokens added.
    pub fn has_template_args(&self) -> bool {
        let plain = ChatOptions::plain();
        self.kwargs != plain.kwargs || self.documents.is_some() || self.add_special_tokens
    }
}

/// The tool list as vLLM's request model dumps it (see the module docs).
fn dump_tools(tools: Value) -> Value {
    let Value::Array(list) = tools else {
        return tools;
    };
    Value::Array(list.into_iter().map(dump_tool).collect())
}

fn dump_tool(tool: Value) -> Value {
    let Value::Object(mut t) = tool else {
        return tool;
    };
    let mut out = Map::new();
    out.insert(
        "type".into(),
        t.remove("type").unwrap_or_else(|| "function".into()),
    );
    let function = match t.remove("function") {
        Some(Value::Object(mut f)) => {
            let mut g = Map::new();
            for key in ["name", "description", "parameters"] {
                g.insert(key.into(), f.remove(key).unwrap_or(Value::Null));
            }
            for key in ["strict", "defer_loading"] {
                if let Some(v) = f.remove(key).filter(|v| !v.is_null()) {
                    g.insert(key.into(), v);
                }
            }
            Value::Object(g)
        }
        other => other.unwrap_or(Value::Null),
    };
    out.insert("function".into(), function);
    if let Some(v) = t.remove("defer_loading").filter(|v| !v.is_null()) {
        out.insert("defer_loading".into(), v);
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn request_fields_override_kwargs_as_in_vllm() {
        let o = ChatOptions::from_request(ChatFields {
            chat_template_kwargs: Some(
                json!({"enable_thinking": true, "add_generation_prompt": false}),
            ),
            ..ChatFields::default()
        });
        assert!(o.add_generation_prompt(), "the request's default wins");
        assert!(o.has_template_args());
        assert!(!ChatOptions::plain().has_template_args());
        let o = ChatOptions::from_request(ChatFields {
            reasoning_effort: Some("none".into()),
            ..ChatFields::default()
        });
        assert_eq!(o.kwargs["enable_thinking"], false);
    }

    #[test]
    fn tools_are_dumped_with_nulls_in_model_order() {
        let o = ChatOptions::from_request(ChatFields {
            tools: Some(
                json!([{"function": {"parameters": {}, "name": "f", "strict": null}, "type": "function"}]),
            ),
            ..ChatFields::default()
        });
        let text = serde_json::to_string(&o.tools.unwrap()).unwrap();
        assert_eq!(
            text,
            r#"[{"type":"function","function":{"name":"f","description":null,"parameters":{}}}]"#
        );
    }
}

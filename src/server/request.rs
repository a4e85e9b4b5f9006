//! Reading the client's request: the body once, under a size limit, and the few
//! fields routing needs. The original bytes are kept and forwarded unchanged.

use http::HeaderMap;
use serde::Deserialize;

use super::ApiError;
use crate::tokenize::ChatMessage;

/// What routing and balancing need to know about an inference request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestMeta {
    pub model: String,
    pub stream: bool,
    /// `max_completion_tokens`, else `max_tokens`.
    pub max_tokens: Option<u32>,
    pub user: Option<String>,
    /// The prompt as plain text: chat messages rendered in order, or the
    /// completion prompt, or the embedding input.
    pub prompt_text: String,
    /// Chat messages, for tokenizing with the pool's chat template (`None`
    /// for completions and embeddings).
    pub messages: Option<Vec<ChatMessage>>,
}

impl RequestMeta {
    /// A cheap prompt-size estimate: about four bytes of text per token.
    pub fn estimated_prompt_tokens(&self) -> u32 {
        (self.prompt_text.len() / 4).min(u32::MAX as usize) as u32
    }
}

/// The declared `Content-Length`, when there is a valid one.
pub fn content_length(headers: &HeaderMap) -> Option<usize> {
    headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
}

#[derive(Deserialize)]
struct Wire {
    model: Option<serde_json::Value>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    messages: Option<Vec<WireMessage>>,
    #[serde(default)]
    prompt: Option<serde_json::Value>,
    #[serde(default)]
    input: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct WireMessage {
    #[serde(default)]
    role: String,
    #[serde(default)]
    content: Option<serde_json::Value>,
}

/// Extracts [`RequestMeta`] from an OpenAI-style JSON body.
pub fn extract(body: &[u8]) -> Result<RequestMeta, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::BadRequest(format!("request body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::BadRequest(
            "request body must be a JSON object".into(),
        ));
    }
    // Valid JSON with a field of the wrong type or value: name the field.
    let wire: Wire = serde_path_to_error::deserialize(value).map_err(|e| {
        let param = e.path().to_string();
        ApiError::InvalidParam {
            reason: e.into_inner().to_string(),
            param,
        }
    })?;
    let model = match wire.model {
        Some(serde_json::Value::String(s)) if !s.is_empty() => s,
        Some(_) => {
            return Err(ApiError::BadRequest(
                "`model` must be a non-empty string".into(),
            ));
        }
        None => {
            return Err(ApiError::BadRequest(
                "missing required field `model`".into(),
            ));
        }
    };
    let mut prompt_text = String::new();
    let mut chat = None;
    if let Some(messages) = &wire.messages {
        let mut list = Vec::with_capacity(messages.len());
        for m in messages {
            let mut text = String::new();
            if let Some(content) = &m.content {
                push_text(&mut text, content);
            }
            prompt_text.push_str(&m.role);
            prompt_text.push_str(": ");
            prompt_text.push_str(&text);
            prompt_text.push('\n');
            // Content of another shape counts as empty, as in `prompt_text`.
            list.push(
                ChatMessage::from_json(&m.role, m.content.as_ref())
                    .unwrap_or_else(|| ChatMessage::new(m.role.clone(), "")),
            );
        }
        chat = Some(list);
    } else if let Some(p) = wire.prompt.as_ref().or(wire.input.as_ref()) {
        push_text(&mut prompt_text, p);
    }
    let clamp = |v: u64| v.min(u64::from(u32::MAX)) as u32;
    Ok(RequestMeta {
        model,
        stream: wire.stream.unwrap_or(false),
        max_tokens: wire.max_completion_tokens.or(wire.max_tokens).map(clamp),
        user: wire.user,
        prompt_text,
        messages: chat,
    })
}

/// Appends the text of a string, an array of strings, or an array of content
/// parts (`{"type":"text","text":...}`); other values add nothing.
fn push_text(out: &mut String, v: &serde_json::Value) {
    match v {
        serde_json::Value::String(s) => out.push_str(s),
        serde_json::Value::Array(items) => {
            for item in items {
                match item {
                    serde_json::Value::Object(o) => {
                        if let Some(serde_json::Value::String(t)) = o.get("text") {
                            out.push_str(t);
                        }
                    }
                    other => push_text(out, other),
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_request() {
        let m = extract(
            br#"{"model":"m","stream":true,"max_tokens":7,"user":"u1",
                 "messages":[{"role":"system","content":"Be brief."},
                             {"role":"user","content":[{"type":"text","text":"Hi"}]}]}"#,
        )
        .unwrap();
        assert_eq!(m.model, "m");
        assert!(m.stream);
        assert_eq!(m.max_tokens, Some(7));
        assert_eq!(m.user.as_deref(), Some("u1"));
        assert_eq!(m.prompt_text, "system: Be brief.\nuser: Hi\n");
        let messages = m.messages.unwrap();
        assert_eq!(messages[0], ChatMessage::new("system", "Be brief."));
        assert_eq!(messages[1].parts(), ["Hi"]);
    }

    #[test]
    fn completion_prefers_max_completion_tokens() {
        let m =
            extract(br#"{"model":"m","prompt":"abc","max_tokens":5,"max_completion_tokens":9}"#)
                .unwrap();
        assert_eq!(m.max_tokens, Some(9));
        assert_eq!(m.prompt_text, "abc");
        assert!(!m.stream);
    }

    #[test]
    fn rejects_bad_json_and_missing_model() {
        assert!(matches!(extract(b"{nope"), Err(ApiError::BadRequest(_))));
        assert!(matches!(
            extract(br#"{"prompt":"x"}"#),
            Err(ApiError::BadRequest(_))
        ));
        assert!(matches!(
            extract(br#"{"model":3}"#),
            Err(ApiError::BadRequest(_))
        ));
        assert!(matches!(extract(b"[1,2]"), Err(ApiError::BadRequest(_))));
    }

    #[test]
    fn wrong_types_name_the_field() {
        let param = |body: &[u8]| match extract(body) {
            Err(ApiError::InvalidParam { param, reason }) => (param, reason),
            other => panic!("{other:?}"),
        };
        let (p, r) = param(br#"{"model":"m","prompt":"x","max_tokens":-1}"#);
        assert_eq!(p, "max_tokens");
        assert!(r.contains("-1"), "{r}");
        let (p, r) = param(br#"{"model":"m","prompt":"x","stream":"true"}"#);
        assert_eq!(p, "stream");
        assert!(r.contains("boolean"), "{r}");
        let (p, _) = param(br#"{"model":"m","messages":[{"role":"user"},{"role":3}]}"#);
        assert_eq!(p, "messages[1].role");
    }
}

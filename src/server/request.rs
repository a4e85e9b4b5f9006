//! Reading the client's request: the few fields routing needs, taken from
//! the body `net::read_body` read once. The original bytes are forwarded unchanged.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::ApiError;
use crate::forwarding::StreamOptions;
use crate::tokenize::{ChatFields, ChatMessage, ChatOptions, MessageContent, Unpredictable};

/// What routing and balancing need to know about an inference request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestMeta {
    pub model: String,
    pub stream: bool,
    /// What `stream_options` says about usage (for `stream_usage`).
    pub stream_options: StreamOptions,
    /// `max_completion_tokens`, else `max_tokens`.
    pub max_tokens: Option<u32>,
    pub user: Option<String>,
    /// The completion prompt or the embedding input as plain text (empty
    /// for chat requests, whose text is in `messages`).
    pub prompt_text: String,
    /// Bytes of prompt text: `prompt_text`'s, or for chat each message as
    /// `role: text\n`.
    pub prompt_bytes: usize,
    /// Chat messages, for tokenizing with the pool's chat template (`None`
    /// for completions and embeddings).
    pub messages: Option<Vec<ChatMessage>>,
    /// A chat request's template arguments (`tools`,
    /// `chat_template_kwargs`, `documents`, ...), read as vLLM reads them.
    pub chat: ChatOptions,
    /// A completion prompt given as token ids.
    pub prompt_ids: Option<Vec<u32>>,
    /// `cache_salt`: vLLM keys the prompt's first cached block with it.
    pub cache_salt: Option<String>,
    /// Why the prompt's cached prefix cannot be predicted, if it cannot.
    pub unpredictable: Option<Unpredictable>,
}

impl RequestMeta {
    /// A cheap prompt-size estimate: about four bytes of text per token.
    pub fn estimated_prompt_tokens(&self) -> u32 {
        if let Some(ids) = &self.prompt_ids {
            return ids.len().min(u32::MAX as usize) as u32;
        }
        (self.prompt_bytes / 4).min(u32::MAX as usize) as u32
    }

    /// Marks bodies of endpoints whose prompt llmlb does not render
    /// (`/v1/responses`, `/v1/messages`) as unpredictable.
    pub fn for_endpoint(mut self, path: &str) -> RequestMeta {
        let reason = match path {
            "/v1/responses" => Some(Unpredictable::ResponsesApi),
            "/v1/messages" => Some(Unpredictable::MessagesApi),
            _ => None,
        };
        if let Some(r) = reason {
            self.unpredictable = Some(r);
        }
        self
    }

    /// The request's kind in the closed-loop metrics, apart from adapters
    /// (which routing knows): `tools` when it carries tools, `template_args`
    /// when it carries other template arguments, else `plain`.
    pub fn kind(&self) -> &'static str {
        if self.messages.is_some() && self.chat.tools.is_some() {
            "tools"
        } else if self.messages.is_some() && self.chat.has_template_args() {
            "template_args"
        } else {
            "plain"
        }
    }
}

/// The fields read from the body, borrowed from it where they are only
/// looked at; everything else in the body is skipped without building it.
#[derive(Deserialize)]
struct Wire<'a> {
    /// Kept as a value to tell a wrong type (400) from a missing field.
    model: Option<serde_json::Value>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: StreamOptions,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    user: Option<String>,
    #[serde(default, borrow)]
    messages: Option<Vec<WireMessage<'a>>>,
    #[serde(default)]
    prompt: Option<serde_json::Value>,
    #[serde(default)]
    input: Option<Text>,
    #[serde(default)]
    tools: Option<serde_json::Value>,
    #[serde(default)]
    documents: Option<serde_json::Value>,
    #[serde(default)]
    chat_template_kwargs: Option<serde_json::Value>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(default)]
    continue_final_message: Option<bool>,
    #[serde(default)]
    reasoning_effort: Option<String>,
    #[serde(default)]
    add_special_tokens: Option<bool>,
    #[serde(default)]
    cache_salt: Option<String>,
    #[serde(default)]
    chat_template: Option<IgnoredAny>,
    #[serde(default)]
    prompt_embeds: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct WireMessage<'a> {
    #[serde(default, borrow)]
    role: Cow<'a, str>,
    #[serde(default)]
    content: Option<Content>,
    /// The other fields vLLM passes to the template (see
    /// [`ChatMessage::with_fields_of`]).
    #[serde(default)]
    tool_calls: Option<serde_json::Value>,
    #[serde(default)]
    tool_call_id: Option<serde_json::Value>,
    #[serde(default)]
    name: Option<serde_json::Value>,
    #[serde(default)]
    reasoning: Option<serde_json::Value>,
}

/// A message's `content`: a string, a list of parts (strings or
/// `{"type":"text","text":...}`; other parts add nothing, and media parts
/// are noted), or null; any other shape is `Other` and counts as empty.
enum Content {
    Text(String),
    Parts(Vec<String>, bool),
    Other,
}

/// Visitor methods for the JSON scalars a visitor does not read: each
/// yields `$value`.
macro_rules! skip_scalars {
    ($ty:ty, $value:expr) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<$ty, E> {
            Ok($value)
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<$ty, E> {
            Ok($value)
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<$ty, E> {
            Ok($value)
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<$ty, E> {
            Ok($value)
        }
        fn visit_unit<E: de::Error>(self) -> Result<$ty, E> {
            Ok($value)
        }
    };
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Content;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("message content")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Content, E> {
                Ok(Content::Text(v.to_owned()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content, A::Error> {
                let mut parts = Vec::new();
                let mut media = false;
                while let Some(part) = seq.next_element::<Part>()? {
                    parts.extend(part.text);
                    media |= part.media;
                }
                Ok(Content::Parts(parts, media))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Content, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Content::Other)
            }
            // A null content is an empty string.
            fn visit_unit<E: de::Error>(self) -> Result<Content, E> {
                Ok(Content::Text(String::new()))
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Content, E> {
                Ok(Content::Other)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Content, E> {
                Ok(Content::Other)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Content, E> {
                Ok(Content::Other)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Content, E> {
                Ok(Content::Other)
            }
        }
        d.deserialize_any(V)
    }
}

/// A string, or `None` for any other value (skipped without building it).
struct MaybeStr(Option<String>);

impl<'de> Deserialize<'de> for MaybeStr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = MaybeStr;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any value")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<MaybeStr, E> {
                Ok(MaybeStr(Some(v.to_owned())))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<MaybeStr, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(MaybeStr(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<MaybeStr, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(MaybeStr(None))
            }
            skip_scalars!(MaybeStr, MaybeStr(None));
        }
        d.deserialize_any(V)
    }
}

/// The `"text"` string of an object, skipping its other keys.
fn text_of<'de, A: MapAccess<'de>>(map: A) -> Result<Option<String>, A::Error> {
    Ok(part_of(map)?.text)
}

/// An object's `"text"` string and whether its `"type"` names media.
fn part_of<'de, A: MapAccess<'de>>(mut map: A) -> Result<Part, A::Error> {
    let mut part = Part {
        text: None,
        media: false,
    };
    while let Some(key) = map.next_key::<Cow<'de, str>>()? {
        if key == "text" && part.text.is_none() {
            part.text = map.next_value::<MaybeStr>()?.0;
        } else if key == "type" {
            let kind = map.next_value::<MaybeStr>()?.0;
            part.media = kind.is_some_and(|k| is_media(&k));
        } else {
            map.next_value::<IgnoredAny>()?;
        }
    }
    Ok(part)
}

/// Content part types whose tokens depend on the model's processor.
fn is_media(kind: &str) -> bool {
    kind.starts_with("image")
        || kind.starts_with("audio")
        || kind.starts_with("video")
        || kind.starts_with("input_audio")
        || kind.starts_with("input_image")
        || kind == "file"
        || kind.ends_with("_embeds")
}

/// One part of list content: its text, if it has any, and whether it is
/// an image, audio, video or file.
struct Part {
    text: Option<String>,
    media: bool,
}

impl<'de> Deserialize<'de> for Part {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Part;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a content part")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Part, E> {
                Ok(Part {
                    text: Some(v.to_owned()),
                    media: false,
                })
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Part, A::Error> {
                part_of(map)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Part, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Part {
                    text: None,
                    media: false,
                })
            }
            skip_scalars!(
                Part,
                Part {
                    text: None,
                    media: false
                }
            );
        }
        d.deserialize_any(V)
    }
}

/// A `prompt` or `input`: the text of a string, of an array of strings, or
/// of an array of content parts, concatenated; token-id arrays and other
/// values add nothing.
struct Text(String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut out = String::new();
        d.deserialize_any(TextSeed(&mut out))?;
        Ok(Text(out))
    }
}

/// Appends the text of one value to a buffer, without building the value.
struct TextSeed<'s>(&'s mut String);

impl<'de> de::DeserializeSeed<'de> for TextSeed<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TextSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("prompt text")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.0.push_str(v);
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(TextSeed(self.0))?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        if let Some(text) = text_of(map)? {
            self.0.push_str(&text);
        }
        Ok(())
    }
    skip_scalars!((), ());
}

fn not_json(e: serde_json::Error) -> ApiError {
    ApiError::BadRequest(format!("request body is not valid JSON: {e}"))
}

/// The error for valid JSON with a field of the wrong type or value: the
/// field is named by a second, path-tracking parse (broken JSON further on
/// is reported as such).
fn name_bad_field(body: &[u8], first: serde_json::Error) -> ApiError {
    if let Err(e) = serde_json::from_slice::<IgnoredAny>(body) {
        return not_json(e);
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    match serde_path_to_error::deserialize::<_, Wire>(&mut de) {
        Err(e) => ApiError::InvalidParam {
            param: e.path().to_string(),
            reason: e.into_inner().to_string(),
        },
        Ok(_) => ApiError::InvalidParam {
            param: ".".into(),
            reason: first.to_string(),
        },
    }
}

/// Extracts [`RequestMeta`] from an OpenAI-style JSON body, in one pass
/// over the bytes: only the fields llmlb reads are built, and a chat
/// request's text is copied once, into its messages.
pub fn extract(body: &[u8]) -> Result<RequestMeta, ApiError> {
    let wire = parse(body)?;
    let model = model_of(wire.model)?;
    let mut prompt_text = String::new();
    let mut prompt_bytes = 0;
    let mut chat = None;
    let mut prompt_ids = None;
    let mut unpredictable = None;
    if wire.chat_template.is_some() {
        unpredictable = Some(Unpredictable::RequestTemplate);
    }
    if wire.prompt_embeds.is_some() {
        unpredictable = Some(Unpredictable::PromptEmbeds);
    }
    let has_messages = wire.messages.is_some();
    if let Some(messages) = wire.messages {
        let list: Vec<ChatMessage> = messages
            .into_iter()
            .map(|m| chat_message(m, &mut unpredictable))
            .collect();
        // As if rendered "role: text\n".
        prompt_bytes = list
            .iter()
            .map(|m| m.role.len() + 3 + m.parts().iter().map(String::len).sum::<usize>())
            .sum();
        chat = Some(list);
    } else if let Some(p) = wire.prompt {
        let prompt = CompletionPrompt::of(p);
        if prompt.batch {
            unpredictable.get_or_insert(Unpredictable::PromptBatch);
        }
        prompt_text = prompt.text;
        prompt_bytes = prompt_text.len();
        prompt_ids = prompt.ids;
    } else if let Some(Text(p)) = wire.input {
        prompt_text = p;
        prompt_bytes = prompt_text.len();
    }
    let chat_options = if has_messages {
        ChatOptions::from_request(ChatFields {
            tools: wire.tools,
            documents: wire.documents,
            chat_template_kwargs: wire.chat_template_kwargs,
            add_generation_prompt: wire.add_generation_prompt,
            continue_final_message: wire.continue_final_message,
            reasoning_effort: wire.reasoning_effort,
            add_special_tokens: wire.add_special_tokens,
        })
    } else {
        ChatOptions::default()
    };
    let clamp = |v: u64| v.min(u64::from(u32::MAX)) as u32;
    Ok(RequestMeta {
        model,
        stream: wire.stream.unwrap_or(false),
        stream_options: wire.stream_options,
        max_tokens: wire.max_completion_tokens.or(wire.max_tokens).map(clamp),
        user: wire.user,
        prompt_text,
        prompt_bytes,
        messages: chat,
        chat: chat_options,
        prompt_ids,
        cache_salt: wire.cache_salt,
        unpredictable,
    })
}

/// The body's fields llmlb reads, borrowed where they can be; an error
/// names the field of the wrong type, or says the body is not a JSON object.
fn parse(body: &[u8]) -> Result<Wire<'_>, ApiError> {
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        // Report broken JSON as such; valid JSON that is not an object here.
        serde_json::from_slice::<IgnoredAny>(body).map_err(not_json)?;
        return Err(ApiError::BadRequest(
            "request body must be a JSON object".into(),
        ));
    }
    // Read as text when the body is UTF-8, the usual case: the parse then
    // checks no string's encoding again (a check per string cost more than
    // one over the body). Otherwise as bytes, as before: only the strings
    // it reads must be UTF-8, and its error says where one is not.
    match std::str::from_utf8(body) {
        Ok(text) => read_wire(serde_json::Deserializer::from_str(text), body),
        Err(_) => read_wire(serde_json::Deserializer::from_slice(body), body),
    }
}

/// [`parse`]'s read of the object, from text or bytes.
fn read_wire<'a, R: serde_json::de::Read<'a>>(
    mut de: serde_json::Deserializer<R>,
    body: &[u8],
) -> Result<Wire<'a>, ApiError> {
    // The path to a bad field is tracked only when there is one: tracking it
    // on every request costs an allocation per key.
    let wire = match Wire::deserialize(&mut de) {
        Ok(wire) => wire,
        Err(e) if e.is_data() => return Err(name_bad_field(body, e)),
        Err(e) => return Err(not_json(e)),
    };
    de.end().map_err(not_json)?;
    Ok(wire)
}

/// The request's `model`: a non-empty string, required.
fn model_of(model: Option<serde_json::Value>) -> Result<String, ApiError> {
    match model {
        Some(serde_json::Value::String(s)) if !s.is_empty() => Ok(s),
        Some(_) => Err(ApiError::BadRequest(
            "`model` must be a non-empty string".into(),
        )),
        None => Err(ApiError::BadRequest(
            "missing required field `model`".into(),
        )),
    }
}

/// One chat message as the template renders it: its text or parts (media
/// parts make the prompt `multimodal`, unpredictable) and the fields a
/// template may read besides (tool calls, name, reasoning).
fn chat_message(m: WireMessage<'_>, unpredictable: &mut Option<Unpredictable>) -> ChatMessage {
    let content = match m.content {
        Some(Content::Text(t)) => MessageContent::Text(t),
        Some(Content::Parts(p, media)) => {
            if media {
                unpredictable.get_or_insert(Unpredictable::Multimodal);
            }
            MessageContent::Parts(p)
        }
        // Content of another shape counts as empty.
        None | Some(Content::Other) => MessageContent::Text(String::new()),
    };
    let message = ChatMessage {
        role: m.role.into_owned(),
        content,
        fields: Vec::new(),
    };
    if m.tool_calls.is_none()
        && m.tool_call_id.is_none()
        && m.name.is_none()
        && m.reasoning.is_none()
    {
        return message;
    }
    let mut o = serde_json::Map::new();
    for (k, v) in [
        ("tool_calls", m.tool_calls),
        ("tool_call_id", m.tool_call_id),
        ("name", m.name),
        ("reasoning", m.reasoning),
    ] {
        if let Some(v) = v {
            o.insert(k.into(), v);
        }
    }
    message.with_fields_of(&o)
}

/// A completion's `prompt`: text (a string, or the concatenated strings
/// and text parts of a list), token ids (a list of integers), and whether
/// it holds several prompts (vLLM serves each separately).
struct CompletionPrompt {
    text: String,
    ids: Option<Vec<u32>>,
    batch: bool,
}

impl CompletionPrompt {
    fn of(v: serde_json::Value) -> CompletionPrompt {
        use serde_json::Value;
        let as_ids = |items: &[Value]| -> Option<Vec<u32>> {
            items
                .iter()
                .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                .collect()
        };
        let mut out = CompletionPrompt {
            text: String::new(),
            ids: None,
            batch: false,
        };
        match v {
            Value::String(s) => out.text = s,
            Value::Array(items) => {
                if !items.is_empty() && items.iter().all(Value::is_number) {
                    out.ids = as_ids(&items);
                    return out;
                }
                out.batch = items.len() > 1;
                for item in &items {
                    match item {
                        Value::String(s) => out.text.push_str(s),
                        Value::Object(o) => {
                            if let Some(t) = o.get("text").and_then(Value::as_str) {
                                out.text.push_str(t);
                            }
                        }
                        Value::Array(inner) if items.len() == 1 => out.ids = as_ids(inner),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
        out
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
        assert_eq!(m.prompt_text, "");
        assert_eq!(m.prompt_bytes, "system: Be brief.\nuser: Hi\n".len());
        let messages = m.messages.unwrap();
        assert_eq!(messages[0], ChatMessage::new("system", "Be brief."));
        assert_eq!(messages[1].parts(), ["Hi"]);
    }

    #[test]
    fn stream_options_are_read_for_the_usage_request() {
        let options = |body: &str| extract(body.as_bytes()).unwrap().stream_options;
        assert_eq!(
            options(r#"{"model":"m","stream":true}"#),
            StreamOptions::Absent
        );
        assert_eq!(
            options(r#"{"model":"m","stream_options":{"include_usage":true}}"#),
            StreamOptions::IncludesUsage
        );
        for other in [
            r#"{"model":"m","stream_options":null}"#,
            r#"{"model":"m","stream_options":{"include_usage":"true"}}"#,
            r#"{"model":"m","stream_options":{"include_usage":true,"include_usage":false}}"#,
            r#"{"model":"m","stream_options":{"continuous_usage_stats":true}}"#,
            r#"{"model":"m","stream_options":[1]}"#,
        ] {
            assert_eq!(options(other), StreamOptions::Other, "{other}");
        }
    }

    /// A body that is not UTF-8 is read as bytes, as before: a byte that is
    /// not UTF-8 in a string llmlb skips is no error, in one it reads the
    /// error says where.
    #[test]
    fn a_body_that_is_not_utf8_reads_as_bytes() {
        let m = extract(b"{\"model\":\"m\",\"prompt\":\"a\",\"x\":\"\xff\"}").unwrap();
        assert_eq!((m.model.as_str(), m.prompt_text.as_str()), ("m", "a"));
        let Err(ApiError::BadRequest(error)) = extract(b"{\"model\":\"m\",\"prompt\":\"\xff\"}")
        else {
            panic!("a prompt that is not UTF-8 is refused");
        };
        assert!(error.contains("column"), "{error}");
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
    fn content_shapes_and_prompt_forms_read_as_before() {
        let m = extract(
            br#"{"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":{}}}],
                 "messages":[{"role":"user","content":null},
                             {"role":"user","content":{"odd":"shape"}},
                             {"role":"user","content":[
                                 "plain",
                                 {"type":"image_url","image_url":{"url":"x"}},
                                 {"type":"text","text":3},
                                 {"type":"text","text":"part"}]},
                             {"role":"tool","content":7}]}"#,
        )
        .unwrap();
        let messages = m.messages.unwrap();
        assert_eq!(messages[0], ChatMessage::new("user", ""));
        assert_eq!(messages[1], ChatMessage::new("user", ""));
        assert_eq!(messages[2].parts(), ["plain", "part"]);
        assert_eq!(messages[3], ChatMessage::new("tool", ""));
        let text = |body: &[u8]| extract(body).unwrap().prompt_text;
        assert_eq!(text(br#"{"model":"m","prompt":["a","b"]}"#), "ab");
        assert_eq!(text(br#"{"model":"m","prompt":[1,2,3]}"#), "");
        assert_eq!(text(br#"{"model":"m","prompt":null,"input":"emb"}"#), "emb");
        assert_eq!(
            text(br#"{"model":"m","input":[{"type":"text","text":"t"},{"type":"image"}]}"#),
            "t"
        );
        assert!(matches!(
            extract(br#"{"model":"m"} trailing"#),
            Err(ApiError::BadRequest(_))
        ));
        assert!(matches!(
            extract(br#"{"model":"m","stream":"yes""#),
            Err(ApiError::BadRequest(_))
        ));
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

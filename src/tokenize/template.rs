//! A model's chat template rendered as Hugging Face transformers renders it
//! (`apply_chat_template`) and with the messages vLLM hands it.
//!
//! Engine: `minijinja`, set up like transformers' jinja2 environment:
//! `trim_blocks`, `lstrip_blocks`, loop controls (`break`/`continue`),
//! `raise_exception(msg)`, `strftime_now(fmt)`, a `tojson` that writes JSON
//! the way Python's `json.dumps` does, and Python string and dict methods
//! (`.strip()`, `.startswith()`, `.items()`, ...) from minijinja-contrib.
//! The context holds the special tokens of `tokenizer_config.json`, the
//! request's template arguments ([`ChatOptions`]: `chat_template_kwargs`
//! and the request-level overrides, which may replace a special token, as
//! in transformers), `messages`, `tools` and `documents` (`none` when the
//! request has none) and `add_generation_prompt`. `continue_final_message`
//! renders the final message with a marker and cuts the text where the
//! message ends, as transformers does. Messages carry the fields vLLM
//! passes on (`tool_calls`, `tool_call_id`, `name`, `reasoning`); tool
//! results are always string content; `developer` messages become `system`
//! ones when the template does not name the role.
//!
//! Content format, as vLLM decides it: a template that loops over a
//! message's content gets every content as a list of `{"type": "text",
//! "text": ...}` parts (vLLM's "openai" format); any other template gets a
//! string, text parts joined with a newline (vLLM's "string" format). vLLM
//! decides from the template's syntax tree; llmlb looks for a `for` over an
//! expression naming `content` in the source, which agrees on the templates
//! models ship.
//!
//! Cost: one template evaluation per render, linear in the messages' size.

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Serde, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde_json::json;

use super::chat::ChatOptions;
use super::clock::strftime_now;
use super::message::ChatMessage;

const NAME: &str = "chat";

/// The special tokens a template may print.
#[derive(Debug, Clone, Default)]
pub struct SpecialTokens {
    pub bos: Option<String>,
    pub eos: Option<String>,
    pub unk: Option<String>,
    pub pad: Option<String>,
}

/// A parsed chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    parts_as_list: bool,
    /// Whether the template names the `developer` role (else vLLM renders
    /// developer messages as system messages).
    developer_role: bool,
    specials: SpecialTokens,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("parts_as_list", &self.parts_as_list)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Parses `source`. Err: the template's syntax error.
    pub fn parse(source: &str, specials: SpecialTokens) -> Result<ChatTemplate, Error> {
        let mut env = Environment::new();
        env.set_syntax(
            SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
            Err(Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.to_string())?;
        Ok(ChatTemplate {
            env,
            parts_as_list: loops_over_content(source),
            developer_role: source.contains("\"developer\"") || source.contains("'developer'"),
            specials,
        })
    }

    /// Renders `messages` with `options` as transformers' `apply_chat_template`
    /// does behind vLLM (see the module docs). Err: the template raised (for
    /// example on roles out of order) or failed to evaluate, or
    /// `continue_final_message` could not be honoured.
    pub fn render(&self, messages: &[ChatMessage], options: &ChatOptions) -> Result<String, Error> {
        let cont = options.continue_final_message();
        if cont && options.add_generation_prompt() {
            return Err(invalid(
                "continue_final_message and add_generation_prompt are not compatible",
            ));
        }
        let mut messages: Vec<serde_json::Value> =
            messages.iter().map(|m| self.message_json(m)).collect();
        if !self.developer_role {
            messages = developer_as_system(messages);
        }
        let mut final_text = None;
        if cont {
            final_text = Some(tag_final_message(&mut messages)?);
        }
        let s = &self.specials;
        // Later entries win: the kwargs may replace a special token, as in
        // transformers.
        let mut ctx: std::collections::BTreeMap<String, Value> = std::collections::BTreeMap::new();
        for (name, t) in [
            ("bos_token", &s.bos),
            ("eos_token", &s.eos),
            ("unk_token", &s.unk),
            ("pad_token", &s.pad),
        ] {
            ctx.insert(name.into(), token(t));
        }
        for (k, v) in &options.kwargs {
            if k != "continue_final_message" {
                ctx.insert(k.clone(), Value::from(Serde(v)));
            }
        }
        let none = || Value::from(());
        ctx.insert("messages".into(), Value::from(Serde(&messages)));
        let tools = options
            .tools
            .as_ref()
            .map_or_else(none, |t| Value::from(Serde(t)));
        ctx.insert("tools".into(), tools);
        let docs = options
            .documents
            .as_ref()
            .map_or_else(none, |d| Value::from(Serde(d)));
        ctx.insert("documents".into(), docs);
        ctx.insert(
            "add_generation_prompt".into(),
            Value::from(options.add_generation_prompt()),
        );
        let rendered = self.env.get_template(NAME)?.render(Value::from(ctx))?;
        match final_text {
            None => Ok(rendered),
            Some(text) => cut_at_tag(rendered, &text),
        }
    }

    /// One message as vLLM hands it to the template.
    fn message_json(&self, m: &ChatMessage) -> serde_json::Value {
        // Tool results are always a string (vLLM joins their text parts).
        let content = if self.parts_as_list && m.role != "tool" {
            let parts: Vec<serde_json::Value> = m
                .parts()
                .iter()
                .map(|t| json!({"type": "text", "text": t}))
                .collect();
            serde_json::Value::Array(parts)
        } else {
            serde_json::Value::String(m.joined("\n"))
        };
        let mut o = serde_json::Map::new();
        o.insert("role".into(), m.role.clone().into());
        o.insert("content".into(), content);
        for (k, v) in &m.fields {
            o.insert(k.clone(), v.clone());
        }
        serde_json::Value::Object(o)
    }
}

/// The marker transformers appends to the final message to find where it
/// ends in the rendered text (`continue_final_message`).
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

fn invalid(msg: &str) -> Error {
    Error::new(ErrorKind::InvalidOperation, msg.to_string())
}

/// Appends [`CONTINUE_TAG`] to the final message's text (its last text
/// part for list content); the text it had.
fn tag_final_message(messages: &mut [serde_json::Value]) -> Result<String, Error> {
    let last = messages
        .last_mut()
        .ok_or_else(|| invalid("continue_final_message needs a final message"))?;
    match last.get_mut("content") {
        Some(serde_json::Value::String(s)) => {
            let text = s.clone();
            s.push_str(CONTINUE_TAG);
            Ok(text)
        }
        Some(serde_json::Value::Array(parts)) => {
            for part in parts.iter_mut().rev() {
                if let Some(serde_json::Value::String(t)) = part.get_mut("text") {
                    let text = t.clone();
                    t.push_str(CONTINUE_TAG);
                    return Ok(text);
                }
            }
            Err(invalid("continue_final_message: no text to continue"))
        }
        _ => Err(invalid(
            "continue_final_message: the final message has no content",
        )),
    }
}

/// The rendered text cut where the final message ends, as transformers cuts it.
fn cut_at_tag(rendered: String, final_text: &str) -> Result<String, Error> {
    let tag = CONTINUE_TAG.trim();
    if !rendered.contains(final_text.trim()) || !rendered.contains(tag) {
        return Err(invalid(
            "continue_final_message: the final message does not appear in the rendered chat",
        ));
    }
    let at = rendered.rfind(tag).expect("checked above");
    if rendered[at..].starts_with(CONTINUE_TAG) {
        Ok(rendered[..at].to_string())
    } else {
        Ok(rendered[..at].trim_end().to_string())
    }
}

/// vLLM's handling of `developer` messages for a template that does not name
/// the role: each becomes a `system` message, and when that leaves a system
/// message anywhere but first, all system messages merge into one at the
/// start (their texts joined by a blank line).
fn developer_as_system(messages: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    if !messages.iter().any(|m| m["role"] == "developer") {
        return messages;
    }
    let mut converted: Vec<serde_json::Value> = messages
        .into_iter()
        .map(|mut m| {
            if m["role"] == "developer" {
                m["role"] = "system".into();
                if let Some(o) = m.as_object_mut() {
                    o.shift_remove("tools");
                }
            }
            m
        })
        .collect();
    let systems: Vec<usize> = (0..converted.len())
        .filter(|&i| converted[i]["role"] == "system")
        .collect();
    if !systems.iter().enumerate().any(|(n, &i)| i > 0 || n > 0) {
        return converted;
    }
    let mut texts = Vec::new();
    let mut rest = Vec::new();
    for m in converted.drain(..) {
        if m["role"] != "system" {
            rest.push(m);
            continue;
        }
        let text = match &m["content"] {
            serde_json::Value::String(s) => s.clone(),
            serde_json::Value::Array(parts) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(|t| t.as_str()).or(p.as_str()))
                .collect::<Vec<_>>()
                .join("\n"),
            _ => String::new(),
        };
        if !text.is_empty() {
            texts.push(text);
        }
    }
    let mut out = vec![json!({"role": "system", "content": texts.join("\n\n")})];
    out.extend(rest);
    out
}

/// A special token, undefined (printing nothing) when the config has none.
fn token(t: &Option<String>) -> Value {
    t.as_deref().map(Value::from).unwrap_or(Value::UNDEFINED)
}

/// Whether the template iterates over a message's content (vLLM's test for
/// the "openai" content format).
fn loops_over_content(source: &str) -> bool {
    source.split("{%").skip(1).any(|block| {
        let stmt = block.split("%}").next().unwrap_or("");
        let stmt = stmt.trim_start_matches(['-', '+']).trim_start();
        stmt.strip_prefix("for ")
            .and_then(|rest| rest.split_once(" in "))
            .is_some_and(|(_, iter)| iter.contains("content"))
    })
}

/// `tojson` as transformers defines it: `json.dumps(x, ensure_ascii=False,
/// indent=indent)`, so `", "` and `": "` separators without an indent.
fn tojson(value: Value, indent: Option<usize>) -> Result<Value, Error> {
    let v = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    write_json(&mut out, &v, indent, 0);
    Ok(Value::from_safe_string(out))
}

fn write_json(out: &mut String, v: &serde_json::Value, indent: Option<usize>, depth: usize) {
    let (items, open, close): (Vec<(Option<&String>, &serde_json::Value)>, char, char) = match v {
        serde_json::Value::Array(a) => (a.iter().map(|x| (None, x)).collect(), '[', ']'),
        serde_json::Value::Object(o) => (o.iter().map(|(k, x)| (Some(k), x)).collect(), '{', '}'),
        scalar => {
            out.push_str(&scalar.to_string());
            return;
        }
    };
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return;
    }
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    for (i, (key, item)) in items.into_iter().enumerate() {
        if i > 0 {
            out.push_str(if indent.is_some() { "," } else { ", " });
        }
        newline(out, depth + 1);
        if let Some(k) = key {
            out.push_str(&serde_json::Value::String(k.clone()).to_string());
            out.push_str(": ");
        }
        write_json(out, item, indent, depth + 1);
    }
    newline(out, depth);
    out.push(close);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn specials() -> SpecialTokens {
        SpecialTokens {
            bos: Some("<s>".into()),
            eos: Some("</s>".into()),
            ..SpecialTokens::default()
        }
    }

    #[test]
    fn content_format_follows_the_template() {
        let string = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}";
        let list = "{% for m in messages %}{% for p in m['content'] %}{{ p.text }}|{% endfor %}{% endfor %}";
        let msgs = [ChatMessage::from_json(
            "user",
            Some(&json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])),
        )
        .unwrap()];
        let t = ChatTemplate::parse(string, specials()).unwrap();
        assert_eq!(
            t.render(&msgs, &ChatOptions::plain()).unwrap(),
            "[user]a\nb"
        );
        let t = ChatTemplate::parse(list, specials()).unwrap();
        assert_eq!(t.render(&msgs, &ChatOptions::plain()).unwrap(), "a|b|");
        let t = ChatTemplate::parse(list, specials()).unwrap();
        assert_eq!(
            t.render(&[ChatMessage::new("user", "s")], &ChatOptions::plain())
                .unwrap(),
            "s|"
        );
    }

    #[test]
    fn hf_template_features() {
        let src = "{{ bos_token }}{% for m in messages %}\n  {% if m.role == 'system' %}{% continue %}{% endif %}\n{{ m.content.strip() | upper }}{{ {'a': [1, 'x']} | tojson }}\n{% endfor %}{% if messages | length > 2 %}{{ raise_exception('too many') }}{% endif %}{{ eos_token }}{{ strftime_now('%Y') | length }}";
        let t = ChatTemplate::parse(src, specials()).unwrap();
        let out = t
            .render(
                &[
                    ChatMessage::new("system", "x"),
                    ChatMessage::new("user", " hi "),
                ],
                &ChatOptions::plain(),
            )
            .unwrap();
        assert_eq!(out, "<s>HI{\"a\": [1, \"x\"]}\n</s>4");
        let err = t
            .render(
                &[
                    ChatMessage::new("user", "a"),
                    ChatMessage::new("user", "b"),
                    ChatMessage::new("user", "c"),
                ],
                &ChatOptions::plain(),
            )
            .unwrap_err();
        assert!(err.to_string().contains("too many"), "{err}");
        assert!(ChatTemplate::parse("{% for %}", specials()).is_err());
    }
}

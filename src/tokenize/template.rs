//! A model's chat template rendered as Hugging Face transformers renders it
//! (`apply_chat_template`) and with the messages vLLM hands it.
//!
//! Engine: `minijinja`, set up like transformers' jinja2 environment:
//! `trim_blocks`, `lstrip_blocks`, loop controls (`break`/`continue`),
//! `raise_exception(msg)`, `strftime_now(fmt)`, a `tojson` that writes JSON
//! the way Python's `json.dumps` does, and Python string and dict methods
//! (`.strip()`, `.startswith()`, `.items()`, ...) from minijinja-contrib.
//! The context holds `messages`, `add_generation_prompt = true` and the
//! special tokens of `tokenizer_config.json`.
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
use minijinja::{Environment, Error, ErrorKind, context};
use serde_json::json;

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
            specials,
        })
    }

    /// Renders `messages` with the generation prompt. Err: the template
    /// raised (for example on roles out of order) or failed to evaluate.
    pub fn render(&self, messages: &[ChatMessage]) -> Result<String, Error> {
        let messages: Vec<serde_json::Value> = messages
            .iter()
            .map(|m| {
                let content = if self.parts_as_list {
                    let parts: Vec<serde_json::Value> = m
                        .parts()
                        .iter()
                        .map(|t| json!({"type": "text", "text": t}))
                        .collect();
                    serde_json::Value::Array(parts)
                } else {
                    serde_json::Value::String(m.joined("\n"))
                };
                json!({"role": m.role, "content": content})
            })
            .collect();
        let s = &self.specials;
        self.env.get_template(NAME)?.render(context! {
            messages => Value::from(Serde(&messages)),
            add_generation_prompt => true,
            bos_token => token(&s.bos),
            eos_token => token(&s.eos),
            unk_token => token(&s.unk),
            pad_token => token(&s.pad),
        })
    }
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
        assert_eq!(t.render(&msgs).unwrap(), "[user]a\nb");
        let t = ChatTemplate::parse(list, specials()).unwrap();
        assert_eq!(t.render(&msgs).unwrap(), "a|b|");
        let t = ChatTemplate::parse(list, specials()).unwrap();
        assert_eq!(t.render(&[ChatMessage::new("user", "s")]).unwrap(), "s|");
    }

    #[test]
    fn hf_template_features() {
        let src = "{{ bos_token }}{% for m in messages %}\n  {% if m.role == 'system' %}{% continue %}{% endif %}\n{{ m.content.strip() | upper }}{{ {'a': [1, 'x']} | tojson }}\n{% endfor %}{% if messages | length > 2 %}{{ raise_exception('too many') }}{% endif %}{{ eos_token }}{{ strftime_now('%Y') | length }}";
        let t = ChatTemplate::parse(src, specials()).unwrap();
        let out = t
            .render(&[
                ChatMessage::new("system", "x"),
                ChatMessage::new("user", " hi "),
            ])
            .unwrap();
        assert_eq!(out, "<s>HI{\"a\": [1, \"x\"]}\n</s>4");
        let err = t
            .render(&[
                ChatMessage::new("user", "a"),
                ChatMessage::new("user", "b"),
                ChatMessage::new("user", "c"),
            ])
            .unwrap_err();
        assert!(err.to_string().contains("too many"), "{err}");
        assert!(ChatTemplate::parse("{% for %}", specials()).is_err());
    }
}

//! The model tokenizer against the Python `tokenizers` package and jinja2:
//! `tests/fixtures/tokenizer_tiny_llama.json` was written by
//! `scripts/tokenizer_fixture.py` from `../shared/tokenizers/tiny-llama`.

use std::path::Path;

use llmlb::tokenize::{ChatMessage, PromptTokenizer};
use serde_json::Value;

pub const TINY_LLAMA: &str = "../shared/tokenizers/tiny-llama";

fn fixture() -> Value {
    let text = std::fs::read_to_string("tests/fixtures/tokenizer_tiny_llama.json").unwrap();
    serde_json::from_str(&text).unwrap()
}

fn messages(v: &Value) -> Vec<ChatMessage> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| ChatMessage::from_json(m["role"].as_str().unwrap(), m.get("content")).unwrap())
        .collect()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

/// The fixture's cases of one kind (`texts`, `chats`); at least five.
fn cases(kind: &str) -> Vec<Value> {
    let cases = fixture()[kind].as_array().unwrap().clone();
    assert!(cases.len() >= 5, "{kind}: {} cases", cases.len());
    cases
}

fn tokenizer() -> PromptTokenizer {
    PromptTokenizer::load(Path::new(TINY_LLAMA)).unwrap()
}

#[test]
fn completion_texts_encode_as_python_does() {
    let t = tokenizer();
    for case in cases("texts") {
        let text = case["text"].as_str().unwrap();
        let got = t.encode_text(text).unwrap();
        assert_eq!(got, ids(&case["ids"]), "{text:?}");
        assert_eq!(got.len() as u64, case["count"].as_u64().unwrap());
    }
}

#[test]
fn chat_requests_render_and_encode_as_python_does() {
    let t = tokenizer();
    for case in cases("chats") {
        let name = case["name"].as_str().unwrap();
        let msgs = messages(&case["messages"]);
        assert_eq!(
            t.render_chat(&msgs).unwrap(),
            case["rendered"].as_str().unwrap(),
            "{name}"
        );
        let got = t.encode_chat(&msgs).unwrap();
        assert_eq!(got, ids(&case["ids"]), "{name}");
        assert_eq!(got.len() as u64, case["count"].as_u64().unwrap(), "{name}");
    }
}

#[test]
fn chat_prompts_carry_one_bos_and_completions_get_it_added() {
    let t = tokenizer();
    let chat = t.encode_chat(&[ChatMessage::new("user", "hi")]).unwrap();
    assert_eq!(chat.iter().filter(|&&id| id == 0).count(), 1, "{chat:?}");
    assert_eq!(chat[0], 0);
    assert_eq!(t.encode_text("hi").unwrap()[0], 0);
}

#[test]
fn loads_are_shared_while_files_are_unchanged() {
    let (a, b) = (tokenizer(), tokenizer());
    assert!(a.same_as(&b));
    assert!(!a.same_as(&PromptTokenizer::StandIn));
}

#[test]
fn bad_directories_name_the_file_and_the_reason() {
    let dir = std::env::temp_dir().join(format!("llmlb-tok-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let err = PromptTokenizer::load(&dir.join("absent")).unwrap_err();
    assert!(err.to_string().contains("not a directory"), "{err}");
    let err = PromptTokenizer::load(&dir).unwrap_err();
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
    std::fs::write(dir.join("tokenizer.json"), "{\"nope\": 1}").unwrap();
    let err = PromptTokenizer::load(&dir).unwrap_err();
    assert!(
        err.to_string().contains("tokenizer.json: not a tokenizer"),
        "{err}"
    );
    let real = Path::new(TINY_LLAMA);
    std::fs::copy(real.join("tokenizer.json"), dir.join("tokenizer.json")).unwrap();
    let err = PromptTokenizer::load(&dir).unwrap_err();
    assert!(err.to_string().contains("no chat template"), "{err}");
    std::fs::write(dir.join("chat_template.jinja"), "{% for m in messages %}").unwrap();
    let err = PromptTokenizer::load(&dir).unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("chat_template.jinja: the chat template does not parse"),
        "{msg}"
    );
    std::fs::remove_file(dir.join("chat_template.jinja")).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        r#"{"bos_token": {"content": "<s>"}, "chat_template": "{{ bos_token }}{{ messages[0].content }}"}"#,
    )
    .unwrap();
    let t = PromptTokenizer::load(&dir).unwrap();
    assert_eq!(
        t.render_chat(&[ChatMessage::new("user", "x")]).unwrap(),
        "<s>x"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

//! Chat rendering and prompt tokenization against vLLM's own:
//! `tests/fixtures/render_tiny_tools.json` holds the token ids vLLM's render
//! server computed for each request (`scripts/render_fixture.py`, with the
//! tiny model's tokenizer and the template `tiny_tools_template.jinja`,
//! which renders tools, documents, tool calls, reasoning and a thinking
//! marker). Each request body goes through llmlb's own request reading and
//! tokenizing, as a routed request does.

use std::path::PathBuf;

use llmlb::routing::prefix::blocks::{Prompt, prompt_ids};
use llmlb::server::request::extract;
use llmlb::tokenize::PromptTokenizer;
use serde_json::{Value, json};

/// The tiny model's tokenizer, beside the repository (`../shared`) or, in
/// a worktree one level further down, beside its parent.
fn tiny_llama() -> PathBuf {
    [
        "../shared/tokenizers/tiny-llama",
        "../../shared/tokenizers/tiny-llama",
    ]
    .iter()
    .map(PathBuf::from)
    .find(|p| p.join("tokenizer.json").exists())
    .expect("the tiny model's tokenizer in ../shared/tokenizers/tiny-llama")
}

fn fixture() -> Value {
    let text = std::fs::read_to_string("tests/fixtures/render_tiny_tools.json").unwrap();
    serde_json::from_str(&text).unwrap()
}

/// A model directory: the tiny model's tokenizer with the fixture's template.
fn model_dir(source: &str, test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("llmlb-render-vllm-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tiny_llama().join(f), dir.join(f)).unwrap();
    }
    std::fs::write(dir.join("chat_template.jinja"), source).unwrap();
    dir
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect()
}

fn with_model(request: &Value) -> Vec<u8> {
    let mut body = request.clone();
    body["model"] = json!("tiny-llama");
    serde_json::to_vec(&body).unwrap()
}

#[test]
fn requests_render_and_encode_as_vllm_does() {
    let f = fixture();
    let dir = model_dir(f["template_source"].as_str().unwrap(), "requests");
    let t = PromptTokenizer::load(&dir).unwrap();
    let chats = f["chats"].as_array().unwrap();
    assert!(chats.len() >= 15, "{} cases", chats.len());
    for case in chats {
        let name = case["name"].as_str().unwrap();
        let meta = extract(&with_model(&case["request"])).unwrap();
        let messages = meta.messages.as_ref().expect("a chat request");
        let (got, unpredictable) = prompt_ids(&t, Prompt::ChatWith(messages, &meta.chat));
        assert_eq!(unpredictable, None, "{name}");
        let want = ids(&case["ids"]);
        assert_eq!(
            got,
            want,
            "{name}: llmlb rendered {:?}\nvLLM rendered {:?}",
            t.render_chat_with(messages, &meta.chat).unwrap(),
            case["text"].as_str().unwrap()
        );
    }
    for case in f["completions"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let meta = extract(&with_model(&case["request"])).unwrap();
        let prompt = match &meta.prompt_ids {
            Some(ids) => Prompt::Tokens(ids),
            None => Prompt::Text(&meta.prompt_text),
        };
        let (got, _) = prompt_ids(&t, prompt);
        if case["request"].get("add_special_tokens") == Some(&json!(false)) {
            // llmlb encodes completion text with the special tokens vLLM
            // adds by default; a request turning them off is one BOS short.
            assert_eq!(got[1..], ids(&case["ids"])[..], "{name}");
            continue;
        }
        assert_eq!(got, ids(&case["ids"]), "{name}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// Requests whose prompt llmlb cannot reproduce say so.
#[test]
fn media_and_request_templates_are_unpredictable() {
    let dir = model_dir(
        fixture()["template_source"].as_str().unwrap(),
        "unpredictable",
    );
    let t = PromptTokenizer::load(&dir).unwrap();
    let reason = |body: Value| {
        let meta = extract(&with_model(&body)).unwrap();
        meta.unpredictable.map(|r| r.as_str())
    };
    let image = json!({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]});
    assert_eq!(reason(image), Some("multimodal"));
    let audio = json!({"messages": [{"role": "user", "content": [
        {"type": "input_audio", "input_audio": {"data": "AA==", "format": "wav"}}]}]});
    assert_eq!(reason(audio), Some("multimodal"));
    let own = json!({"messages": [{"role": "user", "content": "hi"}], "chat_template": "{{ 1 }}"});
    assert_eq!(reason(own), Some("request_template"));
    assert_eq!(reason(json!({"prompt": ["a", "b"]})), Some("prompt_batch"));
    assert_eq!(reason(json!({"prompt": "a"})), None);
    // A template that raises is unpredictable, not silently re-tokenized.
    let broken = json!({"messages": [{"role": "user", "content": "Hi"}],
                        "add_generation_prompt": true, "continue_final_message": true});
    let meta = extract(&with_model(&broken)).unwrap();
    let (_, r) = prompt_ids(
        &t,
        Prompt::ChatWith(meta.messages.as_ref().unwrap(), &meta.chat),
    );
    assert_eq!(r.map(|r| r.as_str()), Some("template_error"));
    std::fs::remove_dir_all(&dir).ok();
}

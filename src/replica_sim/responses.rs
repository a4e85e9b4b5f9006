//! Writing OpenAI responses as vLLM writes them: the same objects, the same
//! fields in the same order (`id`, `object`, `created`, `model`, `choices`,
//! `usage`), a chat stream opening with the assistant role, the finish reason
//! on the last token's chunk, and a usage chunk with no choices.
//!
//! Serialized from structs, so key order is the declaration order.

use serde::Serialize;

use super::engine::Finished;
use super::openai::Api;

/// Identity of one response: shared by all its chunks.
#[derive(Debug, Clone)]
pub struct Meta {
    pub api: Api,
    pub id: String,
    pub created: u64,
    pub model: String,
}

#[derive(Serialize)]
struct Envelope<'a, C: Serialize> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: C,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: usize,
    total_tokens: usize,
    completion_tokens: usize,
    prompt_tokens_details: Details,
}

#[derive(Serialize)]
struct Details {
    cached_tokens: usize,
}

/// A JSON `null` for fields vLLM always sends empty.
type Null = Option<()>;

#[derive(Serialize)]
struct TextChoice<'a> {
    index: u32,
    text: &'a str,
    logprobs: Null,
    finish_reason: Option<&'static str>,
    stop_reason: Null,
}

#[derive(Serialize)]
struct ChatChoice<'a> {
    index: u32,
    message: Message<'a>,
    logprobs: Null,
    finish_reason: &'static str,
    stop_reason: Null,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    content: &'a str,
}

#[derive(Serialize)]
struct DeltaChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    logprobs: Null,
    finish_reason: Option<&'static str>,
    /// Present (as `null`) on the last chunk only, as vLLM sends it.
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_reason: Option<Null>,
}

#[derive(Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    content: &'a str,
}

fn usage(fin: &Finished) -> Usage {
    Usage {
        prompt_tokens: fin.prompt_tokens,
        total_tokens: fin.prompt_tokens + fin.completion_tokens,
        completion_tokens: fin.completion_tokens,
        prompt_tokens_details: Details {
            cached_tokens: fin.cached_tokens,
        },
    }
}

impl Meta {
    pub fn new(api: Api, request_id: u64, created: u64, model: &str) -> Meta {
        let prefix = match api {
            Api::Completions => "cmpl",
            Api::Chat => "chatcmpl",
        };
        Meta {
            api,
            id: format!("{prefix}-{request_id:016x}"),
            created,
            model: model.to_string(),
        }
    }

    fn write<C: Serialize>(&self, chunk: bool, choices: C, usage: Option<Usage>) -> String {
        let object = match (self.api, chunk) {
            (Api::Completions, _) => "text_completion",
            (Api::Chat, false) => "chat.completion",
            (Api::Chat, true) => "chat.completion.chunk",
        };
        let envelope = Envelope {
            id: &self.id,
            object,
            created: self.created,
            model: &self.model,
            choices,
            usage,
        };
        serde_json::to_string(&envelope).expect("response structs serialize")
    }

    /// The whole answer of a non-streaming request.
    pub fn response(&self, text: &str, fin: &Finished) -> String {
        let reason = fin.reason.as_str();
        match self.api {
            Api::Completions => self.write(
                false,
                [TextChoice {
                    index: 0,
                    text,
                    logprobs: None,
                    finish_reason: Some(reason),
                    stop_reason: None,
                }],
                Some(usage(fin)),
            ),
            Api::Chat => self.write(
                false,
                [ChatChoice {
                    index: 0,
                    message: Message {
                        role: "assistant",
                        content: text,
                    },
                    logprobs: None,
                    finish_reason: reason,
                    stop_reason: None,
                }],
                Some(usage(fin)),
            ),
        }
    }

    /// The first chunk of a chat stream: the assistant role, empty content.
    pub fn role_chunk(&self) -> Option<String> {
        (self.api == Api::Chat).then(|| {
            self.write(
                true,
                [DeltaChoice {
                    index: 0,
                    delta: Delta {
                        role: Some("assistant"),
                        content: "",
                    },
                    logprobs: None,
                    finish_reason: None,
                    stop_reason: None,
                }],
                None,
            )
        })
    }

    /// One token; the last one carries the finish reason.
    pub fn token_chunk(&self, text: &str, fin: Option<&Finished>) -> String {
        let reason = fin.map(|f| f.reason.as_str());
        match self.api {
            Api::Completions => self.write(
                true,
                [TextChoice {
                    index: 0,
                    text,
                    logprobs: None,
                    finish_reason: reason,
                    stop_reason: None,
                }],
                None,
            ),
            Api::Chat => self.write(
                true,
                [DeltaChoice {
                    index: 0,
                    delta: Delta {
                        role: None,
                        content: text,
                    },
                    logprobs: None,
                    finish_reason: reason,
                    stop_reason: reason.map(|_| None),
                }],
                None,
            ),
        }
    }

    /// The `include_usage` chunk: no choices, the usage.
    pub fn usage_chunk(&self, fin: &Finished) -> String {
        self.write(true, [(); 0], Some(usage(fin)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replica_sim::engine::FinishReason;
    use serde_json::{Value, json};

    fn fin() -> Finished {
        Finished {
            id: 1,
            reason: FinishReason::Length,
            prompt_tokens: 8,
            completion_tokens: 3,
            cached_tokens: 0,
        }
    }

    fn parse(s: &str) -> Value {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn keys_come_in_vllm_order() {
        let m = Meta::new(Api::Chat, 1, 7, "m");
        let r = m.response("a b c", &fin());
        assert!(r.starts_with(r#"{"id":"chatcmpl-0000000000000001","object":"chat.completion","created":7,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"a b c"}"#), "{r}");
        assert!(r.ends_with(r#""usage":{"prompt_tokens":8,"total_tokens":11,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":0}}}"#), "{r}");
    }

    #[test]
    fn chunks_follow_vllm() {
        let m = Meta::new(Api::Chat, 1, 7, "m");
        let role = parse(&m.role_chunk().unwrap());
        assert_eq!(
            role["choices"][0]["delta"],
            json!({"role": "assistant", "content": ""})
        );
        let mid = parse(&m.token_chunk(" x", None));
        assert!(mid["choices"][0].get("stop_reason").is_none());
        let last = parse(&m.token_chunk(" x", Some(&fin())));
        assert_eq!(last["choices"][0]["finish_reason"], "length");
        assert!(last["choices"][0]["stop_reason"].is_null());
        let usage = parse(&m.usage_chunk(&fin()));
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["object"], "chat.completion.chunk");
        let c = Meta::new(Api::Completions, 1, 7, "m");
        assert!(c.role_chunk().is_none());
        let t = parse(&c.token_chunk(" x", None));
        assert_eq!(t["choices"][0]["text"], " x");
        assert_eq!(t["object"], "text_completion");
        assert!(c.id.starts_with("cmpl-"));
        let full = parse(&c.response(" x y z", &fin()));
        assert_eq!(full["choices"][0]["finish_reason"], "length");
        assert_eq!(full["usage"]["total_tokens"], 11);
    }
}

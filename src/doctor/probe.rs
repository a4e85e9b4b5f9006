//! The probe `llmlb doctor` sends to each replica: one chat request of a few
//! hundred tokens, opened by a tag unique to the run (so its first send
//! finds nothing cached), asking for a single output token; and the
//! replica's `/metrics`, for the block size it reports.
//!
//! Two more probes ([`Variant`]) carry what changes how vLLM renders a chat
//! request: a tool list (`tools`, with `tool_choice: "auto"`) and template
//! arguments (`chat_template_kwargs: {"enable_thinking": true}`), so the
//! doctor shows llmlb renders those as the replica does.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, header};
use http_body_util::{BodyExt, Full};

use crate::net::{UpstreamClient, error_chain};
use crate::tokenize::{ChatFields, ChatMessage, ChatOptions};

/// Which probe: the plain chat request, or one with tools or template
/// arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    Plain,
    Tools,
    TemplateArgs,
}

impl Variant {
    /// How findings name the probe.
    pub fn label(self) -> &'static str {
        match self {
            Variant::Plain => "the probe",
            Variant::Tools => "the tool-calling probe",
            Variant::TemplateArgs => "the chat_template_kwargs probe",
        }
    }

    /// The request fields the variant adds to the plain body.
    fn fields(self) -> serde_json::Map<String, serde_json::Value> {
        let mut m = serde_json::Map::new();
        match self {
            Variant::Plain => {}
            Variant::Tools => {
                m.insert("tools".into(), tools());
                m.insert("tool_choice".into(), "auto".into());
            }
            Variant::TemplateArgs => {
                m.insert(
                    "chat_template_kwargs".into(),
                    serde_json::json!({"enable_thinking": true}),
                );
            }
        }
        m
    }

    /// The template arguments llmlb renders the variant with.
    pub fn options(self) -> ChatOptions {
        let mut f = self.fields();
        ChatOptions::from_request(ChatFields {
            tools: f.remove("tools"),
            chat_template_kwargs: f.remove("chat_template_kwargs"),
            ..ChatFields::default()
        })
    }
}

/// The tool-calling probe's tools.
fn tools() -> serde_json::Value {
    serde_json::json!([
        {"type": "function", "function": {
            "name": "locate_parcel",
            "description": "Where a parcel is now.",
            "parameters": {"type": "object",
                           "properties": {"tracking": {"type": "string"}},
                           "required": ["tracking"]}}},
        {"type": "function", "function": {
            "name": "parcel_weight",
            "parameters": {"type": "object",
                           "properties": {"tracking": {"type": "string"},
                                          "unit": {"type": "string", "enum": ["kg", "lb"]}}}}}
    ])
}

/// The probe's chat messages, tagged by `tag` at the very start.
pub fn messages(tag: &str) -> Vec<ChatMessage> {
    let system = format!(
        "Probe {tag}. You answer questions about shipping parcels between warehouses. \
         {}",
        "Every parcel has a tracking number, a weight in kilograms, a sender, a receiver \
         and a list of the depots it passed through on its way; answer in one sentence. "
            .repeat(14)
    );
    vec![
        ChatMessage::new("system", system),
        ChatMessage::new("user", "Where is parcel 4471 now?"),
    ]
}

/// The request body for `model`.
pub fn body(model: &str, messages: &[ChatMessage]) -> String {
    body_of(Variant::Plain, model, messages)
}

/// The request body of a probe variant for `model`.
pub fn body_of(variant: Variant, model: &str, messages: &[ChatMessage]) -> String {
    let messages: Vec<serde_json::Value> = messages
        .iter()
        .map(|m| serde_json::json!({"role": m.role, "content": m.joined("")}))
        .collect();
    let mut body = serde_json::json!({
        "model": model,
        "messages": messages,
        "max_tokens": 1,
        "temperature": 0,
        "stream": false,
    });
    if let Some(o) = body.as_object_mut() {
        o.extend(variant.fields());
    }
    body.to_string()
}

/// What a replica reported for one probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    /// `prompt_tokens_details.cached_tokens`, when reported (vLLM:
    /// `--enable-prompt-tokens-details`).
    pub cached_tokens: Option<u64>,
}

/// One replica as the doctor reaches it.
pub struct Target<'a> {
    pub client: &'a UpstreamClient,
    /// The replica's base URL, without a trailing slash.
    pub url: &'a str,
    /// `Authorization` to send (the pool's `upstream_api_key`).
    pub auth: Option<&'a str>,
    pub timeout: Duration,
}

impl Target<'_> {
    /// Sends the probe; the `usage` the replica reported.
    pub async fn chat(&self, body: &str) -> Result<Usage, String> {
        let (status, bytes) = self
            .send(
                Method::POST,
                "/v1/chat/completions",
                Bytes::from(body.to_owned()),
            )
            .await?;
        if status != 200 {
            let text = String::from_utf8_lossy(&bytes);
            return Err(format!(
                "the replica answered {status}: {}",
                text.chars().take(300).collect::<String>()
            ));
        }
        let v: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| format!("the answer is not JSON: {e}"))?;
        let usage = &v["usage"];
        let prompt_tokens = usage["prompt_tokens"]
            .as_u64()
            .ok_or_else(|| "the answer has no `usage.prompt_tokens`".to_string())?;
        Ok(Usage {
            prompt_tokens,
            cached_tokens: usage["prompt_tokens_details"]["cached_tokens"].as_u64(),
        })
    }

    /// Posts `body` to the chat endpoint; the answer's bytes when it is a 200.
    pub async fn post_chat(&self, body: Bytes) -> Result<Bytes, String> {
        let (status, bytes) = self
            .send(Method::POST, "/v1/chat/completions", body)
            .await?;
        if status != 200 {
            let text = String::from_utf8_lossy(&bytes);
            return Err(format!(
                "the replica answered {status}: {}",
                text.chars().take(300).collect::<String>()
            ));
        }
        Ok(bytes)
    }

    /// The model names the replica serves (the `id`s of its `/v1/models`).
    pub async fn served_models(&self) -> Result<Vec<String>, String> {
        let (status, bytes) = self.send(Method::GET, "/v1/models", Bytes::new()).await?;
        if status != 200 {
            return Err(format!("/v1/models answered {status}"));
        }
        let v: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| format!("/v1/models is not JSON: {e}"))?;
        let ids = v["data"]
            .as_array()
            .ok_or_else(|| "/v1/models has no `data` list".to_string())?
            .iter()
            .filter_map(|m| m["id"].as_str().map(str::to_owned))
            .collect();
        Ok(ids)
    }

    /// The block size in the replica's `vllm:cache_config_info`, if any.
    pub async fn metrics_block_size(&self) -> Option<usize> {
        let (status, bytes) = self
            .send(Method::GET, "/metrics", Bytes::new())
            .await
            .ok()?;
        if status != 200 {
            return None;
        }
        let text = String::from_utf8_lossy(&bytes);
        crate::signals::parse::samples(&text)
            .find(|s| s.name == "vllm:cache_config_info")
            .and_then(|s| s.label("block_size")?.parse().ok())
    }

    /// What the replica's `GET /version` says (vLLM: `{"version": "0.32.0"}`).
    pub async fn version(&self) -> Option<String> {
        let (status, bytes) = self
            .send(Method::GET, "/version", Bytes::new())
            .await
            .ok()?;
        if status != 200 {
            return None;
        }
        let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
        v["version"].as_str().map(str::to_owned)
    }

    async fn send(&self, method: Method, path: &str, body: Bytes) -> Result<(u16, Bytes), String> {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.url))
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(auth) = self.auth {
            req = req.header(header::AUTHORIZATION, auth);
        }
        let req = req.body(Full::new(body)).map_err(|e| e.to_string())?;
        let exchange = async {
            let resp = self
                .client
                .request_once(req)
                .await
                .map_err(|e| error_chain(&e))?;
            let status = resp.status().as_u16();
            let bytes = resp
                .into_body()
                .collect()
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok((status, bytes))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| format!("no answer within {:?}", self.timeout))?
    }
}

//! KV-cache transfer between a prefill replica and a decode replica: what
//! each side of a disaggregated request is sent, behind one small trait.
//!
//! A disaggregated request is computed in two places: a prefill replica
//! computes the prompt's KV cache, a decode replica receives it and
//! generates the answer. Engines differ in how the two are paired:
//!
//! - [`Vllm`]: two steps, one after the other. The prefill replica gets the
//!   request with `kv_transfer_params.do_remote_decode = true`, one output
//!   token and no stream; its JSON answer carries `kv_transfer_params`
//!   (where the blocks are), which go into the original request for the
//!   decode replica. Connectors that need no parameters (vLLM's example
//!   shared-storage connector) answer `null` and work the same way.
//! - [`Sglang`]: both sides at once. Both get the original request with
//!   `bootstrap_host` and `bootstrap_port` (the prefill server's bootstrap
//!   endpoint) and a random `bootstrap_room` that pairs them.
//!
//! Both sides of the wire are here, so the replica simulator answers the
//! same parameters llmlb sends ([`transfer_params`], [`prefill_answer_params`]).
//! Nothing here knows about routing or the proxy: bodies in, bodies out.

mod sglang;
mod vllm;

pub use sglang::Sglang;
pub use vllm::{Vllm, prefill_answer_params, transfer_params};

use bytes::Bytes;
use serde_json::{Map, Value};

/// How the two sides of a request are scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Steps {
    /// Prefill first; its answer shapes the decode request.
    Sequential,
    /// Prefill and decode sent together; the decode answer is the client's.
    Concurrent,
}

/// What pairs one request's prefill and decode replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pairing<'a> {
    /// The prefill replica's host (no port), as the decode replica reaches it.
    pub prefill_host: &'a str,
    /// The prefill replica's bootstrap port (SGLang).
    pub bootstrap_port: u16,
    /// A random number naming this request on both sides (SGLang).
    pub room: u64,
}

/// A body the protocol cannot work with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    #[error("the request body is not a JSON object")]
    NotAnObject,
    #[error("the prefill answer is not JSON: {0}")]
    BadAnswer(String),
}

/// One way of pairing a prefill and a decode replica.
pub trait Protocol: Send + Sync + std::fmt::Debug {
    /// `vllm` or `sglang`, as in the config and the metrics.
    fn name(&self) -> &'static str;
    fn steps(&self) -> Steps;
    /// The body the prefill replica gets, from the client's body.
    fn prefill_body(&self, body: &[u8], pairing: &Pairing<'_>) -> Result<Bytes, TransferError>;
    /// The body the decode replica gets, from the client's body and (for
    /// [`Steps::Sequential`]) the prefill replica's whole answer.
    fn decode_body(
        &self,
        body: &[u8],
        prefill_answer: Option<&[u8]>,
        pairing: &Pairing<'_>,
    ) -> Result<Bytes, TransferError>;
}

/// The protocol named in the config.
pub fn by_name(name: crate::config::KvProtocol) -> &'static dyn Protocol {
    match name {
        crate::config::KvProtocol::Vllm => &Vllm,
        crate::config::KvProtocol::Sglang => &Sglang,
    }
}

/// The body as a JSON object.
fn object(body: &[u8]) -> Result<Map<String, Value>, TransferError> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(TransferError::NotAnObject),
    }
}

fn to_bytes(map: Map<String, Value>) -> Bytes {
    Bytes::from(serde_json::to_vec(&Value::Object(map)).expect("a JSON map serializes"))
}

/// Turns a body into a one-token, non-streamed request: the prefill's
/// own answer is read by llmlb, never by the client.
fn one_token_no_stream(map: &mut Map<String, Value>) {
    map.insert("max_tokens".into(), Value::from(1));
    if map.contains_key("max_completion_tokens") {
        map.insert("max_completion_tokens".into(), Value::from(1));
    }
    map.insert("stream".into(), Value::Bool(false));
    map.remove("stream_options");
}

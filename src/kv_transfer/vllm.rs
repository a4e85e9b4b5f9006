//! vLLM's two-step scheme (its disaggregation proxy examples, NIXL-style
//! connectors): prefill with `do_remote_decode`, then decode with the
//! `kv_transfer_params` the prefill answered.

use bytes::Bytes;
use serde_json::{Value, json};

use super::{Pairing, Protocol, Steps, TransferError, object, one_token_no_stream, to_bytes};

/// The `kv_transfer_params` key of requests and answers.
const PARAMS: &str = "kv_transfer_params";

#[derive(Debug, Clone, Copy, Default)]
pub struct Vllm;

impl Protocol for Vllm {
    fn name(&self) -> &'static str {
        "vllm"
    }

    fn steps(&self) -> Steps {
        Steps::Sequential
    }

    fn prefill_body(&self, body: &[u8], _: &Pairing<'_>) -> Result<Bytes, TransferError> {
        let mut map = object(body)?;
        one_token_no_stream(&mut map);
        map.insert(
            PARAMS.into(),
            json!({
                "do_remote_decode": true,
                "do_remote_prefill": false,
                "remote_engine_id": null,
                "remote_block_ids": null,
                "remote_host": null,
                "remote_port": null,
            }),
        );
        Ok(to_bytes(map))
    }

    fn decode_body(
        &self,
        body: &[u8],
        prefill_answer: Option<&[u8]>,
        _: &Pairing<'_>,
    ) -> Result<Bytes, TransferError> {
        let mut map = object(body)?;
        let params = match prefill_answer {
            Some(answer) => transfer_params(answer)?,
            None => None,
        };
        // A connector that needs no parameters answers `null`: the decode
        // replica finds the KV by the prompt itself.
        match params {
            Some(p) => map.insert(PARAMS.into(), p),
            None => map.remove(PARAMS),
        };
        Ok(to_bytes(map))
    }
}

/// The `kv_transfer_params` of a JSON body (a request or an answer), when
/// it has non-null ones.
pub fn transfer_params(body: &[u8]) -> Result<Option<Value>, TransferError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| TransferError::BadAnswer(e.to_string()))?;
    Ok(v.get(PARAMS).filter(|p| !p.is_null()).cloned())
}

/// What a prefill replica of the NIXL kind answers for a request it
/// prefilled for remote decode: where the blocks are and how to fetch them.
pub fn prefill_answer_params(
    engine_id: &str,
    request_id: &str,
    host: &str,
    port: u16,
    block_ids: &[u64],
    num_tokens: usize,
) -> Value {
    json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_block_ids": block_ids,
        "remote_engine_id": engine_id,
        "remote_request_id": request_id,
        "remote_host": host,
        "remote_port": port,
        "remote_num_tokens": num_tokens,
        "tp_size": 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAIR: Pairing<'static> = Pairing {
        prefill_host: "10.0.0.1",
        bootstrap_port: 8998,
        room: 7,
    };

    fn value(b: &Bytes) -> Value {
        serde_json::from_slice(b).unwrap()
    }

    #[test]
    fn prefill_asks_one_unstreamed_token_for_remote_decode() {
        let body = br#"{"model":"m","messages":[],"max_tokens":200,"max_completion_tokens":200,
            "stream":true,"stream_options":{"include_usage":true},"temperature":0}"#;
        let v = value(&Vllm.prefill_body(body, &PAIR).unwrap());
        assert_eq!(v["max_tokens"], 1);
        assert_eq!(v["max_completion_tokens"], 1);
        assert_eq!(v["stream"], false);
        assert!(v.get("stream_options").is_none());
        assert_eq!(v["kv_transfer_params"]["do_remote_decode"], true);
        assert_eq!(v["kv_transfer_params"]["do_remote_prefill"], false);
        assert_eq!(v["temperature"], 0, "the rest of the request is kept");
        // No max_completion_tokens is added when the client sent none.
        let v = value(&Vllm.prefill_body(br#"{"prompt":"x"}"#, &PAIR).unwrap());
        assert!(v.get("max_completion_tokens").is_none());
    }

    #[test]
    fn decode_carries_the_prefill_answers_params_into_the_original_request() {
        let body = br#"{"model":"m","prompt":"x","max_tokens":200,"stream":true}"#;
        let answer = serde_json::to_vec(&json!({
            "choices": [{"text": "a"}],
            "kv_transfer_params": prefill_answer_params("e1", "r1", "10.0.0.1", 5600, &[3, 4], 40),
        }))
        .unwrap();
        let v = value(&Vllm.decode_body(body, Some(&answer), &PAIR).unwrap());
        assert_eq!(v["max_tokens"], 200);
        assert_eq!(v["stream"], true);
        assert_eq!(v["kv_transfer_params"]["remote_engine_id"], "e1");
        assert_eq!(v["kv_transfer_params"]["remote_block_ids"], json!([3, 4]));
        // A connector without parameters: the request goes as the client sent it.
        let v = value(
            &Vllm
                .decode_body(body, Some(br#"{"kv_transfer_params":null}"#), &PAIR)
                .unwrap(),
        );
        assert!(v.get("kv_transfer_params").is_none());
        assert_eq!(v["max_tokens"], 200);
    }

    #[test]
    fn bodies_that_are_not_objects_are_refused() {
        assert_eq!(
            Vllm.prefill_body(b"[1]", &PAIR),
            Err(TransferError::NotAnObject)
        );
        assert!(matches!(
            Vllm.decode_body(b"{}", Some(b"<html>"), &PAIR),
            Err(TransferError::BadAnswer(_))
        ));
    }
}

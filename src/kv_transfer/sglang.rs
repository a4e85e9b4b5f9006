//! SGLang's bootstrap scheme (its model gateway's P/D mode): the same
//! request, with `bootstrap_host`, `bootstrap_port` and `bootstrap_room`,
//! goes to a prefill and a decode server at once; the two meet at the
//! prefill server's bootstrap endpoint under the room number.

use bytes::Bytes;
use serde_json::Value;

use super::{Pairing, Protocol, Steps, TransferError, object, one_token_no_stream, to_bytes};

#[derive(Debug, Clone, Copy, Default)]
pub struct Sglang;

impl Sglang {
    fn with_bootstrap(
        body: &[u8],
        pairing: &Pairing<'_>,
    ) -> Result<serde_json::Map<String, Value>, TransferError> {
        let mut map = object(body)?;
        map.insert("bootstrap_host".into(), Value::from(pairing.prefill_host));
        map.insert("bootstrap_port".into(), Value::from(pairing.bootstrap_port));
        // SGLang reads the room as a signed 64-bit number: keep it positive.
        map.insert(
            "bootstrap_room".into(),
            Value::from(pairing.room & (u64::MAX >> 1)),
        );
        Ok(map)
    }
}

impl Protocol for Sglang {
    fn name(&self) -> &'static str {
        "sglang"
    }

    fn steps(&self) -> Steps {
        Steps::Concurrent
    }

    fn prefill_body(&self, body: &[u8], pairing: &Pairing<'_>) -> Result<Bytes, TransferError> {
        let mut map = Self::with_bootstrap(body, pairing)?;
        one_token_no_stream(&mut map);
        Ok(to_bytes(map))
    }

    fn decode_body(
        &self,
        body: &[u8],
        _: Option<&[u8]>,
        pairing: &Pairing<'_>,
    ) -> Result<Bytes, TransferError> {
        Self::with_bootstrap(body, pairing).map(to_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_sides_carry_the_same_room_and_the_prefills_bootstrap_endpoint() {
        let pairing = Pairing {
            prefill_host: "10.0.0.1",
            bootstrap_port: 8998,
            room: u64::MAX,
        };
        let body = br#"{"model":"m","prompt":"x","max_tokens":64,"stream":true}"#;
        let p: Value =
            serde_json::from_slice(&Sglang.prefill_body(body, &pairing).unwrap()).unwrap();
        let d: Value =
            serde_json::from_slice(&Sglang.decode_body(body, None, &pairing).unwrap()).unwrap();
        for v in [&p, &d] {
            assert_eq!(v["bootstrap_host"], "10.0.0.1");
            assert_eq!(v["bootstrap_port"], 8998);
            assert_eq!(v["bootstrap_room"], i64::MAX);
        }
        assert_eq!(
            (d["max_tokens"].clone(), d["stream"].clone()),
            (64.into(), true.into())
        );
        assert_eq!(
            (p["max_tokens"].clone(), p["stream"].clone()),
            (1.into(), false.into())
        );
    }
}

//! vLLM's KV-event wire format, decoded and encoded.
//!
//! One ZMQ message is three frames: the topic, the sequence number (u64,
//! big-endian) and a msgpack payload `[ts, [event, ...], dp_rank]`. Each
//! event is a msgspec tagged struct, which vLLM releases encode in one of two
//! ways: a map with a `type` key (the 0.32 CPU build, checked against frames
//! captured in `tests/fixtures/kv_events/`) or, with `array_like`, an array
//! whose first element is the tag followed by the fields in declaration
//! order. The decoder reads both:
//!
//! - `BlockStored`: `block_hashes`, `parent_block_hash`, `token_ids`,
//!   `block_size`, `lora_id`, `medium`, `lora_name`, `extra_keys`, then
//!   whatever later versions add (`group_idx`, ...), which is ignored.
//!   `extra_keys` holds, per block, the untagged keys vLLM mixed into its
//!   hash: the LoRA name (when `lora_name` is set), `(mm_identifier,
//!   offset)` pairs, the cache salt (a prompt's first block only) and
//!   prompt-embedding digests; read into a [`BlockExtra`] per block;
//! - `BlockRemoved`: `block_hashes`, `medium`, ...;
//! - `AllBlocksCleared`.
//!
//! Missing trailing fields take their defaults (msgspec's `omit_defaults`
//! drops them); unknown event tags are skipped so a newer replica does not
//! break an older llmlb. Block hashes may be integers (vLLM's
//! `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`, the default) or bytes; both become
//! a [`BlockKey`], which is only ever compared for equality.
//!
//! The encoder writes the tagged-array layout (what current vLLM publishes),
//! used by the simulator. Cost: linear in the payload size.

use rmpv::Value;

/// A replica's own identifier of a block (vLLM's block hash), folded to 64
/// bits. Only used to match a `BlockRemoved` with its `BlockStored`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey(pub u64);

/// One cache event.
#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    BlockStored {
        /// One per stored block, in chain order.
        block_hashes: Vec<BlockKey>,
        /// The block before the first one, `None` for a prompt's first block.
        parent_block_hash: Option<BlockKey>,
        /// The tokens of all the stored blocks, `block_size` per block.
        token_ids: Vec<u32>,
        block_size: usize,
        lora_name: Option<String>,
        medium: Option<String>,
        /// Per block, what else keyed its hash (empty: nothing did).
        extra_keys: Vec<BlockExtra>,
    },
    BlockRemoved {
        block_hashes: Vec<BlockKey>,
        medium: Option<String>,
    },
    AllBlocksCleared,
}

/// What besides its tokens, its parent and the LoRA adapter keyed one
/// stored block's hash.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BlockExtra {
    /// The request's `cache_salt` (on a prompt's first block).
    pub salt: Option<String>,
    /// Keys llmlb cannot reproduce from a request (multimodal items,
    /// prompt embeddings): the block never matches a prompt's.
    pub opaque: bool,
}

/// The payload of one message.
#[derive(Debug, Clone, PartialEq)]
pub struct EventBatch {
    pub ts: f64,
    pub events: Vec<KvEvent>,
    pub dp_rank: Option<i64>,
}

/// One published message.
#[derive(Debug, Clone, PartialEq)]
pub struct Message {
    pub topic: Vec<u8>,
    pub seq: u64,
    pub batch: EventBatch,
}

/// The sequence number the replay endpoint sends after its last message.
pub const END_OF_REPLAY: [u8; 8] = [0xff; 8];

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WireError {
    #[error("expected 3 frames (topic, sequence, payload), got {0}")]
    Frames(usize),
    #[error("the sequence frame has {0} bytes, not 8")]
    Sequence(usize),
    #[error("payload is not msgpack: {0}")]
    Msgpack(String),
    #[error("payload: {0}")]
    Shape(String),
}

fn shape(what: impl Into<String>) -> WireError {
    WireError::Shape(what.into())
}

/// Decodes the three frames of one message.
pub fn decode_frames<F: AsRef<[u8]>>(frames: &[F]) -> Result<Message, WireError> {
    let [topic, seq, payload] = frames else {
        return Err(WireError::Frames(frames.len()));
    };
    Ok(Message {
        topic: topic.as_ref().to_vec(),
        seq: decode_seq(seq.as_ref())?,
        batch: decode_payload(payload.as_ref())?,
    })
}

/// A big-endian u64 sequence frame.
pub fn decode_seq(frame: &[u8]) -> Result<u64, WireError> {
    let bytes: [u8; 8] = frame
        .try_into()
        .map_err(|_| WireError::Sequence(frame.len()))?;
    Ok(u64::from_be_bytes(bytes))
}

/// Decodes a msgpack `[ts, [events], dp_rank]` payload.
pub fn decode_payload(mut payload: &[u8]) -> Result<EventBatch, WireError> {
    let value =
        rmpv::decode::read_value(&mut payload).map_err(|e| WireError::Msgpack(e.to_string()))?;
    let Value::Array(items) = value else {
        return Err(shape("the batch is not an array"));
    };
    let ts = items.first().and_then(Value::as_f64).unwrap_or(0.0);
    let events = match items.get(1) {
        Some(Value::Array(events)) => events,
        _ => return Err(shape("the batch has no event list")),
    };
    let dp_rank = items.get(2).and_then(Value::as_i64);
    let mut out = Vec::with_capacity(events.len());
    for e in events {
        if let Some(event) = decode_event(e)? {
            out.push(event);
        }
    }
    Ok(EventBatch {
        ts,
        events: out,
        dp_rank,
    })
}

/// An event's fields by name, from either encoding.
struct Fields<'a> {
    tag: &'a str,
    named: Vec<(&'a str, &'a Value)>,
}

impl<'a> Fields<'a> {
    fn of(
        e: &'a Value,
        order: impl Fn(&str) -> &'static [&'static str],
    ) -> Result<Self, WireError> {
        match e {
            Value::Array(items) => {
                let tag = items
                    .first()
                    .and_then(Value::as_str)
                    .ok_or_else(|| shape("an array event does not start with its tag"))?;
                let names = order(tag);
                Ok(Fields {
                    tag,
                    named: names.iter().copied().zip(items.iter().skip(1)).collect(),
                })
            }
            Value::Map(pairs) => {
                let mut tag = None;
                let mut named = Vec::with_capacity(pairs.len());
                for (k, v) in pairs {
                    let Some(k) = k.as_str() else { continue };
                    if k == "type" {
                        tag = v.as_str();
                    } else {
                        named.push((k, v));
                    }
                }
                let tag = tag.ok_or_else(|| shape("a map event has no `type`"))?;
                Ok(Fields { tag, named })
            }
            _ => Err(shape("an event is neither an array nor a map")),
        }
    }

    fn get(&self, name: &str) -> Option<&'a Value> {
        self.named
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
            .filter(|v| !v.is_nil())
    }
}

const STORED: &[&str] = &[
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
];
const REMOVED: &[&str] = &["block_hashes", "medium"];

fn field_order(tag: &str) -> &'static [&'static str] {
    match tag {
        "BlockStored" => STORED,
        "BlockRemoved" => REMOVED,
        _ => &[],
    }
}

fn decode_event(e: &Value) -> Result<Option<KvEvent>, WireError> {
    let f = Fields::of(e, field_order)?;
    Ok(Some(match f.tag {
        "BlockStored" => {
            let block_size = f
                .get("block_size")
                .and_then(Value::as_u64)
                .ok_or_else(|| shape("BlockStored without block_size"))?
                as usize;
            let token_ids = match f.get("token_ids") {
                Some(Value::Array(ts)) => ts
                    .iter()
                    .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                    .collect::<Option<Vec<u32>>>()
                    .ok_or_else(|| shape("BlockStored token_ids are not all u32"))?,
                _ => return Err(shape("BlockStored without token_ids")),
            };
            let lora_name = text(f.get("lora_name"));
            KvEvent::BlockStored {
                block_hashes: hashes(f.get("block_hashes"))?,
                parent_block_hash: f.get("parent_block_hash").map(block_key).transpose()?,
                token_ids,
                block_size,
                extra_keys: extra_keys(f.get("extra_keys"), lora_name.is_some()),
                lora_name,
                medium: text(f.get("medium")),
            }
        }
        "BlockRemoved" => KvEvent::BlockRemoved {
            block_hashes: hashes(f.get("block_hashes"))?,
            medium: text(f.get("medium")),
        },
        "AllBlocksCleared" => KvEvent::AllBlocksCleared,
        _ => return Ok(None),
    }))
}

/// The per-block extra keys: after the LoRA name (when the event has one),
/// a string is the cache salt, anything else (an `(identifier, offset)`
/// pair, a digest) a key llmlb cannot reproduce.
fn extra_keys(v: Option<&Value>, lora: bool) -> Vec<BlockExtra> {
    let Some(Value::Array(blocks)) = v else {
        return Vec::new();
    };
    blocks
        .iter()
        .map(|keys| {
            let mut extra = BlockExtra::default();
            let Value::Array(keys) = keys else {
                return extra;
            };
            for key in keys.iter().skip(usize::from(lora)) {
                match key.as_str() {
                    Some(salt) if extra.salt.is_none() => extra.salt = Some(salt.to_string()),
                    _ => extra.opaque = true,
                }
            }
            extra
        })
        .collect()
}

fn text(v: Option<&Value>) -> Option<String> {
    v.and_then(Value::as_str).map(str::to_string)
}

fn hashes(v: Option<&Value>) -> Result<Vec<BlockKey>, WireError> {
    match v {
        Some(Value::Array(items)) => items.iter().map(block_key).collect(),
        _ => Err(shape("event without block_hashes")),
    }
}

/// An integer hash as its 64 bits; a bytes hash folded to 64 bits (FNV-1a).
fn block_key(v: &Value) -> Result<BlockKey, WireError> {
    if let Some(u) = v.as_u64() {
        return Ok(BlockKey(u));
    }
    if let Some(i) = v.as_i64() {
        return Ok(BlockKey(i as u64));
    }
    if let Value::Binary(b) = v {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &byte in b {
            h = (h ^ u64::from(byte)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        return Ok(BlockKey(h));
    }
    Err(shape("a block hash is neither an integer nor bytes"))
}

/// Encodes one batch in vLLM's tagged-array layout.
pub fn encode_payload(batch: &EventBatch) -> Vec<u8> {
    let opt_str = |s: Option<&str>| s.map_or(Value::Nil, Value::from);
    let keys = |hs: &[BlockKey]| Value::Array(hs.iter().map(|h| Value::from(h.0)).collect());
    let events = batch
        .events
        .iter()
        .map(|e| match e {
            KvEvent::BlockStored { .. } => {
                let s = e.stored().expect("a BlockStored");
                Value::Array(vec![
                    Value::from("BlockStored"),
                    keys(s.block_hashes),
                    s.parent_block_hash.map_or(Value::Nil, |p| Value::from(p.0)),
                    Value::Array(s.token_ids.iter().map(|&t| Value::from(t)).collect()),
                    Value::from(s.block_size as u64),
                    Value::Nil,
                    opt_str(s.medium),
                    opt_str(s.lora_name),
                    encode_extra(&s),
                ])
            }
            KvEvent::BlockRemoved {
                block_hashes,
                medium,
            } => Value::Array(vec![
                Value::from("BlockRemoved"),
                keys(block_hashes),
                opt_str(medium.as_deref()),
            ]),
            KvEvent::AllBlocksCleared => Value::Array(vec![Value::from("AllBlocksCleared")]),
        })
        .collect();
    let value = Value::Array(vec![
        Value::F64(batch.ts),
        Value::Array(events),
        batch.dp_rank.map_or(Value::Nil, Value::from),
    ]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &value).expect("writing to a Vec cannot fail");
    out
}

/// The `extra_keys` of a stored event, untagged as vLLM publishes them
/// (nil when no block has any).
fn encode_extra(s: &super::StoredBlocks<'_>) -> Value {
    let per_block: Vec<Value> = (0..s.block_hashes.len())
        .map(|i| {
            let mut keys: Vec<Value> = s.lora_name.map(Value::from).into_iter().collect();
            if let Some(salt) = s.extra_keys.get(i).and_then(|e| e.salt.as_deref()) {
                keys.push(Value::from(salt));
            }
            if keys.is_empty() {
                Value::Nil
            } else {
                Value::Array(keys)
            }
        })
        .collect();
    if per_block.iter().all(Value::is_nil) {
        Value::Nil
    } else {
        Value::Array(per_block)
    }
}

/// The three frames of one message.
pub fn encode_frames(topic: &[u8], seq: u64, batch: &EventBatch) -> [Vec<u8>; 3] {
    [
        topic.to_vec(),
        seq.to_be_bytes().to_vec(),
        encode_payload(batch),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored() -> KvEvent {
        KvEvent::BlockStored {
            block_hashes: vec![BlockKey(u64::MAX), BlockKey(7)],
            parent_block_hash: Some(BlockKey(3)),
            token_ids: vec![1, 2, 3, 4],
            block_size: 2,
            lora_name: None,
            medium: Some("GPU".into()),
            extra_keys: Vec::new(),
        }
    }

    #[test]
    fn round_trip_of_the_array_layout() {
        let batch = EventBatch {
            ts: 12.5,
            events: vec![
                stored(),
                KvEvent::BlockRemoved {
                    block_hashes: vec![BlockKey(7)],
                    medium: None,
                },
                KvEvent::AllBlocksCleared,
            ],
            dp_rank: Some(0),
        };
        let frames = encode_frames(b"kv", 41, &batch);
        let m = decode_frames(&frames).unwrap();
        assert_eq!((m.topic.as_slice(), m.seq), (&b"kv"[..], 41));
        assert_eq!(m.batch, batch);
        // An adapter's salted prompt start keeps its keys.
        let salted = EventBatch {
            ts: 1.0,
            events: vec![KvEvent::BlockStored {
                block_hashes: vec![BlockKey(1), BlockKey(2)],
                parent_block_hash: None,
                token_ids: vec![1, 2, 3, 4],
                block_size: 2,
                lora_name: Some("sql".into()),
                medium: None,
                extra_keys: vec![
                    BlockExtra {
                        salt: Some("s".into()),
                        opaque: false,
                    },
                    BlockExtra::default(),
                ],
            }],
            dp_rank: None,
        };
        let m = decode_frames(&encode_frames(b"kv", 1, &salted)).unwrap();
        assert_eq!(m.batch, salted);
    }

    #[test]
    fn extra_keys_read_as_vllm_writes_them() {
        let keys = Value::Array(vec![
            Value::Array(vec!["sql".into(), "salt".into()]),
            Value::Array(vec![
                "sql".into(),
                Value::Array(vec!["img".into(), 0u64.into()]),
            ]),
            Value::Nil,
        ]);
        let got = extra_keys(Some(&keys), true);
        assert_eq!(got[0].salt.as_deref(), Some("salt"));
        assert!(!got[0].opaque && got[1].opaque && got[1].salt.is_none());
        assert_eq!(got[2], BlockExtra::default());
        assert!(extra_keys(None, false).is_empty());
    }

    fn payload(v: Value) -> Vec<u8> {
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, &v).unwrap();
        out
    }

    #[test]
    fn tolerates_extra_and_missing_trailing_fields_and_unknown_tags() {
        let extra = Value::Array(vec![
            "BlockStored".into(),
            Value::Array(vec![Value::Binary(vec![1, 2, 3])]),
            Value::Nil,
            Value::Array(vec![5u32.into(), 6u32.into()]),
            2u64.into(),
            Value::Nil,
            "GPU".into(),
            Value::Nil,
            Value::Array(vec![Value::Nil]),
            0u64.into(),
            "full_attention".into(),
        ]);
        let short = Value::Array(vec!["BlockRemoved".into(), Value::Array(vec![9u64.into()])]);
        let future = Value::Array(vec!["BlockMoved".into(), 1u64.into()]);
        let p = payload(Value::Array(vec![
            Value::F64(1.0),
            Value::Array(vec![extra, short, future]),
        ]));
        let b = decode_payload(&p).unwrap();
        assert_eq!(b.dp_rank, None);
        assert_eq!(b.events.len(), 2);
        let KvEvent::BlockStored {
            block_hashes,
            token_ids,
            block_size,
            ..
        } = &b.events[0]
        else {
            panic!("{:?}", b.events[0]);
        };
        assert_eq!((token_ids.as_slice(), *block_size), (&[5, 6][..], 2));
        assert_eq!(block_hashes.len(), 1);
        assert_eq!(
            b.events[1],
            KvEvent::BlockRemoved {
                block_hashes: vec![BlockKey(9)],
                medium: None
            }
        );
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        assert_eq!(decode_frames(&[b"kv"]), Err(WireError::Frames(1)));
        assert_eq!(
            decode_frames(&[&b"kv"[..], &[0u8; 4][..], &[0x90][..]]),
            Err(WireError::Sequence(4))
        );
        assert!(matches!(
            decode_payload(&[0x92, 0x01]),
            Err(WireError::Msgpack(_))
        ));
        assert!(matches!(
            decode_payload(&payload(Value::from(3))),
            Err(WireError::Shape(_))
        ));
        let no_tokens = Value::Array(vec!["BlockStored".into(), Value::Array(vec![])]);
        let p = payload(Value::Array(vec![
            Value::F64(0.0),
            Value::Array(vec![no_tokens]),
        ]));
        assert!(matches!(decode_payload(&p), Err(WireError::Shape(_))));
    }
}

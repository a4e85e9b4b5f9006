//! `trace`: replays a Mooncake-format request trace (one JSON object per
//! line: `timestamp` in ms, `input_length`, `output_length`, `hash_ids`).
//!
//! Each hash id names a block of 512 prompt tokens *and everything before
//! it*, so two requests whose `hash_ids` start with the same k ids share their
//! first k blocks. The replay turns id `h` into a deterministic block of text
//! of exactly `block_tokens` tokens (see [`crate::bench::text::push_block`]),
//! concatenates the blocks of a request and trims the result to its input
//! length. A block opens with a tag naming its id, so requests that share k
//! leading ids share exactly k blocks of tokens and differ from the first
//! token of block k + 1.
//!
//! Scaling keeps that structure:
//! - `length_scale` multiplies the block size (`block_tokens = 512 ×
//!   length_scale`, at least 2), the input length (kept inside the last
//!   block, so a request never loses or gains a block) and the output length;
//! - `time_scale` multiplies arrival times: 0.1 replays ten times faster.
//!
//! Arrival times count from the first replayed record.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::{Conversation, Prompt, RequestSpec, Workload};
use crate::bench::error::BenchError;
use crate::bench::text::push_block;

/// Tokens per hash id in the Mooncake trace.
pub const TRACE_BLOCK_TOKENS: usize = 512;

#[derive(Clone, Debug)]
pub struct TraceOptions {
    pub path: PathBuf,
    pub time_scale: f64,
    pub length_scale: f64,
    pub max_requests: Option<usize>,
}

impl Default for TraceOptions {
    fn default() -> Self {
        TraceOptions {
            path: PathBuf::from("../shared/traces/conversation_trace.jsonl"),
            time_scale: 1.0,
            length_scale: 1.0,
            max_requests: None,
        }
    }
}

/// One line of the trace.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
pub struct TraceRecord {
    pub timestamp: u64,
    pub input_length: usize,
    pub output_length: usize,
    pub hash_ids: Vec<u64>,
}

pub struct Trace {
    records: Vec<TraceRecord>,
    opts: TraceOptions,
    block_tokens: usize,
    next: usize,
}

impl Trace {
    /// Reads and parses the trace file named by `opts.path`.
    pub fn load(opts: TraceOptions) -> Result<Self, BenchError> {
        let text = std::fs::read_to_string(&opts.path).map_err(|e| BenchError::Trace {
            path: opts.path.display().to_string(),
            line: 0,
            reason: e.to_string(),
        })?;
        let limit = opts.max_requests.unwrap_or(usize::MAX);
        let mut records = Vec::new();
        for (i, line) in text.lines().enumerate() {
            if records.len() >= limit {
                break;
            }
            if line.trim().is_empty() {
                continue;
            }
            let r = serde_json::from_str(line).map_err(|e| BenchError::Trace {
                path: opts.path.display().to_string(),
                line: i + 1,
                reason: e.to_string(),
            })?;
            records.push(r);
        }
        Trace::from_records(records, opts)
    }

    pub fn from_records(
        mut records: Vec<TraceRecord>,
        opts: TraceOptions,
    ) -> Result<Self, BenchError> {
        let scales_ok = |s: f64| s.is_finite() && s > 0.0;
        if !scales_ok(opts.time_scale) || !scales_ok(opts.length_scale) {
            return Err(BenchError::InvalidSpec(
                "--time-scale and --length-scale must be positive numbers".into(),
            ));
        }
        if let Some(limit) = opts.max_requests {
            records.truncate(limit);
        }
        let block_tokens =
            ((TRACE_BLOCK_TOKENS as f64 * opts.length_scale).round() as usize).max(2);
        Ok(Trace {
            records,
            opts,
            block_tokens,
            next: 0,
        })
    }

    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    /// The scaled request for one record.
    pub fn request(&self, r: &TraceRecord) -> RequestSpec {
        let bt = self.block_tokens;
        let scaled = (r.input_length as f64 * self.opts.length_scale).round() as usize;
        let n = r.hash_ids.len();
        let input = if n == 0 {
            scaled.max(1)
        } else {
            scaled.clamp((n - 1) * bt + 1, n * bt)
        };
        let mut text = String::with_capacity(input * 5);
        let mut left = input;
        for &id in &r.hash_ids {
            let take = left.min(bt);
            push_block(&mut text, id, bt, take);
            left -= take;
        }
        if n == 0 {
            push_block(&mut text, u64::MAX, input, input);
        }
        let output = ((r.output_length as f64 * self.opts.length_scale).round() as u32).max(1);
        RequestSpec {
            prompt: Prompt::Text(text),
            input_tokens: input,
            output_tokens: output,
        }
    }
}

impl Workload for Trace {
    fn name(&self) -> &'static str {
        "trace"
    }

    fn next_conversation(&mut self) -> Option<Conversation> {
        let r = self.records.get(self.next)?;
        self.next += 1;
        let origin = self.records[0].timestamp;
        let ms = r.timestamp.saturating_sub(origin) as f64 * self.opts.time_scale;
        Some(Conversation {
            turns: vec![self.request(r)],
            at: Some(Duration::from_secs_f64(ms / 1000.0)),
            think_time: Duration::ZERO,
        })
    }

    fn size_hint(&self) -> Option<u64> {
        Some(self.records.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::stand_in::{count_tokens, tokenize};

    /// Ten lines of the Mooncake conversation trace (lines 1, 2, 4, 67, 134,
    /// 281, 41, 262, 266, 323), chosen for their shared prefixes.
    const EXCERPT: &str = r#"{"timestamp": 0, "input_length": 6758, "output_length": 500, "hash_ids": [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]}
{"timestamp": 0, "input_length": 7322, "output_length": 490, "hash_ids": [0, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27]}
{"timestamp": 0, "input_length": 2290, "output_length": 316, "hash_ids": [0, 42, 43, 44, 45]}
{"timestamp": 21000, "input_length": 2651, "output_length": 366, "hash_ids": [0, 1541, 1542, 1543, 1544, 1545]}
{"timestamp": 48000, "input_length": 3024, "output_length": 111, "hash_ids": [0, 1541, 1542, 1543, 1544, 3753]}
{"timestamp": 95999, "input_length": 3142, "output_length": 398, "hash_ids": [0, 1541, 1542, 1543, 1544, 7306, 7307]}
{"timestamp": 12000, "input_length": 1902, "output_length": 587, "hash_ids": [0, 975, 976, 977]}
{"timestamp": 90000, "input_length": 1902, "output_length": 654, "hash_ids": [0, 975, 976, 977]}
{"timestamp": 90000, "input_length": 5240, "output_length": 534, "hash_ids": [0, 6802, 6803, 6804, 6805, 6806, 6807, 6808, 6809, 6810, 6811]}
{"timestamp": 111000, "input_length": 5240, "output_length": 111, "hash_ids": [0, 6802, 6803, 6804, 6805, 6806, 6807, 6808, 6809, 6810, 6811]}"#;

    fn records() -> Vec<TraceRecord> {
        EXCERPT
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn replay(length_scale: f64, time_scale: f64) -> (usize, Vec<TraceRecord>, Vec<Conversation>) {
        let opts = TraceOptions {
            length_scale,
            time_scale,
            ..TraceOptions::default()
        };
        let mut t = Trace::from_records(records(), opts).unwrap();
        let mut out = Vec::new();
        while let Some(c) = t.next_conversation() {
            out.push(c);
        }
        (t.block_tokens(), records(), out)
    }

    fn text(c: &Conversation) -> &str {
        match &c.turns[0].prompt {
            Prompt::Text(t) => t,
            _ => panic!("trace sends plain prompts"),
        }
    }

    fn common_ids(a: &[u64], b: &[u64]) -> usize {
        a.iter().zip(b).take_while(|(x, y)| x == y).count()
    }

    fn common_tokens(a: &[u32], b: &[u32]) -> usize {
        a.iter().zip(b).take_while(|(x, y)| x == y).count()
    }

    #[test]
    fn deterministic() {
        assert_eq!(replay(0.1, 1.0).2, replay(0.1, 1.0).2);
    }

    #[test]
    fn requests_sharing_k_ids_share_exactly_k_blocks() {
        for scale in [1.0, 0.1, 0.01] {
            let (bt, recs, convs) = replay(scale, 1.0);
            let tokens: Vec<Vec<u32>> = convs.iter().map(|c| tokenize(text(c))).collect();
            for i in 0..recs.len() {
                assert_eq!(tokens[i].len(), convs[i].turns[0].input_tokens);
                assert_eq!(
                    count_tokens(text(&convs[i])),
                    convs[i].turns[0].input_tokens
                );
                for j in 0..i {
                    let (a, b) = (&recs[i].hash_ids, &recs[j].hash_ids);
                    let k = common_ids(a, b);
                    let shared = common_tokens(&tokens[i], &tokens[j]);
                    if a == b {
                        // Same ids and input length: the same prompt.
                        assert_eq!(tokens[i], tokens[j]);
                    } else if k < a.len() && k < b.len() {
                        assert_eq!(shared, k * bt, "scale {scale}: records {i} and {j}");
                    } else {
                        // One request's ids are a prefix of the other's.
                        assert!(shared > (k - 1) * bt);
                    }
                }
            }
        }
    }

    #[test]
    fn lengths_stay_inside_their_blocks() {
        let (bt, recs, convs) = replay(0.05, 1.0);
        assert_eq!(bt, 26);
        for (r, c) in recs.iter().zip(&convs) {
            let n = r.hash_ids.len();
            let input = c.turns[0].input_tokens;
            assert!(input > (n - 1) * bt && input <= n * bt);
            let want = (r.output_length as f64 * 0.05).round() as u32;
            assert_eq!(c.turns[0].output_tokens, want.max(1));
        }
    }

    #[test]
    fn time_scale_compresses_arrivals() {
        let (_, _, convs) = replay(0.01, 0.1);
        let at: Vec<u128> = convs.iter().map(|c| c.at.unwrap().as_millis()).collect();
        assert_eq!(at[..4], [0, 0, 0, 2100]);
        assert_eq!(at[9], 11_100);
    }

    #[test]
    fn max_requests_bounds_the_replay() {
        let opts = TraceOptions {
            max_requests: Some(3),
            ..TraceOptions::default()
        };
        let t = Trace::from_records(records(), opts).unwrap();
        assert_eq!(t.size_hint(), Some(3));
    }
}

//! The requests of a simulation, loaded once and shared by every policy run.
//!
//! - **Trace** (Mooncake JSONL: `timestamp` ms, `input_length`,
//!   `output_length`, `hash_ids`): each hash id names a block of 512 prompt
//!   tokens and everything before it. Block `h` becomes 512 deterministic
//!   token ids drawn from a generator seeded by `h` ([`SimWorkload::fill_prompt`]), so two
//!   requests that share k leading ids share exactly their first k × 512
//!   tokens, for the engine's prefix cache and for the router's prefix modes
//!   alike (both are handed the same ids: the router as
//!   [`Prompt::Tokens`](crate::routing::Prompt)). Nothing is rendered as text;
//!   only the ids of a request in flight are held in memory. `length_scale`
//!   scales block size, input and output the way `llmlb bench` does (the
//!   input stays inside its last block). [`SimWorkload::with_bench_text`]
//!   instead renders each block as the text `llmlb bench` sends for it and
//!   tokenizes it with the stand-in tokenizer, as a replica and the router
//!   behind `bench` do: the same ids, so `hash` and `cache` break ties
//!   exactly as `serve` does on that run (about ten times the cost per
//!   prompt token).
//! - **Built-in** workloads of `llmlb bench` (`random`, `shared-prefix`): the
//!   same generator and seed as `bench`, arrivals from its seeded Gamma gaps
//!   at `--rate`; the prompt is kept as text and chat messages, so the router
//!   sees exactly what `serve` would, and is tokenized once for the engine.
//!
//! `rate_scale` divides every arrival time (2 = twice the traffic).

use std::path::Path;
use std::sync::Arc;

use crate::bench::arrivals::GapSampler;
use crate::bench::workload::{self, TraceRecord, Workload, WorkloadSpec};

use super::SimulateError;

/// Tokens per hash id in a Mooncake trace.
pub const TRACE_BLOCK_TOKENS: usize = 512;

/// Where a request's prompt comes from.
#[derive(Debug, Clone)]
pub enum Source {
    /// Hash ids `ids[start..start + len]` of the workload's id table;
    /// `private`: the line had none (one block named by the line).
    Blocks { start: u32, len: u32, private: bool },
    /// A built-in workload's prompt and its tokens.
    Text(Arc<(workload::Prompt, Vec<u32>)>),
}

#[derive(Debug, Clone)]
pub struct SimRequest {
    /// Arrival, seconds from the start.
    pub at: f64,
    /// Prompt tokens.
    pub input: u32,
    /// Output tokens (`max_tokens`, with `ignore_eos`).
    pub output: u32,
    pub source: Source,
}

#[derive(Debug, Clone)]
pub struct SimWorkload {
    pub name: String,
    pub requests: Vec<SimRequest>,
    ids: Vec<u64>,
    block_tokens: usize,
    /// Trace blocks as `llmlb bench`'s text, tokenized.
    bench_text: bool,
}

impl SimWorkload {
    /// Reads a Mooncake trace. `max_requests` keeps the first ones.
    pub fn trace(
        path: &Path,
        length_scale: f64,
        rate_scale: f64,
        max_requests: Option<usize>,
    ) -> Result<SimWorkload, SimulateError> {
        check_scale("--length-scale", length_scale)?;
        check_scale("--rate-scale", rate_scale)?;
        let bad = |line: usize, reason: String| SimulateError::Trace {
            path: path.display().to_string(),
            line,
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(0, e.to_string()))?;
        let block_tokens = ((TRACE_BLOCK_TOKENS as f64 * length_scale).round() as usize).max(2);
        let mut w = SimWorkload {
            name: format!("trace {}", path.display()),
            requests: Vec::new(),
            ids: Vec::new(),
            block_tokens,
            bench_text: false,
        };
        let mut origin = None;
        for (i, line) in text.lines().enumerate() {
            if max_requests.is_some_and(|m| w.requests.len() >= m) {
                break;
            }
            if line.trim().is_empty() {
                continue;
            }
            let r: TraceRecord =
                serde_json::from_str(line).map_err(|e| bad(i + 1, e.to_string()))?;
            let origin = *origin.get_or_insert(r.timestamp);
            let n = r.hash_ids.len();
            let scaled = (r.input_length as f64 * length_scale).round() as usize;
            let input = if n == 0 {
                scaled.max(1)
            } else {
                scaled.clamp((n - 1) * block_tokens + 1, n * block_tokens)
            };
            let start = w.ids.len() as u32;
            w.ids.extend_from_slice(&r.hash_ids);
            if n == 0 {
                // One private block, named by the line.
                w.ids.push(u64::MAX - i as u64);
            }
            w.requests.push(SimRequest {
                at: r.timestamp.saturating_sub(origin) as f64 / 1000.0 / rate_scale,
                input: input as u32,
                output: ((r.output_length as f64 * length_scale).round() as u32).max(1),
                source: Source::Blocks {
                    start,
                    len: (w.ids.len() as u32 - start),
                    private: n == 0,
                },
            });
        }
        if w.requests.is_empty() {
            return Err(bad(0, "no requests in the trace".into()));
        }
        Ok(w)
    }

    /// A built-in `llmlb bench` workload, `count` requests at `rate` per second.
    pub fn builtin(
        spec: &WorkloadSpec,
        count: usize,
        rate: f64,
        rate_scale: f64,
        seed: u64,
    ) -> Result<SimWorkload, SimulateError> {
        check_scale("--rate", rate)?;
        check_scale("--rate-scale", rate_scale)?;
        let mut source: Box<dyn Workload> = spec
            .build(seed)
            .map_err(|e| SimulateError::Invalid(e.to_string()))?;
        let mut gaps = GapSampler::new(rate * rate_scale, 1.0, seed);
        let mut at = 0.0;
        let mut requests = Vec::with_capacity(count);
        while requests.len() < count {
            let Some(conv) = source.next_conversation() else {
                break;
            };
            let Some(first) = conv.turns.into_iter().next() else {
                continue;
            };
            let tokens = stand_in_tokens(&first.prompt);
            requests.push(SimRequest {
                at,
                input: tokens.len() as u32,
                output: first.output_tokens.max(1),
                source: Source::Text(Arc::new((first.prompt, tokens))),
            });
            at += gaps.next_secs();
        }
        Ok(SimWorkload {
            name: spec.name().to_string(),
            requests,
            ids: Vec::new(),
            block_tokens: TRACE_BLOCK_TOKENS,
            bench_text: false,
        })
    }

    /// Both workloads' requests in one, in arrival order (a mixed
    /// workload: short prompts beside long ones).
    pub fn merged(mut self, other: SimWorkload) -> SimWorkload {
        assert_eq!(self.block_tokens, other.block_tokens, "one block size");
        let offset = self.ids.len() as u32;
        self.ids.extend_from_slice(&other.ids);
        for mut r in other.requests {
            if let Source::Blocks { start, .. } = &mut r.source {
                *start += offset;
            }
            self.requests.push(r);
        }
        self.requests.sort_by(|a, b| a.at.total_cmp(&b.at));
        self.name = format!("{} + {}", self.name, other.name);
        self.bench_text |= other.bench_text;
        self
    }

    /// Trace prompts carry the token ids of the text `llmlb bench` sends
    /// for them (see the module docs).
    pub fn with_bench_text(mut self) -> SimWorkload {
        self.bench_text = true;
        self
    }

    /// Writes request `r`'s prompt tokens into `out` (cleared first).
    pub fn fill_prompt(&self, r: &SimRequest, out: &mut Vec<u32>) {
        out.clear();
        match &r.source {
            Source::Blocks {
                start,
                len,
                private,
            } if self.bench_text => {
                let ids = &self.ids[*start as usize..(*start + *len) as usize];
                out.extend(crate::tokenize::stand_in::tokenize(
                    &self.bench_text_of(r, ids, *private),
                ));
            }
            Source::Blocks { start, len, .. } => {
                let ids = &self.ids[*start as usize..(*start + *len) as usize];
                let mut left = r.input as usize;
                for &id in ids {
                    let take = left.min(self.block_tokens);
                    push_block(out, id, take);
                    left -= take;
                }
            }
            Source::Text(p) => out.extend_from_slice(&p.1),
        }
    }

    /// The prompt `llmlb bench` sends for a trace request with these ids
    /// (its private block, when the line had none, named as `bench` names it).
    fn bench_text_of(&self, r: &SimRequest, ids: &[u64], private: bool) -> String {
        use crate::bench::text::push_block;
        let input = r.input as usize;
        let mut text = String::with_capacity(input * 6);
        if private {
            push_block(&mut text, u64::MAX, input, input);
            return text;
        }
        let mut left = input;
        for &id in ids {
            let take = left.min(self.block_tokens);
            push_block(&mut text, id, self.block_tokens, take);
            left -= take;
        }
        text
    }

    /// Each arrival later by a seeded draw of a lateness with mean `mean`
    /// and standard deviation `sd` seconds (at most `mean`): a constant
    /// `mean − sd` plus an exponential of mean `sd`, so `sd = mean` is a
    /// plain exponential. Then the requests in their new order; 0 leaves
    /// the workload as it is. A real client sends late by a little, and
    /// differently each run (its timer wakes late, its host is busy); this
    /// makes one simulated run one such draw. A request's TTFT counts from
    /// its late arrival, as `bench` counts from the real send.
    pub fn with_arrival_jitter(mut self, mean: f64, sd: f64, seed: u64) -> SimWorkload {
        if mean <= 0.0 {
            return self;
        }
        let sd = sd.clamp(0.0, mean);
        let mut rng = crate::bench::text::SplitMix::new(crate::bench::text::mix(seed, 0x6a69_7474));
        for r in &mut self.requests {
            let u = crate::bench::arrivals::uniform(&mut rng);
            r.at += mean - sd - sd * u.ln();
        }
        self.requests.sort_by(|a, b| a.at.total_cmp(&b.at));
        self
    }

    /// The time span of the arrivals, seconds.
    pub fn span(&self) -> f64 {
        self.requests.last().map_or(0.0, |r| r.at)
    }
}

/// `llmlb bench`'s prompt in the stand-in tokenizer's ids (what the
/// simulated engines and the router both see).
fn stand_in_tokens(p: &workload::Prompt) -> Vec<u32> {
    match p {
        workload::Prompt::Text(t) => crate::tokenize::stand_in::tokenize(t),
        workload::Prompt::Chat(m) => {
            crate::tokenize::stand_in::tokenize(&crate::tokenize::stand_in::render_chat(
                m.iter().map(|(r, c)| (r.as_str(), c.as_str())),
            ))
        }
        workload::Prompt::Tokens(ids) => ids.clone(),
    }
}

fn check_scale(flag: &str, v: f64) -> Result<(), SimulateError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(SimulateError::Invalid(format!(
            "{flag} must be a positive number, not {v}"
        )))
    }
}

/// The first `take` tokens of block `id`: ids from a SplitMix64 stream
/// seeded by the block id, in a 100k vocabulary.
fn push_block(out: &mut Vec<u32>, id: u64, take: usize) {
    let mut state = id.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5eed_b10c;
    out.extend((0..take).map(|_| {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) % 100_000) as u32
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trace file in the temp dir, unique per test, removed when the
    /// test is done with it.
    struct TempTrace(std::path::PathBuf);

    impl std::ops::Deref for TempTrace {
        type Target = std::path::Path;
        fn deref(&self) -> &std::path::Path {
            &self.0
        }
    }

    impl Drop for TempTrace {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn write(name: &str, lines: &str) -> TempTrace {
        let path = std::env::temp_dir().join(format!(
            "llmlb-simulate-{}-{name}.jsonl",
            std::process::id()
        ));
        std::fs::write(&path, lines).unwrap();
        TempTrace(path)
    }

    #[test]
    fn arrival_jitter_delays_every_arrival_by_its_mean_on_average() {
        let spec = WorkloadSpec::Random(workload::RandomOptions {
            input_len: workload::LenRange::fixed(8),
            output_len: workload::LenRange::fixed(1),
        });
        let w = SimWorkload::builtin(&spec, 2000, 10.0, 1.0, 3).unwrap();
        let base: f64 = w.requests.iter().map(|r| r.at).sum();
        let late = w.clone().with_arrival_jitter(0.005, 0.005, 1);
        let shift = (late.requests.iter().map(|r| r.at).sum::<f64>() - base) / 2000.0;
        assert!((shift - 0.005).abs() < 0.0005, "mean lateness {shift}");
        assert!(late.requests.windows(2).all(|p| p[0].at <= p[1].at));
        // A narrower spread: the same mean, every arrival at least
        // mean − sd late, and the lateness's spread near `sd`.
        let narrow = w.clone().with_arrival_jitter(0.005, 0.001, 1);
        let gaps: Vec<f64> = w
            .requests
            .iter()
            .zip(&narrow.requests)
            .map(|(a, b)| b.at - a.at)
            .collect();
        let mean = gaps.iter().sum::<f64>() / 2000.0;
        let sd = (gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / 2000.0).sqrt();
        assert!((mean - 0.005).abs() < 0.0002, "mean {mean}");
        assert!((sd - 0.001).abs() < 0.0002, "sd {sd}");
        assert!(gaps.iter().all(|&g| g >= 0.004 - 1e-12));
        // Seeded: the same draw again, another with another seed.
        let again = w.clone().with_arrival_jitter(0.005, 0.005, 1);
        let other = w.clone().with_arrival_jitter(0.005, 0.005, 2);
        let at = |w: &SimWorkload| w.requests.iter().map(|r| r.at).collect::<Vec<_>>();
        assert_eq!(at(&late), at(&again));
        assert_ne!(at(&late), at(&other));
        assert_eq!(at(&w.clone().with_arrival_jitter(0.0, 0.0, 1)), at(&w));
    }

    #[test]
    fn shared_hash_ids_share_exactly_their_blocks() {
        let f = write(
            "shared",
            "{\"timestamp\": 1000, \"input_length\": 1100, \"output_length\": 5, \"hash_ids\": [0, 1, 2]}\n\
             {\"timestamp\": 3000, \"input_length\": 1500, \"output_length\": 7, \"hash_ids\": [0, 1, 9]}\n",
        );
        let w = SimWorkload::trace(&f, 1.0, 2.0, None).unwrap();
        assert_eq!(w.requests.len(), 2);
        assert_eq!((w.requests[0].at, w.requests[1].at), (0.0, 1.0));
        let (mut a, mut b) = (Vec::new(), Vec::new());
        w.fill_prompt(&w.requests[0], &mut a);
        w.fill_prompt(&w.requests[1], &mut b);
        assert_eq!((a.len(), b.len()), (1100, 1500));
        let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        assert_eq!(shared, 1024);
    }

    #[test]
    fn bench_text_prompts_are_the_tokens_of_what_bench_sends() {
        use crate::bench::workload::{Trace, TraceOptions, Workload};
        let lines = "{\"timestamp\": 0, \"input_length\": 900, \"output_length\": 5, \"hash_ids\": [0, 1]}\n\
             {\"timestamp\": 10, \"input_length\": 300, \"output_length\": 5, \"hash_ids\": []}\n";
        let f = write("bench-text", lines);
        let w = SimWorkload::trace(&f, 0.5, 1.0, None)
            .unwrap()
            .with_bench_text();
        let mut bench = Trace::load(TraceOptions {
            path: f.to_path_buf(),
            time_scale: 1.0,
            length_scale: 0.5,
            max_requests: None,
        })
        .unwrap();
        let mut ids = Vec::new();
        for r in &w.requests {
            let conv = bench.next_conversation().unwrap();
            let crate::bench::workload::Prompt::Text(text) = &conv.turns[0].prompt else {
                panic!("trace prompts are text");
            };
            w.fill_prompt(r, &mut ids);
            assert_eq!(ids, crate::tokenize::stand_in::tokenize(text));
            assert_eq!(ids.len(), r.input as usize);
        }
    }

    #[test]
    fn bad_line_is_named() {
        let f = write("bad", "{\"timestamp\": 0}\n");
        let err = SimWorkload::trace(&f, 1.0, 1.0, None).unwrap_err();
        assert!(err.to_string().contains(":1:"), "{err}");
        assert!(SimWorkload::trace(&f, 0.0, 1.0, None).is_err());
    }
}

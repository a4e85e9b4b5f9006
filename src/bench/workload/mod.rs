//! Workloads: deterministic generators of the requests a run sends.
//!
//! A workload yields [`Conversation`]s: one request for single-shot workloads,
//! several turns for multi-turn chat, where turn `t + 1` is only sent after
//! turn `t` has finished. Every generator is a pure function of its options
//! and the run's seed, so two runs with the same seed send the same prompts.

mod chat;
mod random;
mod shared_prefix;
mod trace;

use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use chat::{Chat, ChatOptions};
pub use random::{Random, RandomOptions};
pub use shared_prefix::{SharedPrefix, SharedPrefixOptions};
pub use trace::{Trace, TraceOptions, TraceRecord};

use super::error::BenchError;
use super::text::SplitMix;

/// The body of one request: a plain prompt for `/v1/completions`, chat
/// messages (role, content) for `/v1/chat/completions`, or token ids for
/// `/v1/completions` (vLLM and the OpenAI API take a list of ids as the
/// prompt: the server sees exactly these tokens, whatever its tokenizer).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    Text(String),
    Chat(Vec<(String, String)>),
    Tokens(Vec<u32>),
}

/// One request to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestSpec {
    pub prompt: Prompt,
    /// Prompt tokens as counted by [`crate::tokenize::stand_in`] (chat: the rendered
    /// template).
    pub input_tokens: usize,
    /// `max_tokens`; with `ignore_eos` the exact output length.
    pub output_tokens: u32,
}

/// Requests sent one after the other, each after the previous one finished
/// and `think_time` has passed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conversation {
    pub turns: Vec<RequestSpec>,
    /// Arrival time from the start of the run, for workloads that carry their
    /// own schedule (a trace); `None` for the others.
    pub at: Option<Duration>,
    pub think_time: Duration,
}

impl Conversation {
    pub fn single(request: RequestSpec) -> Self {
        Conversation {
            turns: vec![request],
            at: None,
            think_time: Duration::ZERO,
        }
    }
}

/// A source of conversations; `None` once a finite workload is exhausted.
pub trait Workload: Send {
    fn name(&self) -> &'static str;
    fn next_conversation(&mut self) -> Option<Conversation>;
    /// How many requests the workload holds, if finite (a natural default
    /// for `--requests`).
    fn size_hint(&self) -> Option<u64> {
        None
    }
}

/// An inclusive range of token counts, written `N` or `MIN..MAX`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LenRange {
    pub min: usize,
    pub max: usize,
}

impl LenRange {
    pub const fn fixed(n: usize) -> Self {
        LenRange { min: n, max: n }
    }

    /// A uniform draw from the range.
    pub fn sample(&self, rng: &mut SplitMix) -> usize {
        if self.max <= self.min {
            return self.min;
        }
        self.min + (rng.next_u64() % (self.max - self.min + 1) as u64) as usize
    }
}

impl std::str::FromStr for LenRange {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let num = |t: &str| {
            t.trim()
                .parse::<usize>()
                .map_err(|_| format!("`{s}` is not a token count or a range MIN..MAX"))
        };
        let r = match s.split_once("..") {
            Some((a, b)) => LenRange {
                min: num(a)?,
                max: num(b.trim_start_matches('='))?,
            }
            .checked()?,
            None => LenRange::fixed(num(s)?),
        };
        Ok(r)
    }
}

impl LenRange {
    fn checked(self) -> Result<Self, String> {
        if self.min > self.max {
            return Err(format!("range {}..{} is empty", self.min, self.max));
        }
        Ok(self)
    }
}

impl std::fmt::Display for LenRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.min == self.max {
            write!(f, "{}", self.min)
        } else {
            write!(f, "{}..{}", self.min, self.max)
        }
    }
}

/// Which workload to run, with its options.
#[derive(Clone, Debug)]
pub enum WorkloadSpec {
    Random(RandomOptions),
    SharedPrefix(SharedPrefixOptions),
    Chat(ChatOptions),
    Trace(TraceOptions),
}

impl WorkloadSpec {
    /// Builds the generator (reads the trace file for `Trace`).
    pub fn build(&self, seed: u64) -> Result<Box<dyn Workload>, BenchError> {
        Ok(match self {
            WorkloadSpec::Random(o) => Box::new(Random::new(o.clone(), seed)),
            WorkloadSpec::SharedPrefix(o) => Box::new(SharedPrefix::new(o.clone(), seed)?),
            WorkloadSpec::Chat(o) => Box::new(Chat::new(o.clone(), seed)?),
            WorkloadSpec::Trace(o) => Box::new(Trace::load(o.clone())?),
        })
    }

    pub fn name(&self) -> &'static str {
        match self {
            WorkloadSpec::Random(_) => "random",
            WorkloadSpec::SharedPrefix(_) => "shared-prefix",
            WorkloadSpec::Chat(_) => "chat",
            WorkloadSpec::Trace(_) => "trace",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn len_range_parses_and_samples_inside() {
        assert_eq!("128".parse::<LenRange>().unwrap(), LenRange::fixed(128));
        let r: LenRange = "10..20".parse().unwrap();
        assert_eq!(r, LenRange { min: 10, max: 20 });
        assert_eq!("10..=20".parse::<LenRange>().unwrap(), r);
        assert!("20..10".parse::<LenRange>().is_err());
        assert!("x".parse::<LenRange>().is_err());
        let mut rng = SplitMix::new(3);
        let draws: Vec<usize> = (0..200).map(|_| r.sample(&mut rng)).collect();
        assert!(draws.iter().all(|d| (10..=20).contains(d)));
        assert!(draws.contains(&10) && draws.contains(&20));
    }
}

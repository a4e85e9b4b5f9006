//! `random`: independent prompts of random length, as in `vllm bench serve
//! --dataset-name random`.
//!
//! Each request draws an input length and an output length uniformly from
//! their ranges and a fresh run of pseudo-words of exactly that many tokens,
//! so requests share no prefix beyond chance. Infinite: bound the run with
//! `--num-requests` or `--duration`.

use super::{Conversation, LenRange, Prompt, RequestSpec, Workload};
use crate::bench::text::{SplitMix, mix, words};

#[derive(Clone, Debug)]
pub struct RandomOptions {
    pub input_len: LenRange,
    pub output_len: LenRange,
}

impl Default for RandomOptions {
    fn default() -> Self {
        RandomOptions {
            input_len: LenRange::fixed(1024),
            output_len: LenRange::fixed(128),
        }
    }
}

pub struct Random {
    opts: RandomOptions,
    rng: SplitMix,
}

impl Random {
    pub fn new(opts: RandomOptions, seed: u64) -> Self {
        Random {
            opts,
            rng: SplitMix::new(mix(seed, 0x72616e64)),
        }
    }
}

impl Workload for Random {
    fn name(&self) -> &'static str {
        "random"
    }

    fn next_conversation(&mut self) -> Option<Conversation> {
        let input = self.opts.input_len.sample(&mut self.rng).max(1);
        let output = self.opts.output_len.sample(&mut self.rng).max(1);
        let text_seed = self.rng.next_u64();
        Some(Conversation::single(RequestSpec {
            prompt: Prompt::Text(words(text_seed, input)),
            input_tokens: input,
            output_tokens: output as u32,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::stand_in::count_tokens;

    fn take(seed: u64, n: usize) -> Vec<Conversation> {
        let opts = RandomOptions {
            input_len: "50..80".parse().unwrap(),
            output_len: "5..9".parse().unwrap(),
        };
        let mut w = Random::new(opts, seed);
        (0..n).map(|_| w.next_conversation().unwrap()).collect()
    }

    #[test]
    fn deterministic_for_a_seed() {
        assert_eq!(take(1, 20), take(1, 20));
        assert_ne!(take(1, 20), take(2, 20));
    }

    #[test]
    fn lengths_are_exact_and_in_range() {
        for c in take(5, 50) {
            let r = &c.turns[0];
            let Prompt::Text(t) = &r.prompt else {
                panic!("random sends plain prompts")
            };
            assert_eq!(count_tokens(t), r.input_tokens);
            assert!((50..=80).contains(&r.input_tokens));
            assert!((5..=9).contains(&r.output_tokens));
        }
    }
}

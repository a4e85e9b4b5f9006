//! `shared-prefix`: groups of prompts that share a long system prompt, after
//! SGLang's generated-shared-prefix benchmark (`bench_serving`,
//! `--dataset-name generated-shared-prefix`: 64 groups × 16 prompts, system
//! prompt 2048 tokens, question 128, output 256).
//!
//! Prompt `j` of group `g` is `system(g) + question(g, j)` sent to
//! `/v1/completions`. Both parts are pseudo-word runs (see
//! [`crate::bench::text`]), so the prompt's tokens are exactly the system
//! prompt's tokens followed by the question's: a cache-aware router and a
//! prefix cache see `system_len` shared tokens within a group. The system
//! prompt opens with a tag word naming the group, so two groups differ from
//! the first token. All groups × prompts are shuffled with the seed; after
//! the last one a new shuffle of the same set starts (the set is finite, the
//! stream is not).

use super::{Conversation, Prompt, RequestSpec, Workload};
use crate::bench::error::BenchError;
use crate::bench::text::{SplitMix, mix, push_block, push_words};

#[derive(Clone, Debug)]
pub struct SharedPrefixOptions {
    pub groups: usize,
    pub prompts_per_group: usize,
    pub system_len: usize,
    pub question_len: usize,
    pub output_len: usize,
}

impl Default for SharedPrefixOptions {
    fn default() -> Self {
        SharedPrefixOptions {
            groups: 64,
            prompts_per_group: 16,
            system_len: 2048,
            question_len: 128,
            output_len: 256,
        }
    }
}

pub struct SharedPrefix {
    opts: SharedPrefixOptions,
    seed: u64,
    rng: SplitMix,
    order: Vec<(usize, usize)>,
    next: usize,
}

impl SharedPrefix {
    pub fn new(opts: SharedPrefixOptions, seed: u64) -> Result<Self, BenchError> {
        if opts.groups == 0 || opts.prompts_per_group == 0 || opts.system_len == 0 {
            return Err(BenchError::InvalidSpec(
                "shared-prefix needs at least one group, one prompt per group and a system prompt of at least one token".into(),
            ));
        }
        let order = (0..opts.groups)
            .flat_map(|g| (0..opts.prompts_per_group).map(move |j| (g, j)))
            .collect();
        let mut w = SharedPrefix {
            opts,
            seed,
            rng: SplitMix::new(mix(seed, 0x7368_6172)),
            order,
            next: 0,
        };
        w.shuffle();
        Ok(w)
    }

    /// Fisher–Yates with the workload's own stream.
    fn shuffle(&mut self) {
        for i in (1..self.order.len()).rev() {
            let j = (self.rng.next_u64() % (i as u64 + 1)) as usize;
            self.order.swap(i, j);
        }
        self.next = 0;
    }

    /// The system prompt of group `g` (exactly `system_len` tokens).
    pub fn system_prompt(&self, g: usize) -> String {
        let mut s = String::new();
        // The tag is the group index itself so groups differ at token 0; the
        // seed only changes the words after it.
        push_block(&mut s, g as u64, self.opts.system_len, 1);
        push_words(&mut s, mix(self.seed, g as u64), self.opts.system_len - 1);
        s
    }

    fn prompt(&self, g: usize, j: usize) -> String {
        let mut s = self.system_prompt(g);
        push_words(
            &mut s,
            mix(mix(self.seed, g as u64), j as u64 + 1),
            self.opts.question_len,
        );
        s
    }
}

impl Workload for SharedPrefix {
    fn name(&self) -> &'static str {
        "shared-prefix"
    }

    fn next_conversation(&mut self) -> Option<Conversation> {
        if self.next == self.order.len() {
            self.shuffle();
        }
        let (g, j) = self.order[self.next];
        self.next += 1;
        Some(Conversation::single(RequestSpec {
            prompt: Prompt::Text(self.prompt(g, j)),
            input_tokens: self.opts.system_len + self.opts.question_len,
            output_tokens: self.opts.output_len.max(1) as u32,
        }))
    }

    fn size_hint(&self) -> Option<u64> {
        Some(self.order.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::stand_in::tokenize;

    fn opts() -> SharedPrefixOptions {
        SharedPrefixOptions {
            groups: 4,
            prompts_per_group: 5,
            system_len: 300,
            question_len: 20,
            output_len: 8,
        }
    }

    fn texts(seed: u64, n: usize) -> Vec<String> {
        let mut w = SharedPrefix::new(opts(), seed).unwrap();
        (0..n)
            .map(
                |_| match w.next_conversation().unwrap().turns.remove(0).prompt {
                    Prompt::Text(t) => t,
                    _ => panic!("shared-prefix sends plain prompts"),
                },
            )
            .collect()
    }

    #[test]
    fn deterministic_for_a_seed() {
        assert_eq!(texts(7, 45), texts(7, 45));
        assert_ne!(texts(7, 20), texts(8, 20));
    }

    #[test]
    fn one_pass_covers_every_prompt_once() {
        let mut one = texts(3, 20);
        one.sort();
        one.dedup();
        assert_eq!(one.len(), 20);
    }

    #[test]
    fn groups_share_the_system_prompt_at_token_level() {
        let w = SharedPrefix::new(opts(), 11).unwrap();
        let systems: Vec<Vec<u32>> = (0..4).map(|g| tokenize(&w.system_prompt(g))).collect();
        assert!(systems.iter().all(|s| s.len() == 300));
        let mut per_group = vec![Vec::new(); 4];
        for t in texts(11, 20) {
            let tokens = tokenize(&t);
            assert_eq!(tokens.len(), 320);
            let g = systems
                .iter()
                .position(|s| tokens[..300] == s[..])
                .expect("every prompt starts with one group's system prompt tokens");
            per_group[g].push(tokens);
        }
        assert!(per_group.iter().all(|p| p.len() == 5));
        // Different groups differ from the very first token.
        for a in 0..4 {
            for b in a + 1..4 {
                assert_ne!(systems[a][0], systems[b][0]);
            }
        }
        // Within a group the questions differ: the shared part is the system prompt.
        for prompts in &per_group {
            for i in 1..prompts.len() {
                assert_ne!(prompts[0][300..], prompts[i][300..]);
            }
        }
    }
}

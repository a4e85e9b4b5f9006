//! `chat`: multi-turn sessions whose history grows turn by turn.
//!
//! A session has a number of turns drawn from `turns`. Turn `t` sends the
//! shared system prompt, every earlier user message and assistant answer, and
//! the new user message, to `/v1/chat/completions`; it is sent only after turn
//! `t - 1` has finished and `think_time` has passed. Rendered with
//! [`crate::tokenize::stand_in::render_chat`], turn `t + 1`'s prompt extends turn `t`'s
//! conversation, so a replica that kept turn `t` in its prefix cache reuses it.
//!
//! The assistant answers in the history are stand-ins of the requested output
//! length drawn from the seed, not the text the server produced: this keeps
//! every prompt a pure function of the seed (and the run repeatable), at the
//! cost of a real server not finding its own generated tokens in the next
//! turn's prompt (the earlier prompt part is still shared).

use std::time::Duration;

use super::{Conversation, LenRange, Prompt, RequestSpec, Workload};
use crate::bench::error::BenchError;
use crate::bench::text::{SplitMix, mix, words};
use crate::tokenize::stand_in::{count_tokens, render_chat};

#[derive(Clone, Debug)]
pub struct ChatOptions {
    pub turns: LenRange,
    pub system_len: usize,
    pub user_len: LenRange,
    pub output_len: LenRange,
    pub think_time: Duration,
}

impl Default for ChatOptions {
    fn default() -> Self {
        ChatOptions {
            turns: "2..6".parse().expect("valid range"),
            system_len: 256,
            user_len: "32..128".parse().expect("valid range"),
            output_len: "64..256".parse().expect("valid range"),
            think_time: Duration::ZERO,
        }
    }
}

pub struct Chat {
    opts: ChatOptions,
    system: String,
    rng: SplitMix,
}

impl Chat {
    pub fn new(opts: ChatOptions, seed: u64) -> Result<Self, BenchError> {
        if opts.turns.max == 0 {
            return Err(BenchError::InvalidSpec(
                "chat sessions need at least one turn".into(),
            ));
        }
        Ok(Chat {
            system: words(mix(seed, 0x0073_7973), opts.system_len),
            rng: SplitMix::new(mix(seed, 0x6368_6174)),
            opts,
        })
    }
}

fn render(messages: &[(String, String)]) -> String {
    render_chat(messages.iter().map(|(r, c)| (r.as_str(), c.as_str())))
}

impl Workload for Chat {
    fn name(&self) -> &'static str {
        "chat"
    }

    fn next_conversation(&mut self) -> Option<Conversation> {
        let turns = self.opts.turns.sample(&mut self.rng).max(1);
        let mut history: Vec<(String, String)> = Vec::with_capacity(2 * turns + 1);
        if self.opts.system_len > 0 {
            history.push(("system".into(), self.system.clone()));
        }
        let mut requests = Vec::with_capacity(turns);
        for _ in 0..turns {
            let user = words(
                self.rng.next_u64(),
                self.opts.user_len.sample(&mut self.rng),
            );
            let output = self.opts.output_len.sample(&mut self.rng).max(1);
            history.push(("user".into(), user));
            requests.push(RequestSpec {
                input_tokens: count_tokens(&render(&history)),
                prompt: Prompt::Chat(history.clone()),
                output_tokens: output as u32,
            });
            history.push(("assistant".into(), words(self.rng.next_u64(), output)));
        }
        Some(Conversation {
            turns: requests,
            at: None,
            think_time: self.opts.think_time,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::stand_in::tokenize;

    fn sessions(seed: u64, n: usize) -> Vec<Conversation> {
        let mut w = Chat::new(ChatOptions::default(), seed).unwrap();
        (0..n).map(|_| w.next_conversation().unwrap()).collect()
    }

    #[test]
    fn deterministic_for_a_seed() {
        assert_eq!(sessions(4, 10), sessions(4, 10));
        assert_ne!(sessions(4, 10), sessions(5, 10));
    }

    #[test]
    fn history_grows_turn_by_turn_and_stays_a_token_prefix() {
        for s in sessions(9, 10) {
            assert!((2..=6).contains(&s.turns.len()));
            for pair in s.turns.windows(2) {
                let (Prompt::Chat(a), Prompt::Chat(b)) = (&pair[0].prompt, &pair[1].prompt) else {
                    panic!("chat sends messages")
                };
                assert_eq!(b.len(), a.len() + 2, "one answer and one question more");
                assert_eq!(&b[..a.len()], &a[..]);
                let before = render(a);
                let before = before.trim_end_matches("<|assistant|>\n");
                let (ta, tb) = (tokenize(before), tokenize(&render(b)));
                assert_eq!(&tb[..ta.len()], &ta[..]);
                assert!(pair[1].input_tokens > pair[0].input_tokens);
            }
            for r in &s.turns {
                let Prompt::Chat(m) = &r.prompt else {
                    unreachable!()
                };
                assert_eq!(count_tokens(&render(m)), r.input_tokens);
            }
        }
    }
}

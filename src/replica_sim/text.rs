//! Deterministic filler output.
//!
//! The simulated model "generates" words from a fixed list. Token `i` of a
//! request is chosen by hashing the simulator seed, a hash of the whole prompt
//! and `i`, so the same prompt always yields the same answer (as greedy
//! decoding would) and a conversation that sends the previous answer back
//! gets a cache hit on it. Every word is a space followed by at most five
//! letters, which the llmlb tokenizer ([`crate::tokenize::stand_in`]) reads as exactly
//! one token: the text of `n` generated tokens tokenizes back to `n` tokens.

use crate::replica_sim::engine::kv_cache::mix64;
use crate::tokenize::stand_in::piece_id;

const WORDS: &[&str] = &[
    " the", " a", " load", " to", " model", " cache", " token", " of", " and", " is", " fast",
    " batch", " query", " hash", " route", " on", " GPU", " we", " can", " serve", " more",
    " with", " less", " time", " block", " queue", " each", " step", " runs", " in", " one",
    " pass", " data", " flows", " as", " it", " must", " when", " free", " hits", " miss", " then",
    " again", " now", " just", " like", " that", " so", " very", " well", " good", " new", " old",
    " list", " word", " text", " line", " node", " path", " fleet",
];

/// Hash of a whole prompt, the per-request input of [`filler_word`].
pub fn prompt_hash(tokens: &[u32]) -> u64 {
    tokens
        .iter()
        .fold(0x243f_6a88_85a3_08d3, |h, &t| mix64(h ^ u64::from(t)))
}

/// The text of output token `index` of a prompt with hash `prompt`.
pub fn filler_word(seed: u64, prompt: u64, index: u32) -> &'static str {
    let h = mix64(seed ^ mix64(prompt ^ u64::from(index).wrapping_mul(0x9e37_79b9)));
    WORDS[(h % WORDS.len() as u64) as usize]
}

/// The token id of a filler word (the tokenizer's id of that one piece).
pub fn filler_token(word: &str) -> u32 {
    piece_id(word)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::stand_in::count_tokens;

    #[test]
    fn every_word_is_one_token() {
        for w in WORDS {
            assert_eq!(count_tokens(w), 1, "{w:?}");
        }
        let text: String = (0..50).map(|i| filler_word(1, 2, i)).collect();
        assert_eq!(count_tokens(&text), 50);
    }

    #[test]
    fn same_prompt_same_answer_other_prompt_other_answer() {
        let a: Vec<_> = (0..20).map(|i| filler_word(7, 11, i)).collect();
        let b: Vec<_> = (0..20).map(|i| filler_word(7, 11, i)).collect();
        let c: Vec<_> = (0..20).map(|i| filler_word(7, 12, i)).collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_ne!(prompt_hash(&[1, 2]), prompt_hash(&[2, 1]));
    }
}

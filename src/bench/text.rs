//! Deterministic prompt text of an exact token length.
//!
//! Every piece of generated text is a run of pseudo-words, each a space and
//! two to five lowercase letters. Under [`crate::tokenize::stand_in`] such a word is
//! exactly one token, and because every word starts with a space, joining two
//! generated texts joins their token lists: `tokens(a + b) == tokens(a) ++
//! tokens(b)`. That makes lengths exact and prefixes shared at token level.
//!
//! A *block* starts with a tag word naming its id (base 26, injective for ids
//! below 26^5, then one more tag word per further 26^5 factor), so two blocks
//! with different ids differ from their very first token, and then continues
//! with words drawn from a SplitMix64 stream seeded by the id.
//!
//! Cost: linear in the number of words, one allocation at most.

/// SplitMix64: a tiny, well-mixed 64-bit generator used for text, where the
/// words only need to look varied, not to be statistically strong.
#[derive(Clone, Debug)]
pub struct SplitMix(u64);

impl SplitMix {
    pub fn new(seed: u64) -> Self {
        SplitMix(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Mixes two values into one seed (order matters).
pub fn mix(a: u64, b: u64) -> u64 {
    SplitMix::new(a ^ b.rotate_left(32).wrapping_mul(0x2545_f491_4f6c_dd1d)).next_u64()
}

const LETTERS: &[u8; 26] = b"abcdefghijklmnopqrstuvwxyz";
const TAG_RADIX: u64 = 26 * 26 * 26 * 26 * 26;

/// Appends `n` pseudo-words (exactly `n` tokens) drawn from `seed`.
pub fn push_words(out: &mut String, seed: u64, n: usize) {
    let mut rng = SplitMix::new(seed);
    out.reserve(n * 5);
    for _ in 0..n {
        let mut x = rng.next_u64();
        let len = 2 + (x % 4) as usize;
        x /= 4;
        out.push(' ');
        for _ in 0..len {
            out.push(LETTERS[(x % 26) as usize] as char);
            x /= 26;
        }
    }
}

/// `n` pseudo-words drawn from `seed`, as a new string.
pub fn words(seed: u64, n: usize) -> String {
    let mut s = String::new();
    push_words(&mut s, seed, n);
    s
}

/// The tag words that open block `id`: one token per 26^5 factor.
fn push_tag(out: &mut String, mut id: u64) -> usize {
    let mut tokens = 0;
    loop {
        let mut digit = id % TAG_RADIX;
        out.push(' ');
        for _ in 0..5 {
            out.push(LETTERS[(digit % 26) as usize] as char);
            digit /= 26;
        }
        tokens += 1;
        id /= TAG_RADIX;
        if id == 0 {
            return tokens;
        }
    }
}

/// Appends the first `take` tokens of block `id`, a block of `block_tokens`
/// tokens (`take <= block_tokens`). Any prefix of a block is a token prefix of
/// the whole block, so a trimmed last block still shares what it keeps.
pub fn push_block(out: &mut String, id: u64, block_tokens: usize, take: usize) {
    let take = take.min(block_tokens);
    if take == 0 {
        return;
    }
    let mut tag = String::new();
    let tag_tokens = push_tag(&mut tag, id);
    if tag_tokens >= take {
        // Only possible for tiny blocks; keep the first `take` tag words.
        let cut = tag
            .match_indices(' ')
            .nth(take)
            .map_or(tag.len(), |(i, _)| i);
        out.push_str(&tag[..cut]);
        return;
    }
    out.push_str(&tag);
    push_words(out, mix(id, 0x0062_6c6f_636b), take - tag_tokens);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::stand_in::{count_tokens, tokenize};

    #[test]
    fn every_word_is_one_token() {
        for n in [0, 1, 2, 17, 512, 3000] {
            assert_eq!(count_tokens(&words(7, n)), n);
        }
    }

    #[test]
    fn joined_text_joins_tokens() {
        let a = words(1, 40);
        let b = words(2, 25);
        let mut ab = a.clone();
        ab.push_str(&b);
        let mut expected = tokenize(&a);
        expected.extend(tokenize(&b));
        assert_eq!(tokenize(&ab), expected);
    }

    #[test]
    fn blocks_have_exact_length_and_distinct_first_tokens() {
        let mut seen = std::collections::HashSet::new();
        for id in [0u64, 1, 25, 26, 182_789, TAG_RADIX - 1, TAG_RADIX, u64::MAX] {
            let mut s = String::new();
            push_block(&mut s, id, 64, 64);
            assert_eq!(count_tokens(&s), 64, "block {id}");
            assert!(seen.insert(tokenize(&s)[..tokenize(&s).len().min(3)].to_vec()));
        }
    }

    #[test]
    fn trimmed_block_is_a_prefix_of_the_full_block() {
        let (mut full, mut part) = (String::new(), String::new());
        push_block(&mut full, 42, 512, 512);
        push_block(&mut part, 42, 512, 100);
        assert!(full.starts_with(&part));
        assert_eq!(count_tokens(&part), 100);
        let mut tiny = String::new();
        push_block(&mut tiny, u64::MAX, 2, 1);
        assert_eq!(count_tokens(&tiny), 1);
    }

    #[test]
    fn same_seed_same_text() {
        assert_eq!(words(9, 100), words(9, 100));
        assert_ne!(words(9, 100), words(10, 100));
    }
}

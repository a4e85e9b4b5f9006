//! A deterministic, prefix-stable stand-in for a model tokenizer.
//!
//! llmlb never needs a model's real vocabulary: the simulator, the load
//! generator and the prefix router need token *counts* that look like a real
//! tokenizer's (4 to 5 bytes of English prose per token) and token *identities*
//! that are equal exactly when the text is equal, so prefix caching behaves
//! as it does on a replica.
//!
//! Rules, applied left to right:
//! - a run of whitespace (at most 6 bytes) starts a piece, and takes the word
//!   that follows it into the same piece until the piece holds 6 bytes;
//! - a word (letters, digits, `_`) is cut into pieces of at most 6 bytes, on
//!   character boundaries;
//! - a newline, and any other character, is a piece by itself (so a text
//!   that ends in a newline always ends at a piece boundary).
//!
//! Each piece's id is a 64-bit FNV-1a hash of its bytes folded into
//! [`VOCAB_SIZE`]. Because pieces are cut greedily from the left, the tokens
//! of a text that starts with `p` start with the tokens of `p` whenever `p`
//! ends at a piece boundary (for example after a newline or punctuation), which
//! is what makes a shared system prompt a shared token prefix.
//!
//! Cost: one pass over the bytes, no allocation besides the output.

/// Longest piece in bytes (a piece may end earlier at a class change).
const MAX_PIECE: usize = 6;

/// Size of the id space token ids are folded into.
pub const VOCAB_SIZE: u32 = 1 << 17;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Space,
    Word,
    Other,
}

fn class(c: char) -> Class {
    if c == '\n' {
        Class::Other
    } else if c.is_whitespace() {
        Class::Space
    } else if c.is_alphanumeric() || c == '_' {
        Class::Word
    } else {
        Class::Other
    }
}

/// Splits `text` into token pieces (see the module docs for the rules).
pub fn pieces(text: &str) -> Pieces<'_> {
    Pieces { text, pos: 0 }
}

pub struct Pieces<'a> {
    text: &'a str,
    pos: usize,
}

impl<'a> Iterator for Pieces<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let rest = &self.text[self.pos..];
        let mut chars = rest.char_indices().peekable();
        let (_, first) = chars.next()?;
        let mut end = first.len_utf8();
        match class(first) {
            Class::Other => {}
            Class::Space => {
                while let Some(&(i, c)) = chars.peek() {
                    if class(c) != Class::Space || i + c.len_utf8() > MAX_PIECE {
                        break;
                    }
                    end = i + c.len_utf8();
                    chars.next();
                }
                while let Some(&(i, c)) = chars.peek() {
                    if class(c) != Class::Word || end >= MAX_PIECE {
                        break;
                    }
                    end = i + c.len_utf8();
                    chars.next();
                }
            }
            Class::Word => {
                while let Some(&(i, c)) = chars.peek() {
                    if class(c) != Class::Word || end >= MAX_PIECE {
                        break;
                    }
                    end = i + c.len_utf8();
                    chars.next();
                }
            }
        }
        self.pos += end;
        Some(&rest[..end])
    }
}

/// The id of one piece.
pub fn piece_id(piece: &str) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in piece.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % u64::from(VOCAB_SIZE)) as u32
}

/// Token ids of `text`.
pub fn tokenize(text: &str) -> Vec<u32> {
    let mut out = Vec::with_capacity(text.len() / 3 + 1);
    out.extend(pieces(text).map(piece_id));
    out
}

/// Number of tokens in `text`, without building the ids.
pub fn count_tokens(text: &str) -> usize {
    pieces(text).count()
}

/// Renders chat messages into one prompt with a fixed role template, the way a
/// model's chat template does, so equal leading messages give equal leading
/// tokens. Ends with the assistant header that generation continues from.
pub fn render_chat<'a>(messages: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut out = String::new();
    for (role, content) in messages {
        out.push_str("<|");
        out.push_str(role);
        out.push_str("|>\n");
        out.push_str(content);
        out.push_str("\n<|end|>\n");
    }
    out.push_str("<|assistant|>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_follow_the_rules() {
        let p: Vec<&str> = pieces("Hello, wonderful world!\n").collect();
        assert_eq!(p, vec!["Hello", ",", " wonde", "rful", " world", "!", "\n"]);
    }

    #[test]
    fn pieces_cover_the_text_exactly() {
        for text in [
            "",
            "a",
            "  spaced   out  ",
            "naïve café — ünïcødé",
            "x\t\ty\r\n",
        ] {
            assert_eq!(pieces(text).collect::<String>(), text);
        }
    }

    #[test]
    fn prefix_stable_at_boundaries() {
        let system = "You are a helpful assistant. Answer briefly.\n";
        let a = tokenize(&format!("{system}What is Rust?"));
        let b = tokenize(&format!("{system}Name three rivers."));
        let s = tokenize(system);
        assert_eq!(&a[..s.len()], &s[..]);
        assert_eq!(&b[..s.len()], &s[..]);
        assert_ne!(a, b);
    }

    #[test]
    fn four_to_five_bytes_per_token_on_prose() {
        let text =
            "The quick brown fox jumps over the lazy dog near the river bank today. ".repeat(20);
        let ratio = text.len() as f64 / count_tokens(&text) as f64;
        assert!((4.0..=5.0).contains(&ratio), "{ratio}");
    }

    #[test]
    fn chat_template_shares_system_prefix() {
        let a = render_chat([("system", "Be terse."), ("user", "hi")]);
        let b = render_chat([("system", "Be terse."), ("user", "bye")]);
        let sys = render_chat([("system", "Be terse.")]);
        let shared = sys.trim_end_matches("<|assistant|>\n");
        assert!(a.starts_with(shared) && b.starts_with(shared));
        let t = tokenize(shared);
        assert_eq!(&tokenize(&a)[..t.len()], &t[..]);
    }
}

//! A tolerant reader of the Prometheus text exposition format.
//!
//! Samples are found by metric name and labels, never by line position:
//! replicas with several API server processes print lines in varying order,
//! and vLLM emits one series per engine core (`engine="0"`, `"1"`, ...) that
//! must be summed. `# HELP`/`# TYPE` lines, blank lines, histogram series and
//! anything malformed are skipped line by line; values may be `NaN`, `+Inf`,
//! `-Inf` or use exponents (`1.756e+09`); an optional timestamp is ignored.
//!
//! Cost: one pass over the text, no allocation per line (label values are
//! unescaped only when asked for). Never panics, whatever the input.

/// One sample line: `name{labels} value [timestamp]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample<'a> {
    pub name: &'a str,
    /// The raw text between the braces (empty when there are none).
    raw_labels: &'a str,
    pub value: f64,
}

impl<'a> Sample<'a> {
    /// The unescaped value of label `key`, when present.
    pub fn label(&self, key: &str) -> Option<String> {
        Labels {
            rest: self.raw_labels,
        }
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
    }
}

/// Every well-formed sample in `text`, in order of appearance.
pub fn samples(text: &str) -> impl Iterator<Item = Sample<'_>> {
    text.lines().filter_map(parse_line)
}

/// Sum of the finite values of every series named `name`, whatever its
/// labels; `None` when no series has a finite value.
pub fn sum(text: &str, name: &str) -> Option<f64> {
    fold_finite(text, name).map(|(s, _)| s)
}

/// Mean of the finite values of every series named `name`; `None` when none.
pub fn mean(text: &str, name: &str) -> Option<f64> {
    fold_finite(text, name).map(|(s, n)| s / n as f64)
}

fn fold_finite(text: &str, name: &str) -> Option<(f64, usize)> {
    let mut acc: Option<(f64, usize)> = None;
    for s in samples(text).filter(|s| s.name == name && s.value.is_finite()) {
        let (sum, n) = acc.unwrap_or((0.0, 0));
        acc = Some((sum + s.value, n + 1));
    }
    acc
}

fn parse_line(line: &str) -> Option<Sample<'_>> {
    let line = line.trim_start();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line
        .find(|c: char| c == '{' || c.is_ascii_whitespace())
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() {
        return None;
    }
    let mut rest = &line[name_end..];
    let mut raw_labels = "";
    if rest.starts_with('{') {
        let close = closing_brace(rest)?;
        raw_labels = &rest[1..close];
        rest = &rest[close + 1..];
    }
    let value = parse_value(rest.split_ascii_whitespace().next()?)?;
    Some(Sample {
        name,
        raw_labels,
        value,
    })
}

/// Byte index of the `}` closing the label set that starts at `s[0] == '{'`,
/// skipping braces inside quoted values.
fn closing_brace(s: &str) -> Option<usize> {
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, c) in s.char_indices().skip(1) {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_quotes => escaped = true,
            '"' => in_quotes = !in_quotes,
            '}' if !in_quotes => return Some(i),
            _ => {}
        }
    }
    None
}

/// A sample value: a Go-style float, `NaN`, `+Inf` or `-Inf`.
pub fn parse_value(token: &str) -> Option<f64> {
    match token {
        "NaN" | "nan" => Some(f64::NAN),
        "+Inf" | "Inf" | "+inf" | "inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        t if t
            .bytes()
            .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) =>
        {
            t.parse().ok()
        }
        _ => None,
    }
}

/// Iterator over `key="value"` pairs of a raw label set.
struct Labels<'a> {
    rest: &'a str,
}

impl<'a> Iterator for Labels<'a> {
    type Item = (&'a str, String);

    fn next(&mut self) -> Option<Self::Item> {
        let s = self
            .rest
            .trim_start_matches(|c: char| c == ',' || c.is_whitespace());
        let eq = s.find('=')?;
        let key = s[..eq].trim();
        let after = s[eq + 1..].trim_start();
        let body = after.strip_prefix('"')?;
        let mut value = String::new();
        let mut chars = body.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    self.rest = &body[i + 1..];
                    return Some((key, value));
                }
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => break,
                },
                c => value.push(c),
            }
        }
        self.rest = "";
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_name_labels_and_value() {
        let s =
            parse_line(r#"vllm:x{engine="0",model_name="a \"b\" {c}"} 8.0 1700000000"#).unwrap();
        assert_eq!(s.name, "vllm:x");
        assert_eq!(s.value, 8.0);
        assert_eq!(s.label("engine").as_deref(), Some("0"));
        assert_eq!(s.label("model_name").as_deref(), Some("a \"b\" {c}"));
        assert_eq!(s.label("missing"), None);
    }

    #[test]
    fn special_values() {
        assert!(parse_value("NaN").unwrap().is_nan());
        assert_eq!(parse_value("+Inf"), Some(f64::INFINITY));
        assert_eq!(parse_value("-Inf"), Some(f64::NEG_INFINITY));
        assert_eq!(parse_value("1.756e+09"), Some(1.756e9));
        assert_eq!(parse_value("3"), Some(3.0));
        assert_eq!(parse_value("infinity-ish"), None);
        assert_eq!(parse_value("0x10"), None);
    }

    #[test]
    fn sums_over_engines_and_skips_non_finite() {
        let text =
            "a{engine=\"0\"} 2\n# TYPE a gauge\na{engine=\"1\"} 3.5\na{engine=\"2\"} NaN\nab 100\n";
        assert_eq!(sum(text, "a"), Some(5.5));
        assert_eq!(mean(text, "a"), Some(2.75));
        assert_eq!(sum(text, "b"), None);
        assert_eq!(sum("a NaN\n", "a"), None);
    }

    #[test]
    fn skips_malformed_lines() {
        let text = "good 1\n{nolabelname} 2\nbad{x=\"1\" 3\nnovalue\nworse{x=\"1\"} abc\ngood 2\n";
        assert_eq!(sum(text, "good"), Some(3.0));
        assert_eq!(samples(text).count(), 2);
    }
}

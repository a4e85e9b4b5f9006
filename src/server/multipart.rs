//! Reading one text field out of a `multipart/form-data` body (the audio
//! endpoints send the `model` as a form field beside the file). Only what
//! routing needs: no streaming, no nested multiparts, no charsets; the body
//! is forwarded unchanged.

/// The `boundary` parameter of a `multipart/form-data` content type.
pub fn boundary(content_type: &str) -> Option<&str> {
    // Every request's content type is looked at, and almost none is a
    // multipart one: its first letter says so without splitting it.
    let first = content_type.trim_start().as_bytes().first();
    if !first.is_some_and(|b| b.eq_ignore_ascii_case(&b'm')) {
        return None;
    }
    parsed_boundary(content_type)
}

/// [`boundary`] read from the whole content type.
fn parsed_boundary(content_type: &str) -> Option<&str> {
    let mut parts = content_type.split(';');
    let kind = parts.next()?.trim();
    if !kind.eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    parts.find_map(|p| {
        let (k, v) = p.split_once('=')?;
        k.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| v.trim().trim_matches('"'))
            .filter(|b| !b.is_empty())
    })
}

/// The value of the form field `name`, when the body has one (as UTF-8;
/// `None` for a field that is not text).
pub fn field(body: &[u8], boundary: &str, name: &str) -> Option<String> {
    let delimiter = format!("--{boundary}");
    let delimiter = delimiter.as_bytes();
    let mut rest = body;
    let mut at = find(rest, delimiter)?;
    loop {
        rest = &rest[at + delimiter.len()..];
        if rest.starts_with(b"--") {
            return None;
        }
        rest = rest.strip_prefix(b"\r\n").unwrap_or(rest);
        let head_end = find(rest, b"\r\n\r\n")?;
        let head = std::str::from_utf8(&rest[..head_end]).ok()?;
        let content = &rest[head_end + 4..];
        let next = find(content, delimiter)?;
        if disposition_name(head) == Some(name) {
            let value = &content[..next];
            let value = value.strip_suffix(b"\r\n").unwrap_or(value);
            return std::str::from_utf8(value).ok().map(str::to_owned);
        }
        rest = &content[next..];
        at = 0;
    }
}

/// The `name` of a part's `Content-Disposition: form-data; name="..."`.
fn disposition_name(head: &str) -> Option<&str> {
    let line = head.lines().find(|l| {
        l.split_once(':')
            .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case("content-disposition"))
    })?;
    line.split(';').find_map(|p| {
        let (k, v) = p.split_once('=')?;
        (k.trim() == "name").then(|| v.trim().trim_matches('"'))
    })
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BODY: &[u8] = b"--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\nRIFF\x00\x01--X\r\n--XyZ\r\ncontent-disposition: form-data; name=\"model\"\r\n\r\nwhisper-large\r\n--XyZ--\r\n";

    /// The look at the first letter decides only what the whole reading
    /// would decide.
    #[test]
    fn the_first_letter_turns_away_only_what_the_parse_would() {
        for t in [
            "",
            " ",
            "application/json",
            "application/json; charset=utf-8",
            "multipart/form-data; boundary=b",
            "MULTIPART/FORM-DATA;boundary=\"q\"",
            "  multipart/form-data ; boundary = x ",
            "\u{2003}\tmultipart/form-data; boundary=u",
            "\u{2003}application/json",
            "multipart/mixed; boundary=m",
            "m",
            "Multipart/form-data",
            ";boundary=x",
        ] {
            assert_eq!(boundary(t), parsed_boundary(t), "{t:?}");
        }
    }

    #[test]
    fn finds_the_model_field_after_a_binary_part() {
        assert_eq!(
            boundary("multipart/form-data; boundary=\"XyZ\""),
            Some("XyZ")
        );
        assert_eq!(boundary("application/json"), None);
        assert_eq!(
            field(BODY, "XyZ", "model").as_deref(),
            Some("whisper-large")
        );
        assert_eq!(field(BODY, "XyZ", "language"), None);
        assert_eq!(field(b"garbage", "XyZ", "model"), None);
    }
}

//! A log line written straight into the log's buffer, for the one line
//! written on every request (the access log).
//!
//! `tracing`'s formatter visits an event's fields through trait objects,
//! quotes each string through `Debug`, and formats the line into a buffer
//! of its own before handing it to the writer. [`write()`] writes the same
//! bytes, the same timestamp, level, target, message and fields in the same
//! order (text or JSON, as `--log-format` chose), into one reused buffer per
//! thread, and appends it to the batched log ([`super::logging`]). It is
//! used only when llmlb's own subscriber is installed and writes without
//! colours (`ansi` is for a terminal); otherwise it returns `false` and the
//! caller logs through `tracing`. The caller checks `tracing::enabled!`
//! first, so `RUST_LOG` filters the line as before. A unit test holds the
//! two paths to the same bytes.
//!
//! Cost: one clock read (the date and time of day formatted once a second
//! per thread, the microseconds on every line), the fields written in place,
//! one copy into the shared buffer under its lock; no allocation once the
//! thread's buffer has grown to a line's size.

use std::cell::RefCell;
use std::fmt::{self, Write as _};
use std::net::SocketAddr;
use std::sync::OnceLock;

use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};

use super::logging::{Lines, LogFormat};

/// Where direct lines go: set once by `init_logging` when its subscriber
/// is installed and writes without colours.
static DIRECT: OnceLock<(LogFormat, Lines)> = OnceLock::new();

pub(super) fn install(format: LogFormat, lines: Lines) {
    let _ = DIRECT.set((format, lines));
}

thread_local! {
    static BUFFER: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Writes one `INFO` line with `target` and `message`, its fields written
/// by `fields`, as `tracing`'s formatter would; `false` (nothing written)
/// when llmlb's plain subscriber is not the one installed.
pub fn write(target: &str, message: &str, fields: impl FnOnce(&mut Line<'_>)) -> bool {
    let Some((format, lines)) = DIRECT.get() else {
        return false;
    };
    BUFFER.with(|b| {
        // A line logged while this thread formats another (not done by the
        // access log) gets a buffer of its own.
        let mut own = Vec::new();
        let mut borrowed = b.try_borrow_mut();
        let buf = borrowed.as_deref_mut().unwrap_or(&mut own);
        buf.clear();
        format_line(buf, *format, target, message, fields);
        lines.append_line(buf);
    });
    true
}

/// The line into `buf`, in `format`.
fn format_line(
    buf: &mut Vec<u8>,
    format: LogFormat,
    target: &str,
    message: &str,
    fields: impl FnOnce(&mut Line<'_>),
) {
    let mut line = Line::start(buf, format, target, message);
    fields(&mut line);
    line.end(target);
}

/// A field's name as each format writes it before the value: ` name=`
/// (text) and `,"name":` (JSON). Made at compile time by [`log_key!`],
/// which also checks that the name is an identifier (what `tracing`
/// takes, written in JSON between quotes as it is).
pub struct Key<const T: usize, const J: usize> {
    text: [u8; T],
    json: [u8; J],
}

impl<const T: usize, const J: usize> Key<T, J> {
    /// The key of `name`; `T` and `J` are its length plus 2 and plus 4.
    pub const fn new(name: &str) -> Self {
        let n = name.as_bytes();
        assert!(T == n.len() + 2 && J == n.len() + 4, "key lengths");
        let (mut text, mut json) = ([0; T], [0; J]);
        (text[0], text[T - 1]) = (b' ', b'=');
        (json[0], json[1], json[J - 2], json[J - 1]) = (b',', b'"', b'"', b':');
        let mut i = 0;
        while i < n.len() {
            assert!(
                n[i].is_ascii_alphanumeric() || n[i] == b'_',
                "a field name is an identifier"
            );
            (text[i + 1], json[i + 2]) = (n[i], n[i]);
            i += 1;
        }
        Key { text, json }
    }
}

/// The [`Key`] of a field name, made at compile time: `log_key!("status")`.
macro_rules! log_key {
    ($name:literal) => {{
        const KEY: $crate::telemetry::log_line::Key<{ $name.len() + 2 }, { $name.len() + 4 }> =
            $crate::telemetry::log_line::Key::new($name);
        &KEY
    }};
}
pub(crate) use log_key;

/// One line being written: add fields in the order the event declares
/// them; a `None` value is left out, as `tracing` leaves it out.
pub struct Line<'a> {
    buf: &'a mut Vec<u8>,
    format: LogFormat,
}

impl<'a> Line<'a> {
    fn start(buf: &'a mut Vec<u8>, format: LogFormat, target: &str, message: &str) -> Self {
        let now = std::time::SystemTime::now();
        match format {
            LogFormat::Text => {
                write_time(buf, now);
                buf.extend_from_slice(b"  INFO ");
                buf.extend_from_slice(target.as_bytes());
                buf.extend_from_slice(b": ");
                buf.extend_from_slice(message.as_bytes());
            }
            LogFormat::Json => {
                buf.extend_from_slice(b"{\"timestamp\":\"");
                write_time(buf, now);
                buf.push(b'"');
                buf.extend_from_slice(b",\"level\":\"INFO\",\"message\":");
                json_str(buf, message);
            }
        }
        Line { buf, format }
    }

    fn end(self, target: &str) {
        if self.format == LogFormat::Json {
            self.buf.extend_from_slice(b",\"target\":");
            json_str(self.buf, target);
            self.buf.push(b'}');
        }
        self.buf.push(b'\n');
    }

    /// A field's name and what goes before its value, as made at compile
    /// time ([`log_key!`]): one copy of known length.
    #[inline]
    fn key<const T: usize, const J: usize>(&mut self, key: &Key<T, J>) {
        match self.format {
            LogFormat::Text => self.buf.extend_from_slice(&key.text),
            LogFormat::Json => self.buf.extend_from_slice(&key.json),
        }
    }

    /// A string field: quoted as `Debug` quotes it (text) or as a JSON string.
    pub fn str<const T: usize, const J: usize>(&mut self, name: &Key<T, J>, value: Option<&str>) {
        let Some(v) = value else { return };
        self.key(name);
        match self.format {
            LogFormat::Text => debug_str(self.buf, v),
            LogFormat::Json => json_str(self.buf, v),
        }
    }

    /// A string field known [`is_plain`] when `plain` (a name the config
    /// fixed and checked once, a text llmlb made): copied between quotes
    /// without looking at its characters, in text and JSON alike (both
    /// quote such a string as it is); otherwise as [`Self::str`] writes it.
    pub fn text<const T: usize, const J: usize>(
        &mut self,
        name: &Key<T, J>,
        value: Option<&str>,
        plain: bool,
    ) {
        let Some(v) = value else { return };
        if !plain {
            return self.str(name, value);
        }
        debug_assert!(is_plain(v), "{v:?} is not plain");
        self.key(name);
        self.buf.reserve(v.len() + 2);
        self.buf.push(b'"');
        self.buf.extend_from_slice(v.as_bytes());
        self.buf.push(b'"');
    }

    /// A socket address as a quoted string, as `Display` writes it (its
    /// characters never need quoting). An IPv4 address is written digit by
    /// digit (`Display` goes through the formatting machinery, about 1.3 k
    /// instructions); IPv6 through `Display`.
    pub fn addr<const T: usize, const J: usize>(
        &mut self,
        name: &Key<T, J>,
        value: Option<SocketAddr>,
    ) {
        let Some(addr) = value else { return };
        self.key(name);
        self.buf.push(b'"');
        match addr {
            SocketAddr::V4(v4) => {
                write_ip((*v4.ip()).into(), self.buf);
                self.buf.push(b':');
                self.buf
                    .extend_from_slice(itoa::Buffer::new().format(v4.port()).as_bytes());
            }
            SocketAddr::V6(_) => {
                let _ = write!(Bytes(self.buf), "{addr}");
            }
        }
        self.buf.push(b'"');
    }

    pub fn u64<const T: usize, const J: usize>(&mut self, name: &Key<T, J>, value: Option<u64>) {
        let Some(v) = value else { return };
        self.key(name);
        self.buf
            .extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
    }

    pub fn bool<const T: usize, const J: usize>(&mut self, name: &Key<T, J>, value: Option<bool>) {
        let Some(v) = value else { return };
        self.key(name);
        self.buf
            .extend_from_slice(if v { b"true" as &[u8] } else { b"false" });
    }

    /// A float: `Debug` in text (`12.0`), serde_json's form in JSON (the
    /// same for finite values; JSON writes a non-finite one as `null`).
    pub fn f64<const T: usize, const J: usize>(&mut self, name: &Key<T, J>, value: Option<f64>) {
        let Some(v) = value else { return };
        self.key(name);
        match self.format {
            LogFormat::Text => debug_f64(self.buf, v),
            LogFormat::Json => {
                let _ = serde_json::to_writer(&mut *self.buf, &v);
            }
        }
    }
    /// Milliseconds in whole hundredths (`Some(n)`: `n / 100` ms), written
    /// as [`Self::f64`] writes the float `n as f64 / 100.0`; in text from
    /// the integer's digits, without the float's round trip.
    pub fn hundredths<const T: usize, const J: usize>(
        &mut self,
        name: &Key<T, J>,
        value: Option<u64>,
    ) {
        let Some(n) = value else { return };
        self.key(name);
        match self.format {
            LogFormat::Text if n < HUNDREDTHS_BOUND => write_hundredths(self.buf, n),
            LogFormat::Text => debug_f64(self.buf, n as f64 / 100.0),
            LogFormat::Json => {
                let _ = serde_json::to_writer(&mut *self.buf, &(n as f64 / 100.0));
            }
        }
    }
}

/// A number of hundredths below this is written from its digits (see
/// [`debug_f64`]).
const HUNDREDTHS_BOUND: u64 = 1_000_000_000_000_000;

/// `n / 100` as `Debug` writes the float nearest to it, for `n` below
/// [`HUNDREDTHS_BOUND`]: the whole part, a point, the hundredths with a
/// trailing zero cut (`12.5`, `12.05`, `0.0`).
fn write_hundredths(buf: &mut Vec<u8>, n: u64) {
    buf.extend_from_slice(itoa::Buffer::new().format(n / 100).as_bytes());
    let (tens, ones) = ((n / 10 % 10) as u8, (n % 10) as u8);
    buf.extend_from_slice(&[b'.', b'0' + tens]);
    if ones != 0 {
        buf.push(b'0' + ones);
    }
}

/// `{:?}` of a float. A value that is a number of hundredths (the access
/// log rounds its milliseconds to two decimals) below 1e13 is written from
/// that integer: the float nearest to such a decimal is printed by `Debug`
/// as that decimal (15 digits or fewer: no other decimal as short is the
/// same float), its trailing zeros cut, at least one decimal kept. Any
/// other value goes through `Debug` (about 700 instructions).
fn debug_f64(buf: &mut Vec<u8>, v: f64) {
    let hundredths = (v.abs() * 100.0).round();
    if v != 0.0 && hundredths < 1e15 && hundredths / 100.0 == v.abs() {
        if v < 0.0 {
            buf.push(b'-');
        }
        write_hundredths(buf, hundredths as u64);
    } else {
        let _ = write!(Bytes(buf), "{v:?}");
    }
}

/// The part of `tracing`'s timestamp (`2026-12-03T21:24:27.123456Z`: RFC
/// 3339, UTC, microseconds) up to the whole second.
const SECOND_LEN: usize = 19;

thread_local! {
    /// The last whole second this thread formatted, since the Unix epoch:
    /// lines of the same second copy it and write only the microseconds.
    static SECOND: std::cell::Cell<(u64, [u8; SECOND_LEN])> =
        const { std::cell::Cell::new((u64::MAX, [0; SECOND_LEN])) };
}

/// Appends `now` as `tracing`'s `SystemTime` timer writes it. The date and
/// time of day are formatted once a second per thread, the microseconds
/// on every line; a time that form does not cover (before 1970, after
/// 9999) goes through `tracing`'s own formatter. Its characters never need
/// quoting in JSON.
fn write_time(buf: &mut Vec<u8>, now: std::time::SystemTime) {
    let Ok(since) = now.duration_since(std::time::UNIX_EPOCH) else {
        return traced_time(buf);
    };
    let secs = since.as_secs();
    let (cached, mut second) = SECOND.get();
    if cached != secs {
        let text = humantime::format_rfc3339_seconds(now).to_string();
        match text.as_bytes().get(..SECOND_LEN) {
            Some(prefix) if text.len() == SECOND_LEN + 1 => second.copy_from_slice(prefix),
            _ => return traced_time(buf),
        }
        SECOND.set((secs, second));
    }
    let mut fraction = *b".000000Z";
    let mut micros = since.subsec_micros();
    for digit in fraction[1..7].iter_mut().rev() {
        *digit = b'0' + (micros % 10) as u8;
        micros /= 10;
    }
    buf.extend_from_slice(&second);
    buf.extend_from_slice(&fraction);
}

/// The current time through `tracing`'s formatter.
fn traced_time(buf: &mut Vec<u8>) {
    let mut time = String::with_capacity(32);
    let _ = SystemTime.format_time(&mut Writer::new(&mut time));
    buf.extend_from_slice(time.as_bytes());
}

/// Appends `ip` as text (the access line's client, `X-Forwarded-For`). An IPv4 address is
/// written digit by digit: `Display` goes through the formatting machinery
/// and cost about 1.3 k instructions a request. IPv6 goes through `Display`.
pub fn write_ip(ip: std::net::IpAddr, out: &mut Vec<u8>) {
    match ip {
        std::net::IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                if octet >= 100 {
                    out.push(b'0' + octet / 100);
                }
                if octet >= 10 {
                    out.push(b'0' + octet / 10 % 10);
                }
                out.push(b'0' + octet % 10);
            }
        }
        std::net::IpAddr::V6(v6) => {
            use std::io::Write;
            let _ = write!(out, "{v6}");
        }
    }
}

/// `fmt::Write` into a byte buffer.
struct Bytes<'a>(&'a mut Vec<u8>);

impl fmt::Write for Bytes<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// Whether `s` is printable ASCII without `"` or `\\`: what `Debug` and a
/// JSON string both write between quotes as it is.
pub fn is_plain(s: &str) -> bool {
    // A fold without an early exit: the compiler checks many bytes at once.
    s.bytes().fold(true, |plain, b| {
        plain & (b' '..=b'~').contains(&b) & (b != b'"') & (b != b'\\')
    })
}

/// `{:?}` of a string: a [plain](is_plain) one is copied between quotes,
/// anything else goes through `Debug`.
fn debug_str(buf: &mut Vec<u8>, s: &str) {
    if is_plain(s) {
        buf.push(b'"');
        buf.extend_from_slice(s.as_bytes());
        buf.push(b'"');
    } else {
        let _ = write!(Bytes(buf), "{s:?}");
    }
}

fn json_str(buf: &mut Vec<u8>, s: &str) {
    let _ = serde_json::to_writer(&mut *buf, s);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What `tracing`'s formatter writes, set up as `init_logging` sets it.
    fn traced(format: LogFormat, event: impl FnOnce()) -> String {
        let sink = Sink::default();
        let out = sink.clone();
        let builder = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || out.clone());
        match format {
            LogFormat::Text => tracing::subscriber::with_default(builder.finish(), event),
            LogFormat::Json => tracing::subscriber::with_default(
                builder.json().flatten_event(true).finish(),
                event,
            ),
        }
        let bytes = sink.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    fn direct(format: LogFormat, fields: impl FnOnce(&mut Line<'_>)) -> String {
        let mut buf = Vec::new();
        format_line(&mut buf, format, "llmlb::access", "request", fields);
        String::from_utf8(buf).unwrap()
    }

    /// The timestamps differ by when each line was made.
    fn without_time(line: &str) -> String {
        let at = line.find("Z").expect("a timestamp");
        assert!(at >= 26, "{line}");
        format!("{}{}", &line[..at - 26], &line[at + 1..])
    }

    #[derive(Clone, Copy)]
    struct Case<'a> {
        id: Option<&'a str>,
        client: Option<SocketAddr>,
        stream: Option<bool>,
        status: Option<u16>,
        ms: Option<f64>,
        message: Option<&'a str>,
    }

    /// Every field absent.
    const EMPTY: Case<'static> = Case {
        id: None,
        client: None,
        stream: None,
        status: None,
        ms: None,
        message: None,
    };

    fn same_bytes(c: Case<'_>) {
        for format in [LogFormat::Text, LogFormat::Json] {
            let traced = traced(format, || {
                tracing::info!(
                    target: "llmlb::access",
                    request_id = c.id,
                    client = c.client.map(|c| c.to_string()).as_deref(),
                    stream = c.stream,
                    status = c.status,
                    ttft_ms = c.ms,
                    prompt_tokens = c.status.map(|s| u64::from(s) * 1000),
                    error_message = c.message,
                    "request"
                )
            });
            let direct = direct(format, |l| {
                l.str(log_key!("request_id"), c.id);
                l.addr(log_key!("client"), c.client);
                l.bool(log_key!("stream"), c.stream);
                l.u64(log_key!("status"), c.status.map(u64::from));
                l.f64(log_key!("ttft_ms"), c.ms);
                l.u64(
                    log_key!("prompt_tokens"),
                    c.status.map(|s| u64::from(s) * 1000),
                );
                l.str(log_key!("error_message"), c.message);
            });
            assert_eq!(without_time(&direct), without_time(&traced), "{format:?}");
        }
    }

    fn time(secs: u64, micros: u32) -> String {
        let at = std::time::UNIX_EPOCH
            + std::time::Duration::from_secs(secs)
            + std::time::Duration::from_micros(u64::from(micros));
        let mut buf = Vec::new();
        write_time(&mut buf, at);
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn the_timestamp_is_written_as_tracing_writes_it() {
        assert_eq!(time(0, 0), "1970-01-01T00:00:00.000000Z");
        // The second is kept from the line before; the fraction is not.
        assert_eq!(time(951_782_400, 500_000), "2000-02-29T00:00:00.500000Z");
        assert_eq!(time(951_782_400, 7), "2000-02-29T00:00:00.000007Z");
        assert_eq!(time(951_782_401, 999_999), "2000-02-29T00:00:01.999999Z");
        assert_eq!(time(4_102_444_799, 123_456), "2099-12-31T23:59:59.123456Z");
        // Now, against tracing's own timer (again if a second began between).
        for _ in 0..3 {
            let mut ours = Vec::new();
            write_time(&mut ours, std::time::SystemTime::now());
            let mut theirs = String::new();
            SystemTime
                .format_time(&mut Writer::new(&mut theirs))
                .unwrap();
            let ours = String::from_utf8(ours).unwrap();
            assert_eq!(ours.len(), theirs.len(), "{ours} {theirs}");
            if ours[..SECOND_LEN] == theirs[..SECOND_LEN] {
                return;
            }
        }
        panic!("the whole second differs three times");
    }

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        let cases = [
            "0.0.0.0",
            "127.0.0.1",
            "10.20.100.9",
            "255.255.255.255",
            "192.168.0.99",
            "::1",
            "2001:db8::8a2e:370:7334",
            "::ffff:10.0.0.1",
        ];
        for text in cases {
            let ip: std::net::IpAddr = text.parse().unwrap();
            let mut out = Vec::new();
            write_ip(ip, &mut out);
            assert_eq!(String::from_utf8(out).unwrap(), ip.to_string(), "{text}");
        }
    }

    #[test]
    fn floats_are_written_as_debug_writes_them() {
        let mut cases = vec![
            0.0,
            -0.0,
            1e-4,
            9.99e-5,
            1e-5,
            1e15,
            1e16 - 2.0,
            1e16,
            1e17,
            0.1 + 0.2,
            f64::MIN_POSITIVE,
            f64::MAX,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ];
        // Milliseconds as the access log rounds them, and values spread
        // over every exponent (a fixed sequence: the test is deterministic).
        cases.extend((0..20_000).map(|i| f64::from(i) / 100.0));
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..50_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            cases.push(f64::from_bits(x));
            cases.push(((x % 10_000_000) as f64 * 100.0).round() / 100.0 / 100.0);
            // Near the bound, where ties come closest.
            cases.push((x % (1 << 46)) as f64 / 4.0 + (x >> 60) as f64 * 1e12);
            cases.push(1e13 - (x % (1 << 20)) as f64 / 1024.0);
            cases.push(1e9 + (x % (1 << 12)) as f64 / 256.0);
        }
        for v in cases {
            let mut buf = Vec::new();
            debug_f64(&mut buf, v);
            assert_eq!(String::from_utf8(buf).unwrap(), format!("{v:?}"));
        }
    }

    /// A span in hundredths is written as its float would be, in both
    /// formats.
    #[test]
    fn hundredths_are_written_as_their_float() {
        let mut cases = vec![0, 1, 9, 10, 11, 99, 100, 101, 105, 1234, 1_000_000];
        cases.extend([HUNDREDTHS_BOUND - 1, HUNDREDTHS_BOUND, 1 << 53, u64::MAX]);
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            cases.push(x % 10_000_000);
            cases.push(x % HUNDREDTHS_BOUND);
        }
        for n in cases {
            for format in [LogFormat::Text, LogFormat::Json] {
                let ours = direct(format, |l| l.hundredths(log_key!("ms"), Some(n)));
                let float = direct(format, |l| l.f64(log_key!("ms"), Some(n as f64 / 100.0)));
                assert_eq!(without_time(&ours), without_time(&float), "{n}");
            }
        }
    }

    #[test]
    fn a_direct_line_has_the_bytes_tracing_writes() {
        let v4: SocketAddr = "127.0.0.1:41234".parse().unwrap();
        let v6: SocketAddr = "[::1]:8080".parse().unwrap();
        for other in ["10.200.3.255:65535", "0.0.0.0:0", "[fe80::1%3]:1"] {
            same_bytes(Case {
                client: Some(other.parse().unwrap()),
                ..EMPTY
            });
        }
        let full = Case {
            id: Some("0f3c-req"),
            client: Some(v4),
            stream: Some(true),
            status: Some(200),
            ms: Some(12.0),
            message: Some("plain"),
        };
        same_bytes(full);
        same_bytes(EMPTY);
        for ms in [0.1 + 0.2, 1e-7, 1234567.89, 0.0, 1e21] {
            same_bytes(Case {
                ms: Some(ms),
                ..full
            });
        }
        for message in [
            "quote \" and back\\slash",
            "line\nbreak\ttab\r",
            "unicode \u{e9}\u{200b} \u{1f600}",
            "\u{7f} control \u{1b}[0m",
            "",
        ] {
            same_bytes(Case {
                id: Some(message),
                client: Some(v6),
                stream: Some(false),
                message: Some(message),
                ..full
            });
        }
    }

    #[test]
    fn a_plain_text_is_written_as_a_checked_string() {
        for v in [
            "instant",
            "127.0.0.1:8000",
            "",
            " ~!#$%&'()*+,-./:;<=>?@[]^_`{|}",
        ] {
            assert!(is_plain(v), "{v:?}");
            for format in [LogFormat::Text, LogFormat::Json] {
                let checked = direct(format, |l| l.str(log_key!("pool"), Some(v)));
                let plain = direct(format, |l| l.text(log_key!("pool"), Some(v), true));
                assert_eq!(without_time(&plain), without_time(&checked));
                let unknown = direct(format, |l| l.text(log_key!("pool"), Some(v), false));
                assert_eq!(without_time(&unknown), without_time(&checked));
            }
        }
        for v in ["a\"b", "back\\slash", "tab\t", "\u{7f}", "\u{e9}"] {
            assert!(!is_plain(v), "{v:?}");
            for format in [LogFormat::Text, LogFormat::Json] {
                let checked = direct(format, |l| l.str(log_key!("pool"), Some(v)));
                let unknown = direct(format, |l| l.text(log_key!("pool"), Some(v), false));
                assert_eq!(without_time(&unknown), without_time(&checked));
            }
        }
    }
}

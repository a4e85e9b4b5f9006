//! `tracing` set-up: `RUST_LOG` filter (the caller's default when unset),
//! text or JSON lines on stderr; ANSI colours only when stderr is a terminal.
//!
//! Lines are written off the threads that log them: each event is
//! formatted where it happens and handed whole to one writer thread
//! (`tracing-appender`'s non-blocking writer), so an access-log line costs
//! a request a format and a channel send, not a write to stderr. One
//! thread writes, so lines never interleave. None is dropped: when the
//! writer falls [`BUFFERED_LINES`] behind, loggers wait for it. The
//! [`LogGuard`] that `init_logging` returns writes out what is buffered
//! when dropped, at the end of `main`.
//!
//! One entry is one line in both formats: JSON escapes line breaks in its
//! strings, and in the text format a line break inside an entry (an
//! error message that spans lines) is written as `\n` ([`OneLine`]).

use std::io::{self, Write};

use tracing_appender::non_blocking::{NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::EnvFilter;

/// Lines held for the writer thread before loggers wait for it.
pub const BUFFERED_LINES: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Keeps the log writer thread; dropping it writes out every buffered line.
#[must_use = "dropping the guard stops the log writer"]
pub struct LogGuard {
    _writer: Option<WorkerGuard>,
}

/// Installs the global subscriber; `default_filter` applies when `RUST_LOG`
/// is unset (`"info"` for the proxy, quieter for commands with their own output).
pub fn init_logging(format: LogFormat, default_filter: &str) -> LogGuard {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    // Colour codes only for a person at a terminal, never into files.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(false)
        .buffered_lines_limit(BUFFERED_LINES)
        .thread_name("llmlb-log")
        .finish(std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(move || OneLine(writer.clone()));
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    // A second init (tests, embedded use) keeps the first subscriber, and
    // its writer.
    LogGuard {
        _writer: result.is_ok().then_some(guard),
    }
}

/// Writes each entry as one line: line breaks before its last byte become
/// `\n`. The formatter hands over one whole entry per write.
pub struct OneLine<W>(pub W);

impl<W: Write> Write for OneLine<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let body = buf.strip_suffix(b"\n").unwrap_or(buf);
        if memchr::memchr(b'\n', body).is_none() {
            self.0.write_all(buf)?;
            return Ok(buf.len());
        }
        let mut line = Vec::with_capacity(buf.len() + 16);
        for (i, part) in body.split(|&b| b == b'\n').enumerate() {
            if i > 0 {
                line.extend_from_slice(b"\\n");
            }
            line.extend_from_slice(part.strip_suffix(b"\r").unwrap_or(part));
        }
        if body.len() < buf.len() {
            line.push(b'\n');
        }
        self.0.write_all(&line)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one_line(entry: &str) -> String {
        let mut out = OneLine(Vec::new());
        out.write_all(entry.as_bytes()).unwrap();
        String::from_utf8(out.0).unwrap()
    }

    #[test]
    fn an_entry_that_spans_lines_is_written_as_one() {
        assert_eq!(one_line("plain entry\n"), "plain entry\n");
        assert_eq!(
            one_line("ERROR reload rejected errors=TOML parse error\n  |\n1 | [x\n\n"),
            "ERROR reload rejected errors=TOML parse error\\n  |\\n1 | [x\\n\n"
        );
        assert_eq!(one_line("a\r\nb"), "a\\nb");
    }
}

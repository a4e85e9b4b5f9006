//! `tracing` set-up: `RUST_LOG` filter (the caller's default when unset),
//! text or JSON lines on stderr; ANSI colours only when stderr is a terminal.
//!
//! Lines are written off the threads that log them, in batches: each event
//! is formatted where it happens and appended to one in-memory buffer
//! ([`BatchWriter`]); one writer thread, woken by the first line of a batch,
//! waits [`BATCH_DELAY`] for more and writes them all with one `write`. An
//! access-log line costs a request a format and a copy under a lock: no
//! system call, no thread wake-up and no allocation of its own (a channel
//! of lines, as `tracing-appender`'s non-blocking writer has, pays a wake-up
//! and a `write` per line when the writer keeps up, which it does below
//! tens of thousands of lines a second). One thread writes, so lines never
//! interleave. None is dropped: a logger that finds [`BUFFERED_BYTES`]
//! waiting writes them out itself, in order. The [`LogGuard`] that
//! `init_logging` returns writes out what is buffered when dropped, at the
//! end of `main`.
//!
//! One entry is one line in both formats: JSON escapes line breaks in its
//! strings, and in the text format a line break inside an entry (an
//! error message that spans lines) is written as `\n` ([`OneLine`]).

use std::io::{self, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

/// How long the writer waits after a batch's first line for more.
pub const BATCH_DELAY: Duration = Duration::from_millis(20);

/// Bytes buffered before a logger writes them out itself.
pub const BUFFERED_BYTES: usize = 4 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Keeps the log writer thread; dropping it writes out every buffered line.
#[must_use = "dropping the guard stops the log writer"]
pub struct LogGuard {
    _writer: Option<BatchWriter>,
}

/// Installs the global subscriber; `default_filter` applies when `RUST_LOG`
/// is unset (`"info"` for the proxy, quieter for commands with their own output).
pub fn init_logging(format: LogFormat, default_filter: &str) -> LogGuard {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    // Colour codes only for a person at a terminal, never into files.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let writer = BatchWriter::start(std::io::stderr(), BATCH_DELAY, BUFFERED_BYTES);
    let lines = writer.lines();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(writer.lines());
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    // A second init (tests, embedded use) keeps the first subscriber, and
    // its writer.
    if result.is_ok() && !ansi {
        super::log_line::install(format, lines);
    }
    LogGuard {
        _writer: result.is_ok().then_some(writer),
    }
}

/// What the loggers and the writer thread share: the lines not yet
/// written, and the destination, locked while a batch is written so that
/// batches go out in the order they were taken.
struct Shared<W> {
    pending: Mutex<Pending>,
    /// Wakes the writer for a batch's first line, and at shutdown.
    wake: Condvar,
    out: Mutex<W>,
    limit: usize,
}

#[derive(Default)]
struct Pending {
    lines: Vec<u8>,
    closed: bool,
}

impl<W: Write> Shared<W> {
    fn pending(&self) -> MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes what is buffered and writes it, holding the destination so a
    /// later batch cannot overtake this one. `spare` is the buffer swapped
    /// in (its allocation kept from batch to batch).
    fn write_out(&self, spare: &mut Vec<u8>) {
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::swap(&mut self.pending().lines, spare);
        if !spare.is_empty() {
            // A failed write loses its batch; logging goes on.
            let _ = out.write_all(spare).and_then(|()| out.flush());
            spare.clear();
        }
    }

    fn append(&self, line: &[u8]) {
        let mut pending = self.pending();
        let first = pending.lines.is_empty();
        pending.lines.extend_from_slice(line);
        let over = pending.lines.len() >= self.limit;
        drop(pending);
        if over {
            // The writer is behind: this logger writes the backlog itself.
            self.write_out(&mut Vec::new());
        } else if first {
            self.wake.notify_one();
        }
    }
}

/// The log's writer thread and its buffer; dropping it writes out every
/// buffered line and stops the thread.
pub struct BatchWriter {
    shared: Arc<Shared<Box<dyn Write + Send>>>,
    thread: Option<JoinHandle<()>>,
}

impl BatchWriter {
    /// Starts the writer thread (`llmlb-log`) writing to `out`: a batch's
    /// first line wakes it, it waits `delay` for more, then writes them
    /// with one call; a logger finding `limit` bytes buffered writes them
    /// itself.
    pub fn start<W: Write + Send + 'static>(out: W, delay: Duration, limit: usize) -> BatchWriter {
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
            out: Mutex::new(Box::new(out) as Box<dyn Write + Send>),
            limit,
        });
        let thread = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("llmlb-log".into())
                .spawn(move || write_loop(&shared, delay))
                .expect("start the log writer thread")
        };
        BatchWriter {
            shared,
            thread: Some(thread),
        }
    }

    /// What the formatter writes each entry to.
    pub fn lines(&self) -> Lines {
        Lines(Arc::clone(&self.shared))
    }
}

impl Drop for BatchWriter {
    fn drop(&mut self) {
        self.shared.pending().closed = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        // Anything logged while the thread was stopping.
        self.shared.write_out(&mut Vec::new());
    }
}

fn write_loop<W: Write>(shared: &Shared<W>, delay: Duration) {
    let mut spare = Vec::new();
    loop {
        let mut pending = shared.pending();
        while pending.lines.is_empty() && !pending.closed {
            pending = shared.wake.wait(pending).unwrap_or_else(|e| e.into_inner());
        }
        let closed = pending.closed;
        drop(pending);
        if !closed {
            // Let the batch fill: one write for every line of the next `delay`.
            std::thread::sleep(delay);
        }
        shared.write_out(&mut spare);
        if closed {
            return;
        }
    }
}

/// The formatter's writer: every entry goes whole into the shared buffer,
/// as one line ([`OneLine`]).
#[derive(Clone)]
pub struct Lines(Arc<Shared<Box<dyn Write + Send>>>);

impl Lines {
    /// Appends one whole line, already free of inner line breaks.
    pub(super) fn append_line(&self, line: &[u8]) {
        self.0.append(line);
    }
}

impl Write for &Lines {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.append(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Lines {
    type Writer = OneLine<&'a Lines>;

    fn make_writer(&'a self) -> Self::Writer {
        OneLine(self)
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

    /// A destination the test can read while the writer holds it.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn log(lines: &Lines, entry: &str) {
        lines.make_writer().write_all(entry.as_bytes()).unwrap();
    }

    #[test]
    fn lines_are_written_in_order_in_batches_and_all_at_the_end() {
        let sink = Sink::default();
        let writer = BatchWriter::start(sink.clone(), Duration::from_millis(50), 1 << 20);
        let lines = writer.lines();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let lines = lines.clone();
                std::thread::spawn(move || {
                    for i in 0..500 {
                        log(&lines, &format!("t{t} {i}\n"));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        log(&lines, "last\n");
        drop(writer);
        let text = String::from_utf8(sink.0.lock().unwrap().clone()).unwrap();
        let written: Vec<&str> = text.lines().collect();
        assert_eq!(written.len(), 2001);
        assert_eq!(written.last(), Some(&"last"));
        for t in 0..4 {
            let mine: Vec<usize> = written
                .iter()
                .filter_map(|l| l.strip_prefix(&format!("t{t} ")))
                .map(|n| n.parse().unwrap())
                .collect();
            assert_eq!(
                mine,
                (0..500).collect::<Vec<_>>(),
                "thread {t}'s lines in order"
            );
        }
    }

    #[test]
    fn a_line_waits_for_the_batch_then_is_written_without_more() {
        let sink = Sink::default();
        let writer = BatchWriter::start(sink.clone(), Duration::from_millis(20), 1 << 20);
        log(&writer.lines(), "one\n");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while sink.0.lock().unwrap().is_empty() {
            assert!(std::time::Instant::now() < deadline, "never written");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(&*sink.0.lock().unwrap(), b"one\n");
        drop(writer);
    }

    #[test]
    fn a_logger_that_finds_the_buffer_full_writes_it_out_itself() {
        let sink = Sink::default();
        // A writer that would wait an hour: only the loggers write.
        let writer = BatchWriter::start(sink.clone(), Duration::from_secs(3600), 10);
        let lines = writer.lines();
        log(&lines, "12345\n");
        log(&lines, "67890\n");
        assert_eq!(&*sink.0.lock().unwrap(), b"12345\n67890\n");
        std::mem::forget(writer);
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

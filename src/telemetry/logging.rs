//! `tracing` set-up: `RUST_LOG` filter (the caller's default when unset),
//! text or JSON lines on stderr; ANSI colours only when stderr is a terminal.

use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Installs the global subscriber; `default_filter` applies when `RUST_LOG`
/// is unset (`"info"` for the proxy, quieter for commands with their own output).
pub fn init_logging(format: LogFormat, default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    // Colour codes only for a person at a terminal, never into files.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    // A second init (tests, embedded use) keeps the first subscriber.
    let _ = result;
}

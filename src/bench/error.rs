//! Why a benchmark run could not start or finish. Failures of single
//! requests are not errors: they are recorded and counted in the report.

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("invalid benchmark settings: {0}")]
    InvalidSpec(String),
    #[error("invalid --target `{target}`: {reason}")]
    InvalidTarget { target: String, reason: String },
    #[error(
        "--target host `{host}` is not on this machine; pass --allow-remote to load a remote server"
    )]
    RemoteTarget { host: String },
    #[error("cannot read trace {path} (line {line}): {reason}")]
    Trace {
        path: String,
        line: usize,
        reason: String,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("none of the {sent} requests succeeded; the first failed with {first}")]
    NothingSucceeded { sent: u64, first: String },
    #[error("cannot read report {path}: {reason}")]
    ReadReport { path: String, reason: String },
}

//! What `llmlb doctor` says: one finding per problem (or confirmation), in
//! plain words, with a severity that decides the exit code.

use std::fmt::Write;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Severity {
    /// Checked and agrees.
    Ok,
    /// Works, but something is missing or will degrade routing later.
    Warning,
    /// Prefix routing or token counts are wrong for this replica.
    Error,
}

impl Severity {
    fn label(self) -> &'static str {
        match self {
            Severity::Ok => "ok",
            Severity::Warning => "warning",
            Severity::Error => "ERROR",
        }
    }
}

/// What went wrong, as a short stable word (for tests and scripts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topic {
    /// The replica could not be probed at all.
    Probe,
    /// The pool's `models` against the names the replica serves.
    Model,
    Tokenizer,
    BlockSize,
    /// The replica's prefix cache (cached tokens on a repeated prompt).
    PrefixCache,
    Events,
    Replay,
    /// A disaggregated pool's prefill and decode sides (vLLM's protocol).
    Disaggregation,
    /// The replica-sim profile used to plan (`--profile`).
    Profile,
}

impl Topic {
    pub fn as_str(self) -> &'static str {
        match self {
            Topic::Probe => "probe",
            Topic::Model => "model",
            Topic::Tokenizer => "tokenizer",
            Topic::BlockSize => "block_size",
            Topic::PrefixCache => "prefix_cache",
            Topic::Events => "events",
            Topic::Replay => "replay",
            Topic::Disaggregation => "disaggregation",
            Topic::Profile => "profile",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub severity: Severity,
    pub topic: Topic,
    pub message: String,
}

impl Finding {
    pub fn ok(topic: Topic, message: impl Into<String>) -> Finding {
        Finding {
            severity: Severity::Ok,
            topic,
            message: message.into(),
        }
    }

    pub fn warning(topic: Topic, message: impl Into<String>) -> Finding {
        Finding {
            severity: Severity::Warning,
            topic,
            message: message.into(),
        }
    }

    pub fn error(topic: Topic, message: impl Into<String>) -> Finding {
        Finding {
            severity: Severity::Error,
            topic,
            message: message.into(),
        }
    }
}

/// The findings of one replica.
#[derive(Debug, Clone)]
pub struct ReplicaReport {
    pub pool: String,
    pub replica: String,
    pub findings: Vec<Finding>,
}

/// Everything the doctor found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub replicas: Vec<ReplicaReport>,
    /// Pool-level remarks (e.g. discovery pools, which are not probed).
    pub notes: Vec<String>,
}

impl Report {
    /// The worst severity found.
    pub fn worst(&self) -> Severity {
        self.replicas
            .iter()
            .flat_map(|r| &r.findings)
            .map(|f| f.severity)
            .max()
            .unwrap_or(Severity::Ok)
    }

    /// Whether some replica has an error on `topic`.
    pub fn has_error(&self, topic: Topic) -> bool {
        self.replicas
            .iter()
            .flat_map(|r| &r.findings)
            .any(|f| f.severity == Severity::Error && f.topic == topic)
    }

    /// The report as text, one block per replica.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for r in &self.replicas {
            let _ = writeln!(out, "pool {:?}, replica {}:", r.pool, r.replica);
            for f in &r.findings {
                let _ = writeln!(
                    out,
                    "  {:<7} {:<12} {}",
                    f.severity.label(),
                    f.topic.as_str(),
                    f.message
                );
            }
        }
        for n in &self.notes {
            let _ = writeln!(out, "note: {n}");
        }
        let errors = self
            .replicas
            .iter()
            .flat_map(|r| &r.findings)
            .filter(|f| f.severity == Severity::Error)
            .count();
        let _ = match self.worst() {
            Severity::Error => writeln!(out, "{errors} problem(s) found"),
            Severity::Warning => writeln!(out, "no errors (see the warnings)"),
            Severity::Ok => writeln!(out, "everything agrees"),
        };
        out
    }
}

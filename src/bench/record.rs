//! What the client measured for one request.

use serde::{Deserialize, Serialize};

/// How a request ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcome {
    /// Status 200 and a complete stream (`data: [DONE]`).
    Ok,
    /// Any other status.
    Http { status: u16 },
    /// The per-request timeout fired.
    Timeout,
    /// No HTTP answer: refused, reset, closed.
    Transport { message: String },
    /// Status 200 but the stream broke, carried an error event, or ended
    /// without `[DONE]`.
    Stream { message: String },
}

impl Outcome {
    pub fn is_ok(&self) -> bool {
        matches!(self, Outcome::Ok)
    }

    /// The key this outcome is counted under in a report's `errors`.
    pub fn label(&self) -> String {
        match self {
            Outcome::Ok => "ok".into(),
            Outcome::Http { status } => status.to_string(),
            Outcome::Timeout => "timeout".into(),
            Outcome::Transport { .. } => "transport".into(),
            Outcome::Stream { .. } => "stream".into(),
        }
    }
}

/// Timings of one request, in milliseconds from the moment it was sent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// When it was sent, from the start of the run.
    pub start_ms: f64,
    /// First content token; `None` if none arrived.
    pub ttft_ms: Option<f64>,
    /// Until the end of the stream (or the failure).
    pub e2e_ms: f64,
    /// Gaps between successive content chunks (not written to JSON: a run
    /// holds one per output token).
    #[serde(skip)]
    pub itl_ms: Vec<f64>,
    /// Prompt tokens: the server's `usage.prompt_tokens` when it sent one,
    /// else the length the workload asked for.
    pub input_tokens: usize,
    /// From the final `usage` chunk when present, else the content chunks.
    pub output_tokens: u64,
    pub outcome: Outcome,
    /// The `x-llmlb-replica` response header, when the target is llmlb.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica: Option<String>,
    /// For a failed request: what the server said (the `error.message` of
    /// an OpenAI error body, else the start of the body) or why the
    /// transport failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl RequestRecord {
    /// One line saying why this request failed; `None` when it succeeded.
    pub fn failure(&self) -> Option<String> {
        let detail = self.error.as_deref().unwrap_or("");
        let sep = if detail.is_empty() { "" } else { ": " };
        match &self.outcome {
            Outcome::Ok => None,
            Outcome::Http { status } => Some(format!("HTTP {status}{sep}{detail}")),
            Outcome::Timeout => Some("timed out (--timeout)".into()),
            Outcome::Transport { message } => Some(format!("transport error: {message}")),
            Outcome::Stream { message } => Some(format!("stream error: {message}")),
        }
    }
}

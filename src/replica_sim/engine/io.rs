//! What goes into the engine (a request, or why it was refused) and what
//! one step gives back (tokens, finished and preempted requests).

use super::cost::StepShape;
use super::stats::FinishReason;

/// A request handed to the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct NewRequest {
    /// Unique among the requests the engine holds.
    pub id: u64,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    /// Lower is served first under priority scheduling; ignored otherwise.
    pub priority: i64,
    /// Leading prompt tokens whose KV cache a prefill replica computed and
    /// sent (a disaggregated request): they are loaded, not computed, when
    /// the request is first scheduled (all but the last prompt token, which
    /// is computed to sample the first output token). 0 for a request that
    /// prefills here.
    pub external_tokens: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddError {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("max_tokens must be at least 1")]
    NoOutput,
    #[error(
        "this model's maximum context length is {max_model_len} tokens, but {requested} were requested ({prompt} in the prompt, {output} to generate)"
    )]
    TooLong {
        max_model_len: usize,
        requested: usize,
        prompt: usize,
        output: usize,
    },
    #[error("request id {0} is already in the engine")]
    DuplicateId(u64),
}

/// One output token, due at the end of its step.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenEvent {
    pub id: u64,
    /// 0 for the first output token.
    pub index: usize,
    pub token: u32,
    pub text: &'static str,
}

/// A request that left the engine at the end of a step.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    pub id: u64,
    pub reason: FinishReason,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache at first scheduling.
    pub cached_tokens: usize,
}

/// What one step did; its results are due at `end`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepOutcome {
    pub start: f64,
    pub end: f64,
    pub shape: StepShape,
    /// Requests that computed tokens in this step.
    pub num_seqs: usize,
    /// Tokens computed in this step (prefill and decode).
    pub num_tokens: usize,
    pub tokens: Vec<TokenEvent>,
    pub finished: Vec<Finished>,
    pub preempted: Vec<u64>,
    /// Seconds the engine waited, with nothing to run, for a request still
    /// in the API server (the whole duration of such a step; 0 otherwise).
    pub front_end_time: f64,
    /// Requests the API server was done with when the step started: they
    /// joined the scheduler's queue before it scheduled.
    pub front_end_done: usize,
}

impl StepOutcome {
    /// Nothing happened: no request ran, none was preempted and no request
    /// in the API server was waited for. (A step can run nothing yet preempt, under
    /// priority scheduling; the next step then makes progress.)
    pub fn is_idle(&self) -> bool {
        self.num_seqs == 0 && self.preempted.is_empty() && self.front_end_time == 0.0
    }
}

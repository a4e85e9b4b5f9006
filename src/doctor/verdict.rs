//! From what llmlb expects of a replica and what the replica did with the
//! probe, the findings: pure, so every wording is unit-tested.
//!
//! The checks, in order:
//! - **tokenizer**: the replica's `usage.prompt_tokens` for the probe
//!   against llmlb's own count with the pool's tokenizer (and, when events
//!   arrive, their token ids against llmlb's);
//! - **block size**: the replica's (from its events, else its
//!   `vllm:cache_config_info`) against `[pools.prefix] block_size` where the
//!   pool's mode uses it;
//! - **prefix cache**: on the second identical send the replica should
//!   report every full block but the one holding the last prompt token as
//!   cached (vLLM always computes the last token);
//! - **events**: configured ones must connect and carry the probe's blocks;
//!   `exact` mode needs them;
//! - **replay**: a configured replay endpoint must answer; `exact` mode
//!   without one is a warning.

use super::events::Heard;
use super::finding::{Finding, Topic};
use super::probe::Usage;
use crate::config::PrefixMode;

/// What llmlb would assume about the replica.
#[derive(Debug, Clone)]
pub struct Expected {
    /// llmlb's token ids for the probe, with the pool's tokenizer.
    pub tokens: Vec<u32>,
    /// "the stand-in tokenizer" or "the tokenizer in DIR".
    pub tokenizer: String,
    pub stand_in: bool,
    pub mode: PrefixMode,
    /// `[pools.prefix] block_size`.
    pub block_size: usize,
}

/// What the event endpoint did.
#[derive(Debug, Clone)]
pub enum EventsSeen {
    NotConfigured,
    Unreachable { endpoint: String, error: String },
    Heard { endpoint: String, heard: Heard },
}

/// What the replay endpoint did.
#[derive(Debug, Clone)]
pub enum ReplaySeen {
    NotConfigured,
    Answered { batches: usize },
    Failed { endpoint: String, error: String },
}

/// What the replica did.
#[derive(Debug, Clone)]
pub struct Observed {
    pub first: Result<Usage, String>,
    pub second: Option<Result<Usage, String>>,
    pub metrics_block_size: Option<usize>,
    pub events: EventsSeen,
    pub replay: ReplaySeen,
}

/// How many of the probe's leading tokens identify its first stored block.
pub const LEAD_TOKENS: usize = 16;

pub fn judge(e: &Expected, o: &Observed) -> Vec<Finding> {
    let first = match &o.first {
        Ok(u) => u,
        Err(err) => {
            return vec![Finding::error(
                Topic::Probe,
                format!("the probe failed: {err}"),
            )];
        }
    };
    let mut out = Vec::new();
    let tokenizer_ok = tokenizer(e, first, &mut out);
    let heard = match &o.events {
        EventsSeen::Heard { heard, .. } => Some(heard),
        _ => None,
    };
    let replica_bs = heard.and_then(|h| h.block_size).or(o.metrics_block_size);
    block_size(e, replica_bs, &mut out);
    match &o.second {
        None => {}
        Some(Err(err)) => out.push(Finding::error(
            Topic::Probe,
            format!("the second probe failed: {err}"),
        )),
        Some(Ok(u)) => prefix_cache(u, replica_bs.unwrap_or(e.block_size), &mut out),
    }
    events(e, &o.events, tokenizer_ok, &mut out);
    replay(e, &o.events, &o.replay, &mut out);
    out
}

fn tokenizer(e: &Expected, first: &Usage, out: &mut Vec<Finding>) -> bool {
    let ours = e.tokens.len() as u64;
    if first.prompt_tokens == ours {
        out.push(Finding::ok(
            Topic::Tokenizer,
            format!(
                "llmlb ({}) and the replica both count {ours} prompt tokens for the probe",
                e.tokenizer
            ),
        ));
        return true;
    }
    let hint = if e.stand_in {
        "set [pools.tokenizer] dir to the model directory the replicas serve \
         (tokenizer.json and the chat template)"
    } else {
        "[pools.tokenizer] dir must hold the tokenizer and chat template of the model \
         the replicas serve"
    };
    out.push(Finding::error(
        Topic::Tokenizer,
        format!(
            "wrong tokenizer: llmlb counts {ours} prompt tokens for the probe with {}, \
             the replica reports {}; prefix routing cannot match its cache and token \
             limits are off; {hint}",
            e.tokenizer, first.prompt_tokens
        ),
    ));
    false
}

/// A probe with tools or template arguments: llmlb's token count for it
/// against the replica's, and the repeated send's cached tokens. A replica
/// that refuses the probe (vLLM answers 400 to `tools` without
/// `--enable-auto-tool-choice`) gets a warning, not an error.
pub fn judge_variant(
    label: &str,
    ours: Result<u64, String>,
    first: &Result<Usage, String>,
    second: Option<&Result<Usage, String>>,
    bs: usize,
) -> Vec<Finding> {
    let mut out = Vec::new();
    let first = match first {
        Ok(u) => u,
        Err(err) => {
            out.push(Finding::warning(
                Topic::Probe,
                format!("{label} was refused ({err}); not checked"),
            ));
            return out;
        }
    };
    let ours = match ours {
        Ok(n) => n,
        Err(err) => {
            out.push(Finding::error(
                Topic::Tokenizer,
                format!("llmlb cannot render {label}: {err}"),
            ));
            return out;
        }
    };
    if first.prompt_tokens == ours {
        out.push(Finding::ok(
            Topic::Tokenizer,
            format!("llmlb and the replica both count {ours} prompt tokens for {label}"),
        ));
    } else {
        out.push(Finding::error(
            Topic::Tokenizer,
            format!(
                "llmlb counts {ours} prompt tokens for {label}, the replica {}: the pool's \
                 chat template renders tools or template arguments differently from the \
                 replica's (vLLM: --chat-template), so prefix routing mispredicts such requests",
                first.prompt_tokens
            ),
        ));
        return out;
    }
    if let Some(Ok(u)) = second {
        let mut cache = Vec::new();
        prefix_cache(u, bs, &mut cache);
        for mut f in cache {
            f.message = format!("{label}: {}", f.message);
            out.push(f);
        }
    }
    out
}

fn block_size(e: &Expected, replica_bs: Option<usize>, out: &mut Vec<Finding>) {
    match (e.mode, replica_bs) {
        (PrefixMode::Exact, Some(bs)) => out.push(Finding::ok(
            Topic::BlockSize,
            format!(
                "the replica caches blocks of {bs} tokens (exact mode learns it from the events)"
            ),
        )),
        (PrefixMode::Cache, Some(bs)) if bs != e.block_size => out.push(Finding::error(
            Topic::BlockSize,
            format!(
                "block size mismatch: [pools.prefix] block_size = {}, the replica caches blocks \
                 of {bs} tokens; set block_size = {bs}",
                e.block_size
            ),
        )),
        (_, Some(bs)) if bs != e.block_size => out.push(Finding::warning(
            Topic::BlockSize,
            format!(
                "the replica caches blocks of {bs} tokens, [pools.prefix] block_size is {} \
                 (only the closed-loop prediction uses it in this mode); set block_size = {bs}",
                e.block_size
            ),
        )),
        (_, Some(bs)) => out.push(Finding::ok(
            Topic::BlockSize,
            format!("the replica caches blocks of {bs} tokens, as configured"),
        )),
        (PrefixMode::Cache, None) => out.push(Finding::warning(
            Topic::BlockSize,
            format!(
                "the replica reports its block size neither in KV events nor in \
                 vllm:cache_config_info; llmlb assumes {}",
                e.block_size
            ),
        )),
        _ => {}
    }
}

fn prefix_cache(second: &Usage, bs: usize, out: &mut Vec<Finding>) {
    let n = second.prompt_tokens;
    let Some(cached) = second.cached_tokens else {
        out.push(Finding::warning(
            Topic::PrefixCache,
            "the replica does not report usage.prompt_tokens_details.cached_tokens \
             (vLLM: --enable-prompt-tokens-details): llmlb's closed-loop metrics \
             cannot check its predictions there",
        ));
        return;
    };
    let bs = bs.max(1) as u64;
    let expected = n.saturating_sub(1) / bs * bs;
    if cached == expected {
        out.push(Finding::ok(
            Topic::PrefixCache,
            format!("the repeated probe found {cached} of its {n} tokens cached, as predicted"),
        ));
    } else if cached == 0 {
        out.push(Finding::error(
            Topic::PrefixCache,
            format!(
                "prefix caching looks off: the repeated probe found none of its {n} tokens \
                 cached, {expected} expected (vLLM: --enable-prefix-caching), or the cache \
                 is too small to keep one prompt"
            ),
        ));
    } else if cached % bs != 0 {
        out.push(Finding::error(
            Topic::BlockSize,
            format!(
                "block size mismatch: the repeated probe found {cached} tokens cached, \
                 not a multiple of {bs}"
            ),
        ));
    } else {
        out.push(Finding::warning(
            Topic::PrefixCache,
            format!(
                "the repeated probe found {cached} of its {n} tokens cached, {expected} \
                 predicted (other traffic may have evicted blocks)"
            ),
        ));
    }
}

fn events(e: &Expected, seen: &EventsSeen, tokenizer_ok: bool, out: &mut Vec<Finding>) {
    match seen {
        EventsSeen::NotConfigured if e.mode == PrefixMode::Exact => out.push(Finding::error(
            Topic::Events,
            "events off: the pool's prefix mode is exact but the replica names no kv_events, \
             so llmlb only estimates what it holds; set kv_events to the endpoint of its \
             --kv-events-config",
        )),
        EventsSeen::NotConfigured => {}
        EventsSeen::Unreachable { endpoint, error } => out.push(Finding::error(
            Topic::Events,
            format!("events off: cannot connect to {endpoint}: {error}"),
        )),
        EventsSeen::Heard { endpoint, heard } => {
            let lead = &e.tokens[..e.tokens.len().min(LEAD_TOKENS)];
            if heard.messages == 0 {
                let why = match &heard.undecodable {
                    Some(err) => format!("messages arrived but none decodes ({err})"),
                    None => "nothing arrived after the probe".to_string(),
                };
                out.push(Finding::error(
                    Topic::Events,
                    format!(
                        "events off: {why} on {endpoint}; start the replica with \
                         --kv-events-config '{{\"enable_kv_cache_events\":true,\"publisher\":\
                         \"zmq\",\"endpoint\":\"tcp://*:PORT\"}}' and point kv_events at it"
                    ),
                ));
            } else if tokenizer_ok && !heard.stored_starting_with(lead) {
                out.push(Finding::error(
                    Topic::Events,
                    format!(
                        "the events on {endpoint} carry no block of the probe \
                         ({} messages): is it another replica's endpoint, or does the \
                         chat template differ?",
                        heard.messages
                    ),
                ));
            } else {
                out.push(Finding::ok(
                    Topic::Events,
                    format!(
                        "KV events arrive on {endpoint} ({} messages after the probe)",
                        heard.messages
                    ),
                ));
            }
            if e.mode != PrefixMode::Exact {
                out.push(Finding::warning(
                    Topic::Events,
                    format!(
                        "kv_events is set but the pool's prefix mode is {}: llmlb does not \
                         subscribe (mode = \"exact\" uses them)",
                        e.mode.as_str()
                    ),
                ));
            }
        }
    }
}

fn replay(e: &Expected, events: &EventsSeen, seen: &ReplaySeen, out: &mut Vec<Finding>) {
    match seen {
        ReplaySeen::NotConfigured => {
            if e.mode == PrefixMode::Exact && !matches!(events, EventsSeen::NotConfigured) {
                out.push(Finding::warning(
                    Topic::Replay,
                    "replay missing: no kv_events_replay, so an llmlb that starts or \
                     reconnects after the replica scores it from its estimate until the \
                     replica's cache has turned over (vLLM: replay_endpoint in \
                     --kv-events-config)",
                ));
            }
        }
        ReplaySeen::Answered { batches } => out.push(Finding::ok(
            Topic::Replay,
            format!("the replay endpoint answered ({batches} batches buffered)"),
        )),
        ReplaySeen::Failed { endpoint, error } => out.push(Finding::error(
            Topic::Replay,
            format!("replay missing: {endpoint} did not answer a replay request: {error}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::doctor::finding::Severity;

    fn expected(mode: PrefixMode) -> Expected {
        Expected {
            tokens: (0..100).collect(),
            tokenizer: "the stand-in tokenizer".into(),
            stand_in: true,
            mode,
            block_size: 16,
        }
    }

    fn usage(prompt_tokens: u64, cached: Option<u64>) -> Usage {
        Usage {
            prompt_tokens,
            cached_tokens: cached,
        }
    }

    fn observed(first: u64, cached: Option<u64>) -> Observed {
        Observed {
            first: Ok(usage(first, Some(0))),
            second: Some(Ok(usage(first, cached))),
            metrics_block_size: Some(16),
            events: EventsSeen::NotConfigured,
            replay: ReplaySeen::NotConfigured,
        }
    }

    fn worst(f: &[Finding], topic: Topic) -> Option<Severity> {
        f.iter()
            .filter(|x| x.topic == topic)
            .map(|x| x.severity)
            .max()
    }

    #[test]
    fn agreement_is_all_ok() {
        let f = judge(&expected(PrefixMode::Cache), &observed(100, Some(96)));
        assert!(f.iter().all(|x| x.severity == Severity::Ok), "{f:?}");
        assert_eq!(f.len(), 3);
    }

    #[test]
    fn a_different_count_names_the_tokenizer() {
        let f = judge(&expected(PrefixMode::Cache), &observed(131, Some(128)));
        assert_eq!(worst(&f, Topic::Tokenizer), Some(Severity::Error));
        let msg = &f
            .iter()
            .find(|x| x.topic == Topic::Tokenizer)
            .unwrap()
            .message;
        assert!(msg.contains("wrong tokenizer") && msg.contains("[pools.tokenizer] dir"));
        assert_eq!(worst(&f, Topic::PrefixCache), Some(Severity::Ok));
    }

    #[test]
    fn block_size_and_cache_problems() {
        let mut o = observed(300, Some(256));
        o.metrics_block_size = Some(128);
        let mut e = expected(PrefixMode::Cache);
        e.tokens = (0..300).collect();
        let f = judge(&e, &o);
        assert_eq!(worst(&f, Topic::BlockSize), Some(Severity::Error));
        assert_eq!(worst(&f, Topic::PrefixCache), Some(Severity::Ok));
        let f = judge(&expected(PrefixMode::Hash), &observed(100, Some(0)));
        assert_eq!(worst(&f, Topic::PrefixCache), Some(Severity::Error));
        let f = judge(&expected(PrefixMode::Hash), &observed(100, None));
        assert_eq!(worst(&f, Topic::PrefixCache), Some(Severity::Warning));
    }

    #[test]
    fn events_and_replay() {
        let e = expected(PrefixMode::Exact);
        let f = judge(&e, &observed(100, Some(96)));
        assert_eq!(worst(&f, Topic::Events), Some(Severity::Error));
        let mut o = observed(100, Some(96));
        o.events = EventsSeen::Heard {
            endpoint: "tcp://x".into(),
            heard: Heard::default(),
        };
        let f = judge(&e, &o);
        assert!(
            f.iter()
                .any(|x| x.topic == Topic::Events && x.message.starts_with("events off"))
        );
        assert_eq!(worst(&f, Topic::Replay), Some(Severity::Warning));
        o.events = EventsSeen::Heard {
            endpoint: "tcp://x".into(),
            heard: Heard {
                messages: 2,
                undecodable: None,
                block_size: Some(16),
                stored: vec![(0..32).collect()],
            },
        };
        o.replay = ReplaySeen::Failed {
            endpoint: "tcp://y".into(),
            error: "timeout".into(),
        };
        let f = judge(&e, &o);
        assert_eq!(worst(&f, Topic::Events), Some(Severity::Ok));
        assert_eq!(worst(&f, Topic::Replay), Some(Severity::Error));
    }

    #[test]
    fn variant_probes_compare_counts_and_caching() {
        let label = "the tool-calling probe";
        let f = judge_variant(
            label,
            Ok(300),
            &Ok(usage(300, None)),
            Some(&Ok(usage(300, Some(256)))),
            128,
        );
        assert!(f.iter().all(|x| x.severity == Severity::Ok), "{f:?}");
        assert!(f[1].message.starts_with(label), "{f:?}");
        let f = judge_variant(label, Ok(290), &Ok(usage(300, None)), None, 128);
        assert_eq!(worst(&f, Topic::Tokenizer), Some(Severity::Error));
        assert!(f[0].message.contains("290") && f[0].message.contains("300"));
        let f = judge_variant(
            label,
            Ok(300),
            &Err("the replica answered 400".into()),
            None,
            128,
        );
        assert_eq!(worst(&f, Topic::Probe), Some(Severity::Warning));
    }

    #[test]
    fn a_failed_probe_says_only_that() {
        let mut o = observed(100, Some(96));
        o.first = Err("connection refused".into());
        let f = judge(&expected(PrefixMode::Off), &o);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].topic, Topic::Probe);
    }
}

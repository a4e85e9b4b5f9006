//! `llmlb doctor`: checks, against the running replicas of each pool, that
//! what llmlb assumes about them (tokenizer and chat template, KV block
//! size, KV-event stream and replay) is what they really do, and says in
//! plain words what is wrong.
//!
//! For each configured replica, one after the other: subscribe to its KV
//! events when it names `kv_events`; send a probe prompt (a few hundred
//! tokens opened by a tag unique to the run, [`probe`]) twice; read its
//! `/metrics` for the block size; ask its replay endpoint when it names one
//! ([`events`]). [`verdict::judge`] compares what came back with llmlb's own
//! prediction (its token count with the pool's tokenizer, and on the second
//! send the block-aligned cached count), and [`finding::Report`] renders the
//! findings; the command exits 1 when any is an error. Then the same prompt
//! twice with a tool list and twice with `chat_template_kwargs`
//! ([`probe::Variant`], [`verdict::judge_variant`]): llmlb's count with the
//! pool's chat template against the replica's, and the repeated send's
//! cached tokens.
//!
//! A disaggregated pool and its prefill pool are also probed as a pair
//! ([`roles`]): each prefill replica prefills for a remote decode, each
//! decode replica decodes one of those prefills.
//!
//! With `--profile FILE`, each replica is also compared with where that
//! replica-sim profile was fitted ([`profile`]).
//!
//! The probes are real traffic: six one-token generations per replica (one
//! more for each replica of a disaggregated pair). DNS
//! discovered replicas are not probed (only the configured list is).

pub mod events;
pub mod finding;
pub mod probe;
pub mod profile;
mod roles;
pub mod verdict;

use std::time::Duration;

use crate::config::{Config, PoolConfig, ReplicaConfig};
use crate::net::UpstreamTls;
use crate::tokenize::PromptTokenizer;

pub use finding::{Finding, ReplicaReport, Report, Severity, Topic};
use verdict::{EventsSeen, Expected, Observed, ReplaySeen};

/// Bounds of one run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Longest wait for one probe answer.
    pub request_timeout: Duration,
    /// How long to listen for the probe's KV events after its sends.
    pub events_wait: Duration,
    /// Connecting to an event endpoint, and a replay's whole answer.
    pub zmq_timeout: Duration,
    /// A replica-sim profile to check against each replica: was it fitted
    /// there, with this engine version?
    pub profile: Option<profile::Planned>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            request_timeout: Duration::from_secs(60),
            events_wait: Duration::from_secs(5),
            zmq_timeout: Duration::from_secs(3),
            profile: None,
        }
    }
}

/// Probes every configured replica of every pool.
pub async fn run(config: &Config, opts: &Options) -> Report {
    let mut report = Report::default();
    for pc in &config.pools {
        if pc.discovery.is_some() {
            report.notes.push(format!(
                "pool {:?} discovers its replicas by DNS: not probed; run the doctor with a \
                 config listing some of them under [[pools.replicas]]",
                pc.name
            ));
            continue;
        }
        // A prefill pool lists no models: it is probed with the model of
        // the pool it prefills for.
        let named_by = config.pools.iter().find(|p| {
            p.disaggregation
                .as_ref()
                .is_some_and(|d| d.prefill_pool == pc.name)
        });
        match named_by {
            Some(decode) if pc.role == crate::config::PoolRole::Prefill => {
                let mut probed = pc.clone();
                probed.models = decode.models.clone();
                check_pool(&probed, opts, &mut report).await;
            }
            _ => check_pool(pc, opts, &mut report).await,
        }
    }
    for pc in &config.pools {
        roles::check(config, pc, opts.request_timeout, &mut report).await;
    }
    report
}

async fn check_pool(pc: &PoolConfig, opts: &Options, report: &mut Report) {
    let (tokenizer, described) = match &pc.tokenizer {
        None => (
            PromptTokenizer::StandIn,
            "the stand-in tokenizer".to_string(),
        ),
        Some(t) => match PromptTokenizer::load(&t.dir) {
            Ok(tok) => (tok, format!("the tokenizer in {}", t.dir.display())),
            Err(e) => {
                report.notes.push(format!(
                    "pool {:?}: its tokenizer does not load ({e}); not probed",
                    pc.name
                ));
                return;
            }
        },
    };
    let tls = match UpstreamTls::new(&pc.tls) {
        Ok(t) => t,
        Err(e) => {
            report.notes.push(format!(
                "pool {:?}: its TLS settings do not load ({e}); not probed",
                pc.name
            ));
            return;
        }
    };
    let client = crate::net::tls_client(&pc.timeouts, &tls);
    let auth = pc.upstream_api_key.as_ref().map(|k| format!("Bearer {k}"));
    for rc in &pc.replicas {
        let target = probe::Target {
            client: &client,
            url: rc.url.trim_end_matches('/'),
            auth: auth.as_deref(),
            timeout: opts.request_timeout,
        };
        let served = target.served_models().await;
        let (model, named) = models_finding(pc, &served);
        let findings = match model {
            // Every probe would be a 404: the name is the whole problem.
            None => named.into_iter().collect(),
            Some(model) => {
                let mut f: Vec<Finding> = named.into_iter().collect();
                f.extend(check_replica(pc, rc, &tokenizer, &described, model, &target, opts).await);
                f
            }
        };
        report.replicas.push(ReplicaReport {
            pool: pc.name.clone(),
            replica: rc.name.clone().unwrap_or_else(|| rc.url.clone()),
            findings,
        });
    }
}

/// Compares the pool's `models` with what the replica lists on
/// `/v1/models`; returns the model to probe with (None when the replica
/// serves none of them) and the finding. A replica that does not list its
/// models is probed with the pool's first.
fn models_finding<'a>(
    pc: &'a PoolConfig,
    served: &Result<Vec<String>, String>,
) -> (Option<&'a str>, Option<Finding>) {
    let first = pc.models.first().map(String::as_str);
    let served = match served {
        Ok(s) => s,
        Err(_) => return (first, None),
    };
    let (found, missing): (Vec<&String>, Vec<&String>) =
        pc.models.iter().partition(|m| served.contains(m));
    let list = |v: &[String]| {
        v.iter()
            .map(|m| format!("{m:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let serves = if served.is_empty() {
        "no model".to_string()
    } else {
        list(served)
    };
    let hint = "the pool's `models` must be the names the replica serves (vLLM's \
                --served-model-name, `llmlb replica-sim --model`)";
    match (found.first(), missing.is_empty()) {
        (None, _) => (
            None,
            Some(Finding::error(
                Topic::Model,
                format!(
                    "pool {:?} routes {} but this replica serves {serves}: requests for them \
                     get 404; {hint}",
                    pc.name,
                    list(&pc.models)
                ),
            )),
        ),
        (Some(m), true) => (
            Some(m.as_str()),
            Some(Finding::ok(
                Topic::Model,
                format!("serves {}", list(&pc.models)),
            )),
        ),
        (Some(m), false) => (
            Some(m.as_str()),
            Some(Finding::warning(
                Topic::Model,
                format!(
                    "does not serve {} (it serves {serves}): requests for those get 404 \
                     here; {hint}",
                    missing
                        .iter()
                        .map(|m| format!("{m:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )),
        ),
    }
}

async fn check_replica(
    pc: &PoolConfig,
    rc: &ReplicaConfig,
    tokenizer: &PromptTokenizer,
    described: &str,
    model: &str,
    target: &probe::Target<'_>,
    opts: &Options,
) -> Vec<Finding> {
    let tag = format!("{:016x}", rand::random::<u64>());
    let messages = probe::messages(&tag);
    let tokens = match tokenizer.encode_chat(&messages) {
        Ok(t) => t,
        Err(e) => {
            return vec![Finding::error(
                Topic::Tokenizer,
                format!("{described} cannot tokenize the probe: {e}"),
            )];
        }
    };
    let listening = match &rc.kv_events {
        None => None,
        Some(ep) => Some((ep, events::listen(ep, opts.zmq_timeout).await)),
    };
    if listening.is_some() {
        // A new subscription reaches the publisher a moment after the
        // connection: events published before that are not delivered.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let body = probe::body(model, &messages);
    let first = target.chat(&body).await;
    let second = match first {
        Ok(_) => Some(target.chat(&body).await),
        Err(_) => None,
    };
    let lead = &tokens[..tokens.len().min(verdict::LEAD_TOKENS)];
    let events = match listening {
        None => EventsSeen::NotConfigured,
        Some((ep, Err(error))) => EventsSeen::Unreachable {
            endpoint: ep.clone(),
            error,
        },
        Some((ep, Ok(l))) => EventsSeen::Heard {
            endpoint: ep.clone(),
            heard: l.collect(opts.events_wait, lead).await,
        },
    };
    let replay = match &rc.kv_events_replay {
        None => ReplaySeen::NotConfigured,
        Some(ep) => match events::replay(ep, opts.zmq_timeout).await {
            Ok(batches) => ReplaySeen::Answered { batches },
            Err(error) => ReplaySeen::Failed {
                endpoint: ep.clone(),
                error,
            },
        },
    };
    let metrics_block_size = target.metrics_block_size().await;
    let replica_bs = match &events {
        EventsSeen::Heard { heard, .. } => heard.block_size,
        _ => None,
    }
    .or(metrics_block_size)
    .unwrap_or(pc.prefix.block_size);
    let mut variants = Vec::new();
    if first.is_ok() {
        for variant in [probe::Variant::Tools, probe::Variant::TemplateArgs] {
            let ours = tokenizer
                .encode_chat_with(&messages, &variant.options())
                .map(|t| t.len() as u64)
                .map_err(|e| e.to_string());
            let body = probe::body_of(variant, model, &messages);
            let first = target.chat(&body).await;
            let second = match first {
                Ok(_) => Some(target.chat(&body).await),
                Err(_) => None,
            };
            variants.extend(verdict::judge_variant(
                variant.label(),
                ours,
                &first,
                second.as_ref(),
                replica_bs,
            ));
        }
    }
    let observed = Observed {
        first,
        second,
        metrics_block_size,
        events,
        replay,
    };
    let expected = Expected {
        tokens,
        tokenizer: described.to_string(),
        stand_in: tokenizer.is_stand_in(),
        mode: pc.prefix.mode,
        block_size: pc.prefix.block_size,
    };
    let mut findings = verdict::judge(&expected, &observed);
    findings.extend(variants);
    if let Some(planned) = &opts.profile {
        let version = target.version().await;
        let seen = profile::Seen {
            replica_url: target.url,
            engine_version: version.as_deref(),
            model,
            host: &planned.host,
            cpu: planned.cpu.as_deref(),
        };
        findings.extend(profile::judge(
            &planned.name,
            planned.fitted.as_ref(),
            &seen,
        ));
    }
    findings
}

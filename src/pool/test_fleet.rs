//! Test set-up shared by the routing steps' unit tests: a topology built
//! from config text, replica tables, route inputs, and a helper that routes
//! a chat and sends it where the decision prefers.

use std::sync::Arc;

use http::HeaderMap;

use super::{Pool, Topology};
use crate::admission::AdmissionMetrics;
use crate::replica::{InFlightGuard, Replica};
use crate::routing::{Decision, Prompt, RouteBranch, RouteInput};
use crate::telemetry::Metrics;
use crate::tokenize::ChatMessage;

/// The topology of a config, with metrics on their own registry.
pub fn topology(text: &str) -> Topology {
    let config = crate::config::parse(text).unwrap();
    let metrics = Metrics::new();
    let admission = AdmissionMetrics::new(metrics.registry());
    Topology::build(&config, &metrics, &admission, None)
}

/// `n` `[[pools.replicas]]` tables named `r0..`, each with `extra(i)` lines.
pub fn replicas(n: usize, extra: impl Fn(usize) -> String) -> String {
    (0..n)
        .map(|i| {
            format!(
                "[[pools.replicas]]\nurl = \"http://127.0.0.1:{}\"\nname = \"r{i}\"\n{}\n",
                i + 1,
                extra(i)
            )
        })
        .collect()
}

/// The topology of one pool `p` serving `m`: its `settings` lines, then
/// `n` plain replicas.
pub fn pool_of(settings: &str, n: usize) -> Topology {
    topology(&format!(
        "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n{settings}\n{}",
        replicas(n, |_| String::new())
    ))
}

/// A request for model `m` with no tier and no pre-computed tokens.
pub fn input<'a>(
    headers: &'a HeaderMap,
    user: Option<&'a str>,
    prompt: Prompt<'a>,
) -> RouteInput<'a> {
    RouteInput {
        model: "m",
        user,
        api_key: None,
        headers,
        tier: None,
        prompt,
        tokens: None,
        salt: None,
        unpredictable: None,
        kind: "plain",
        max_tokens: None,
    }
}

/// Routes `input` in `pool` at time 1 with random draw 0.
pub fn route(pool: &Pool, input: &RouteInput<'_>) -> Decision {
    pool.router.route(&pool.replicas, input, 0, 1).unwrap()
}

/// Routes `chat` in `pool` and sends it to the preferred replica.
pub fn dispatch_chat<'p>(pool: &'p Pool, chat: &[ChatMessage]) -> &'p Arc<Replica> {
    dispatch_chat_with_branches(pool, chat).0
}

/// [`dispatch_chat`], also returning the decision's branches.
pub fn dispatch_chat_with_branches<'p>(
    pool: &'p Pool,
    chat: &[ChatMessage],
) -> (&'p Arc<Replica>, Vec<RouteBranch>) {
    let headers = HeaderMap::new();
    let d = route(pool, &input(&headers, None, Prompt::Chat(chat)));
    let id = d.preferred.as_ref().unwrap()[0];
    let r = pool.replicas.iter().find(|r| r.id == id).unwrap();
    // The request stays in flight for the rest of the test: in `exact`
    // mode its prompt keeps counting as sent there.
    std::mem::forget(d.dispatched(r));
    (r, d.branches)
}

/// One long system prompt with a short question of its own, `i`: the
/// requests of one hot prefix.
pub fn hot_prompt_chat(i: usize) -> Vec<ChatMessage> {
    let system = "Answer as the support desk of a bank, citing the rules. ".repeat(120);
    vec![
        ChatMessage::new("system", system),
        ChatMessage::new("user", format!("Case {i}?")),
    ]
}

/// Sends `n` requests of [`hot_prompt_chat`] into `pool` and holds them all
/// in flight.
pub fn hold_hot_prompt(pool: &Pool, n: usize) -> Vec<InFlightGuard> {
    (0..n)
        .map(|i| dispatch_chat(pool, &hot_prompt_chat(i)).acquire())
        .collect()
}

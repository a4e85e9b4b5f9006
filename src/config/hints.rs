//! Advice `llmlb check` prints for a valid pool: settings that work, but
//! that the measurements in docs/ROUTING.md ("Which mode") say could serve
//! better. Never an error; one line each.

use super::{PoolConfig, PrefixMode};

/// Hints for one pool's prefix settings, in the order they matter.
pub fn prefix_hints(pool: &PoolConfig) -> Vec<String> {
    let events = pool.replicas.iter().any(|r| r.kv_events.is_some())
        || pool
            .discovery
            .as_ref()
            .is_some_and(|d| d.kv_events_port.is_some());
    let mut out = Vec::new();
    match pool.prefix.mode {
        PrefixMode::Off | PrefixMode::Hash | PrefixMode::Cache if events => out.push(format!(
            "prefix mode {:?} while replicas publish KV events: \"exact\" routes on what they report holding plus what llmlb has sent them (docs/ROUTING.md, \"Which mode\")",
            pool.prefix.mode.as_str()
        )),
        PrefixMode::Exact if pool.tokenizer.is_none() => out.push(
            "prefix mode \"exact\" with the stand-in tokenizer: its blocks match only `llmlb replica-sim` without --tokenizer; set [pools.tokenizer] dir to the replicas' model".to_string(),
        ),
        _ => {}
    }
    let by_prefix = pool.prefix.mode.scores_by_cost();
    let queued = pool.replicas.iter().any(|r| pool.limit_of(r).is_some());
    if by_prefix && queued && pool.queue.prefix_handoff.is_zero() {
        out.push(
            "max_inflight with a prefix mode: a freed slot goes to the oldest waiter wherever its prompt is cached; [pools.queue] prefix_handoff hands it to a waiter whose prompt that replica holds (docs/ADMISSION.md#prefix-handoff)".to_string(),
        );
    }
    if !pool.queue.prefix_handoff.is_zero() && !by_prefix {
        out.push(format!(
            "queue.prefix_handoff with prefix mode {:?}: the handoff reads where each waiter's prompt is cached, which only \"cache\" and \"exact\" track; it does nothing here",
            pool.prefix.mode.as_str()
        ));
    }
    out
}

/// A hint for a pool that sends `priority` while every request has the
/// same level: without `[[tiers]]` the replicas have nothing to order.
pub fn priority_hint(tiers: usize, pool: &PoolConfig) -> Option<String> {
    (pool.send_priority && tiers == 0).then(|| {
        "send_priority without [[tiers]]: every request carries the same level, so the replicas have nothing to order (docs/ADMISSION.md)".to_string()
    })
}

/// Hints for a pool with `max_prefilling`: one not below any replica's
/// `max_inflight` never holds a request back; beside a `ttft_objective`,
/// deadline admission does not count the wait for a prefill slot.
pub fn prefill_hints(objectives: bool, pool: &PoolConfig) -> Vec<String> {
    let Some(bound) = pool.max_prefilling else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let limits = pool.replicas.iter().filter_map(|r| pool.limit_of(r));
    if let Some(largest) = limits.max().filter(|l| bound >= *l) {
        out.push(format!("max_prefilling = {bound} is not below max_inflight ({largest}): it never holds a request back (docs/ADMISSION.md#prefill-bound)"));
    }
    if objectives {
        out.push("max_prefilling with a ttft_objective: deadline admission does not count the wait for a prefill slot, so admitted requests can miss the objective (docs/ADMISSION.md#prefill-bound)".to_string());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(toml: &str) -> PoolConfig {
        let text = format!(
            "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n{toml}\n[[pools.replicas]]\nurl = \"http://127.0.0.1:1\"\n"
        );
        let cfg: crate::config::Config = toml::from_str(&text).unwrap();
        cfg.pools.into_iter().next().unwrap()
    }

    #[test]
    fn send_priority_without_tiers_has_nothing_to_order() {
        assert_eq!(priority_hint(0, &pool("")), None);
        let sends = pool("send_priority = true");
        assert!(priority_hint(0, &sends).unwrap().contains("[[tiers]]"));
        assert_eq!(priority_hint(2, &sends), None);
    }

    #[test]
    fn a_prefill_bound_at_or_above_the_limit_does_nothing() {
        assert!(prefill_hints(true, &pool("max_inflight = 8")).is_empty());
        let bounded = pool("max_inflight = 8\nmax_prefilling = 4");
        assert!(prefill_hints(false, &bounded).is_empty());
        let idle = prefill_hints(false, &pool("max_inflight = 8\nmax_prefilling = 8"));
        assert!(
            idle.len() == 1 && idle[0].contains("never holds"),
            "{idle:?}"
        );
        let deadline = prefill_hints(true, &bounded);
        assert!(
            deadline.len() == 1 && deadline[0].contains("ttft_objective"),
            "{deadline:?}"
        );
    }

    #[test]
    fn cache_with_events_is_pointed_at_exact_and_exact_at_the_tokenizer() {
        let mut p = pool("[pools.prefix]\nmode = \"cache\"");
        assert!(prefix_hints(&p).is_empty(), "no events: cache is right");
        p.replicas[0].kv_events = Some("tcp://127.0.0.1:5557".into());
        let hints = prefix_hints(&p);
        assert_eq!(hints.len(), 1);
        assert!(hints[0].contains("\"exact\""), "{hints:?}");
        p.prefix.mode = PrefixMode::Exact;
        let hints = prefix_hints(&p);
        assert_eq!(hints.len(), 1);
        assert!(hints[0].contains("[pools.tokenizer] dir"), "{hints:?}");
    }

    #[test]
    fn a_prefix_handoff_is_pointed_at_under_a_bound_and_idle_without_a_prefix_mode() {
        let handoff = "max_inflight = 2\n[pools.queue]\nprefix_handoff = \"1s\"";
        let off = prefix_hints(&pool(handoff));
        assert!(off.len() == 1 && off[0].contains("does nothing"), "{off:?}");
        let cache = pool(&format!("{handoff}\n[pools.prefix]\nmode = \"cache\""));
        assert!(prefix_hints(&cache).is_empty());
        let bound = prefix_hints(&pool("max_inflight = 2\n[pools.prefix]\nmode = \"cache\""));
        assert!(
            bound.len() == 1 && bound[0].contains("prefix_handoff"),
            "{bound:?}"
        );
        assert_eq!(
            cache.queue.prefix_handoff,
            std::time::Duration::from_secs(1)
        );
    }
}

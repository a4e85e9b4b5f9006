//! Adapter-aware placement: a request naming a LoRA adapter goes where it
//! does not wait for other adapters' requests to drain, or where that wait
//! costs less than the prefill it saves.
//!
//! vLLM runs requests of at most `--max-loras` adapters at once; a request
//! for another one waits until the running requests of the adapters in its
//! way have drained, and requests of those adapters that arrive meanwhile
//! may start before it. That wait, not the load of the adapter itself
//! (milliseconds from host memory), is what a swap costs; a replica that
//! runs no adapter request takes any adapter after a load
//! ([`crate::replica::adapters`] counts llmlb's own requests per adapter and
//! what the replica's metrics show).
//!
//! In `cache` and `exact` prefix modes (without a session key) the prefix
//! step weighs that wait against the prefill a cache hit saves, in one
//! cost ([`super::prefix::score`]): [`waits`] gives, per candidate, the
//! other adapters' requests the request would wait for there (still
//! prefilling, or decoding with llmlb's estimate of their output left) and
//! the other adapters' requests it would keep waiting, and every candidate
//! stays: a short drain loses to a long prefill and the other way round.
//! The branch then says where the chosen replica stood.
//!
//! Otherwise (other prefix modes, a session key, or a prompt the prefix
//! step does not score), [`narrow`] prefers among the candidates, in order
//! ([`crate::replica::adapters::Placement`]):
//! 1. replicas where the adapter runs or is still loaded (`lora_loaded`),
//! 2. else replicas with a free adapter slot (`lora_spread`): a hot adapter
//!    whose replicas are all saturated, at their concurrency limit or past
//!    the imbalance bound gets a new copy instead of waiting there,
//! 3. else replicas where it runs while another adapter waits there for it
//!    to drain (`lora_draining`),
//! 4. else all of them (`lora_swap`): the request waits for a drain
//!    wherever it goes, and the balancer chooses by load.
//!
//! A replica counts only while it is not saturated (`[pools.saturation]`),
//! has a free slot, and has at most `max_imbalance` more requests in flight
//! than the least loaded candidate: avoiding a swap is worth that much
//! imbalance and no more, so one replica holding a hot adapter is not piled
//! on while others could serve it (with `--max-loras 1` and one hot adapter,
//! keeping every request of it on its replica leaves that replica with most
//! of the traffic). Past the bound the request goes by load and may swap.
//! The preference is soft: retries fall back to all candidates.
//! Cost: O(candidates) mutex-guarded lookups.

use std::collections::HashMap;
use std::sync::Arc;

use super::RouteBranch;
use super::decision::Decision;
use super::prefix::score::AdapterWait;
use crate::replica::adapters::Placement;
use crate::replica::{Replica, ReplicaId, ReplicaView};

/// Narrows `cands` for a request naming `adapter`; the preferred ids
/// (sorted), or `None` when every candidate would swap.
pub(super) fn narrow(
    adapter: &str,
    cands: &mut Vec<Arc<Replica>>,
    saturated: impl Fn(&Replica) -> bool,
    max_imbalance: u32,
    d: &mut Decision,
) -> Option<Vec<ReplicaId>> {
    let least = cands.iter().map(|r| r.in_flight()).min().unwrap_or(0);
    let within = |r: &Replica| r.in_flight() <= least + u64::from(max_imbalance);
    let fits = |r: &Replica| !saturated(r) && r.has_free_slot() && within(r);
    let order = [Placement::Loaded, Placement::FreeSlot, Placement::Draining];
    let found = order.into_iter().find_map(|want| {
        let chosen: Vec<Arc<Replica>> = cands
            .iter()
            .filter(|r| fits(r) && r.adapters.placement(adapter) == want)
            .cloned()
            .collect();
        (!chosen.is_empty()).then_some((chosen, want))
    });
    let Some((chosen, placement)) = found else {
        d.branches.push(RouteBranch::LoraSwap);
        return None;
    };
    d.branches.push(branch_of(placement));
    *cands = chosen;
    let mut ids: Vec<ReplicaId> = cands.iter().map(|r| r.id).collect();
    ids.sort_unstable();
    Some(ids)
}

/// What a request naming `adapter` waits for on each of `cands`, for the
/// prefix step's cost: where every slot is taken by other adapters, the
/// requests it waits for (those of llmlb's requests on the replica that
/// are not waiting for a slot themselves still prefilling, the rest
/// decoding with the replica's mean output left); where its adapter runs
/// while others wait for it, how many.
pub(super) fn waits(
    adapter: &str,
    cands: &[Arc<Replica>],
    views: &HashMap<ReplicaId, ReplicaView>,
) -> HashMap<ReplicaId, AdapterWait> {
    cands
        .iter()
        .filter_map(|r| {
            let v = views.get(&r.id)?;
            let s = r.adapters.standing(adapter);
            // Requests waiting for a slot have no first token yet.
            let not_blocking = v.in_flight.saturating_sub(s.blockers);
            let blockers_prefilling = v.prefilling.saturating_sub(not_blocking).min(s.blockers);
            let decoding = v.in_flight.saturating_sub(v.prefilling);
            Some((
                r.id,
                AdapterWait {
                    blockers_prefilling,
                    blockers_decoding: s.blockers - blockers_prefilling,
                    remaining_output: v.decoding_output.checked_div(decoding).unwrap_or(0),
                    waiters: s.waiters,
                },
            ))
        })
        .collect()
}

/// The branch that says where a request for `adapter` went on `replica`.
pub(super) fn branch_at(adapter: &str, replica: &Replica) -> RouteBranch {
    branch_of(replica.adapters.placement(adapter))
}

fn branch_of(placement: Placement) -> RouteBranch {
    match placement {
        Placement::Loaded => RouteBranch::LoraLoaded,
        Placement::FreeSlot => RouteBranch::LoraSpread,
        Placement::Draining => RouteBranch::LoraDraining,
        Placement::Swap => RouteBranch::LoraSwap,
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;

    use super::*;
    use crate::pool::test_fleet::{hot_prompt_chat, input, pool_of, replicas, route, topology};
    use crate::pool::{Pool, Topology};
    use crate::replica::adapters::LoraInfo;
    use crate::replica::{EngineTiming, InFlightGuard, LoadSnapshot};
    use crate::routing::{Prompt, RouteInput};
    use crate::tokenize::{ChatMessage, Unpredictable};

    fn info(running: &[&str], waiting: &[&str]) -> Option<LoraInfo> {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        Some(LoraInfo {
            max_lora: Some(1),
            running: names(running),
            waiting: names(waiting),
        })
    }

    fn fleet(n: usize) -> Vec<Arc<Replica>> {
        let t = topology(&format!(
            "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n{}",
            replicas(n, |_| String::new())
        ));
        t.pools()[0].replicas.clone()
    }

    fn run(
        all: &[Arc<Replica>],
        adapter: &str,
        saturated: &dyn Fn(&Replica) -> bool,
        bound: u32,
    ) -> (Option<Vec<ReplicaId>>, Vec<RouteBranch>, usize) {
        let mut cands = all.to_vec();
        let mut d = Decision::default();
        let ids = narrow(adapter, &mut cands, saturated, bound, &mut d);
        (ids, d.branches, cands.len())
    }

    const NONE: &dyn Fn(&Replica) -> bool = &|_| false;

    #[test]
    fn loaded_then_free_slot_then_swap() {
        let all = fleet(3);
        all[0].adapters.observe(info(&["sql"], &[]));
        all[1].adapters.observe(info(&["chat"], &[]));
        all[2].adapters.observe(info(&[], &[]));
        let (ids, branches, _) = run(&all, "sql", NONE, 2);
        assert_eq!(ids, Some(vec![all[0].id]));
        assert_eq!(branches, vec![RouteBranch::LoraLoaded]);
        // The only holder is saturated: a replica with a free slot takes a copy.
        let first = all[0].id;
        let busy = move |r: &Replica| r.id == first;
        let (ids, branches, _) = run(&all, "sql", &busy, 2);
        assert_eq!(ids, Some(vec![all[2].id]));
        assert_eq!(branches, vec![RouteBranch::LoraSpread]);
        // A third adapter: only the idle replica has room.
        assert_eq!(run(&all, "docs", NONE, 2).0, Some(vec![all[2].id]));
        all[2].adapters.observe(info(&["docs"], &[]));
        let (ids, branches, _) = run(&all, "other", NONE, 2);
        assert_eq!((ids, branches), (None, vec![RouteBranch::LoraSwap]));
        // Sending a request is not running it: its guard counts the run.
        assert_eq!(all[1].adapters.sent("sql"), Placement::Swap);
        assert_eq!(all[1].adapters.placement("sql"), Placement::Swap);
        let mut g = all[1].acquire();
        g.run_adapter(&Arc::from("sql"));
        // It waits behind the scraped `chat` requests, and so would another.
        assert_eq!(all[1].adapters.placement("sql"), Placement::Swap);
        assert_eq!(all[1].adapters.placement("chat"), Placement::Draining);
        // A scrape shows `chat` drained and `sql` running.
        all[1].adapters.observe(info(&["sql"], &[]));
        assert_eq!(all[1].adapters.placement("sql"), Placement::Loaded);
    }

    #[test]
    fn a_waiting_adapter_is_not_loaded() {
        // vLLM with --max-loras 1: the second replica runs `chat` and has a
        // `sql` request waiting for it to drain. Another `sql` request
        // would wait there too; only the first replica runs it at once.
        let all = fleet(2);
        all[0].adapters.observe(info(&["sql"], &[]));
        all[1].adapters.observe(info(&["chat"], &["sql"]));
        let (ids, branches, _) = run(&all, "sql", NONE, 2);
        assert_eq!(ids, Some(vec![all[0].id]));
        assert_eq!(branches, vec![RouteBranch::LoraLoaded]);
        assert_eq!(all[1].adapters.placement("sql"), Placement::Swap);
    }

    #[test]
    fn only_running_requests_block_a_slot() {
        let all = fleet(2);
        // llmlb's own `sql` request runs on the first replica, and a scrape
        // shows it there; the second replica last ran `chat`.
        let mut g = all[0].acquire();
        g.run_adapter(&Arc::from("sql"));
        all[0].adapters.observe(info(&["sql"], &[]));
        all[1].adapters.observe(info(&["chat"], &[]));
        assert_eq!(all[0].adapters.placement("chat"), Placement::Swap);
        // It ends: the scrape showed only that request, so nothing runs
        // there any more; `sql` stays loaded and `chat` needs only a load,
        // not a drain.
        drop(g);
        assert_eq!(all[0].adapters.placement("sql"), Placement::Loaded);
        assert_eq!(all[0].adapters.placement("chat"), Placement::FreeSlot);
        // A later scrape showing `sql` running again is another client's.
        all[0].adapters.observe(info(&["sql"], &[]));
        assert_eq!(all[0].adapters.placement("chat"), Placement::Swap);
        // Two `chat` requests of llmlb's own on the second replica: `sql`
        // waits there until both end.
        all[1].adapters.observe(info(&[], &[]));
        let mut a = all[1].acquire();
        a.run_adapter(&Arc::from("chat"));
        let mut b = all[1].acquire();
        b.run_adapter(&Arc::from("chat"));
        drop(a);
        assert_eq!(all[1].adapters.placement("sql"), Placement::Swap);
        drop(b);
        assert_eq!(all[1].adapters.placement("sql"), Placement::FreeSlot);
        assert_eq!(all[1].adapters.placement("chat"), Placement::Loaded);
    }

    #[test]
    fn the_holder_is_preferred_only_within_the_imbalance_bound() {
        let all = fleet(2);
        all[0].adapters.observe(info(&["sql"], &[]));
        all[1].adapters.observe(info(&["chat"], &[]));
        // The holder has 3 in flight, the other replica 1.
        let _held: Vec<_> = (0..3).map(|_| all[0].acquire()).collect();
        let _other = all[1].acquire();
        // Two more than the least loaded: still within a bound of 2.
        let (ids, branches, n) = run(&all, "sql", NONE, 2);
        assert_eq!(
            (ids, branches, n),
            (Some(vec![all[0].id]), vec![RouteBranch::LoraLoaded], 1)
        );
        // Past a bound of 1: no preference, every candidate stays and the
        // balancer chooses by load (here the other replica, with a swap).
        assert_eq!(
            run(&all, "sql", NONE, 1),
            (None, vec![RouteBranch::LoraSwap], 2)
        );
        // A bound of 0 keeps the holder only while it is the least loaded.
        drop(_held);
        assert_eq!(run(&all, "sql", NONE, 0).0, Some(vec![all[0].id]));
    }

    #[test]
    fn an_adapter_is_not_fed_where_another_waits_for_it_to_drain() {
        // Both replicas run `sql`; a `chat` request went to the second and
        // waits there for its `sql` request to drain. Another `sql` request
        // sent there would start before the waiting one and keep it
        // waiting: it goes to the first replica.
        let all = fleet(2);
        let start = |r: &Arc<Replica>, a: &str| {
            let mut g = r.acquire();
            g.run_adapter(&Arc::from(a));
            g
        };
        let _a = start(&all[0], "sql");
        let b = start(&all[1], "sql");
        assert_eq!(all[1].adapters.sent("chat"), Placement::Swap);
        let c = start(&all[1], "chat");
        assert_eq!(all[1].adapters.placement("sql"), Placement::Draining);
        let (ids, branches, _) = run(&all, "sql", NONE, 2);
        assert_eq!(ids, Some(vec![all[0].id]));
        assert_eq!(branches, vec![RouteBranch::LoraLoaded]);
        // A second `chat` request would wait there too: not loaded.
        assert_eq!(all[1].adapters.placement("chat"), Placement::Swap);
        // With no other place to run at once, the draining replica still
        // beats a swap.
        let first = all[0].id;
        let busy = move |r: &Replica| r.id == first;
        let (ids, branches, _) = run(&all, "sql", &busy, 2);
        assert_eq!(ids, Some(vec![all[1].id]));
        assert_eq!(branches, vec![RouteBranch::LoraDraining]);
        // The `sql` request ends: `chat` takes the slot and runs, and `sql`
        // would now wait behind it.
        drop(b);
        assert_eq!(all[1].adapters.placement("chat"), Placement::Loaded);
        assert_eq!(all[1].adapters.placement("sql"), Placement::Swap);
        drop(c);
    }

    /// A pool in `cache` mode serving adapters `sql` and `chat` on two
    /// replicas that have learned a decode step of 10 ms (no scraped
    /// queues: llmlb's own counts, at the priors of 0.02 s a request ahead
    /// and 10,000 prefill tokens a second).
    fn lora_pool() -> Topology {
        let t = pool_of(
            "[pools.prefix]\nmode = \"cache\"\n[pools.lora]\nadapters = [\"sql\", \"chat\"]",
            2,
        );
        let timing = |seconds, gaps| LoadSnapshot {
            timing: EngineTiming {
                inter_token_seconds: Some(seconds),
                inter_tokens: Some(gaps),
                ..EngineTiming::default()
            },
            ..LoadSnapshot::default()
        };
        for r in &t.pools()[0].replicas {
            r.store_load(timing(0.0, 0.0));
            r.store_load(timing(1.0, 100.0));
        }
        t
    }

    fn route_adapter(pool: &Pool, adapter: &str, chat: &[ChatMessage]) -> Decision {
        let headers = HeaderMap::new();
        let input = RouteInput {
            model: adapter,
            ..input(&headers, None, Prompt::Chat(chat))
        };
        route(pool, &input)
    }

    /// Routes and sends one `sql` request with the hot prompt: the replica
    /// it went to (which now holds that prefix under `sql`) and the other.
    fn warmed_by_sql(pool: &Pool) -> (&Arc<Replica>, &Arc<Replica>) {
        let first = route_adapter(pool, "sql", &hot_prompt_chat(0));
        let warm = pool
            .replicas
            .iter()
            .find(|r| first.preferred == Some(vec![r.id]))
            .unwrap();
        drop(first.dispatched(warm));
        let cold = pool.replicas.iter().find(|r| r.id != warm.id).unwrap();
        (warm, cold)
    }

    /// A `chat` request decoding on `r` with `output` tokens left.
    fn decoding(r: &Arc<Replica>, output: u64) -> InFlightGuard {
        let mut g = r.acquire_tokens(50, output);
        g.run_adapter(&Arc::from("chat"));
        g.prefill_done();
        g
    }

    #[test]
    fn a_short_drain_costs_less_than_the_prefill_a_hit_saves() {
        // A `sql` request's prompt is cached on one replica; a `chat`
        // request now runs there with 3 tokens to go, and the other replica
        // is idle. Waiting 30 ms for the drain beats prefilling the whole
        // prompt on the idle one: the request goes where its prefix is, and
        // the swap is counted.
        let t = lora_pool();
        let pool = &t.pools()[0];
        let (warm, cold) = warmed_by_sql(pool);
        let _running = decoding(warm, 3);
        assert_eq!(warm.adapters.placement("sql"), Placement::Swap);
        let d = route_adapter(pool, "sql", &hot_prompt_chat(1));
        assert_eq!(d.preferred, Some(vec![warm.id]));
        assert_eq!(
            d.branches,
            vec![RouteBranch::LoraSwap, RouteBranch::PrefixHit]
        );
        assert!(d.dispatched(warm).swap);
        // Placing by adapter first (the rule with `mode = "off"`) sends it
        // to the idle replica and prefills the prompt there.
        let mut cands = pool.replicas.clone();
        let mut order = Decision::default();
        let ids = narrow("sql", &mut cands, NONE, 2, &mut order);
        assert_eq!(ids, Some(vec![cold.id]));
    }

    #[test]
    fn a_long_drain_costs_more_than_the_prefill() {
        // The same, but a `chat` request with 300 tokens to go runs there
        // too: the drain (about 1.5 s) outweighs the prefill (~0.1 s).
        let t = lora_pool();
        let pool = &t.pools()[0];
        let (warm, cold) = warmed_by_sql(pool);
        let _short = decoding(warm, 3);
        let _long = decoding(warm, 300);
        let d = route_adapter(pool, "sql", &hot_prompt_chat(1));
        assert_eq!(d.preferred, Some(vec![cold.id]));
        assert_eq!(
            d.branches,
            vec![RouteBranch::LoraSpread, RouteBranch::PrefixOverflow]
        );
        // With the drain over, the prefix wins again, where `sql` is now
        // only a load away.
        drop((_short, _long));
        let d = route_adapter(pool, "sql", &hot_prompt_chat(2));
        assert_eq!(d.preferred, Some(vec![warm.id]));
        assert_eq!(
            d.branches,
            vec![RouteBranch::LoraSpread, RouteBranch::PrefixHit]
        );
    }

    #[test]
    fn the_order_applies_when_the_prefix_step_prefers_nothing() {
        // A prompt whose cached prefix cannot be predicted (an image) is
        // not scored: the placement order chooses.
        let t = lora_pool();
        let pool = &t.pools()[0];
        let (a, b) = (&pool.replicas[0], &pool.replicas[1]);
        let _running = decoding(a, 3);
        let chat = hot_prompt_chat(0);
        let headers = HeaderMap::new();
        let go = |adapter| {
            let input = RouteInput {
                model: adapter,
                unpredictable: Some(Unpredictable::Multimodal),
                ..input(&headers, None, Prompt::Chat(&chat))
            };
            route(pool, &input)
        };
        let d = go("sql");
        assert_eq!(d.preferred, Some(vec![b.id]));
        assert_eq!(
            d.branches,
            vec![RouteBranch::LoraSpread, RouteBranch::PrefixUnpredictable]
        );
        // The adapter running there is preferred where it runs.
        let d = go("chat");
        assert_eq!(d.preferred, Some(vec![a.id]));
        assert_eq!(d.branches[0], RouteBranch::LoraLoaded);
    }

    #[test]
    fn past_the_bound_an_idle_replica_takes_a_copy() {
        // The holder runs three `sql` requests; the other replica last ran
        // `chat` but runs nothing now: a fourth `sql` request is loaded
        // there instead of queueing on the holder.
        let all = fleet(2);
        let mut held = Vec::new();
        for _ in 0..3 {
            let mut g = all[0].acquire();
            g.run_adapter(&Arc::from("sql"));
            held.push(g);
        }
        let mut c = all[1].acquire();
        c.run_adapter(&Arc::from("chat"));
        drop(c);
        let (ids, branches, _) = run(&all, "sql", NONE, 2);
        assert_eq!(ids, Some(vec![all[1].id]));
        assert_eq!(branches, vec![RouteBranch::LoraSpread]);
    }
}

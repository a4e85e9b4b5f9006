//! Adapter-aware placement: a request naming a LoRA adapter goes where the
//! adapter is loaded, so it does not wait behind a swap.
//!
//! vLLM runs requests of at most `--max-loras` adapters at once; a request
//! for another one waits until the running requests of the adapters in its
//! way have drained, and requests of those adapters that arrive meanwhile
//! may start before it. That wait, not the load of the adapter itself
//! (milliseconds from host memory), is what a swap costs; a replica that
//! runs no adapter request takes any adapter after a load
//! ([`crate::replica::adapters`] counts llmlb's own requests per adapter and
//! what the replica's metrics show). Among the candidates left by the
//! earlier steps, this step prefers, in order
//! ([`crate::replica::adapters::Placement`]):
//! 1. replicas where the adapter runs or is still loaded (`lora_loaded`),
//! 2. else replicas with a free adapter slot (`lora_spread`): a hot adapter
//!    whose replicas are all saturated, at their concurrency limit or past
//!    the imbalance bound gets a new copy instead of waiting there,
//! 3. else all of them (`lora_swap`): the request waits for a drain
//!    wherever it goes, and the balancer chooses by load.
//!
//! A replica counts only while it is not saturated (`[pools.saturation]`),
//! has a free slot, and has at most `max_imbalance` more requests in flight
//! than the least loaded candidate: avoiding a swap is worth that much
//! imbalance and no more, so one replica holding a hot adapter is not piled
//! on while others could serve it (with `--max-loras 1` and one hot adapter,
//! keeping every request of it on its replica leaves that replica with most
//! of the traffic). Past the bound the request goes by load and may swap.
//! The preference is soft: the prefix step chooses among the preferred
//! replicas, and retries fall back to all.
//! Cost: O(candidates) mutex-guarded lookups.

use std::sync::Arc;

use super::RouteBranch;
use super::decision::Decision;
use crate::replica::adapters::Placement;
use crate::replica::{Replica, ReplicaId};

/// Narrows `cands` for a request naming `adapter`; the preferred ids
/// (sorted), or `None` when every candidate would swap.
pub(super) fn narrow(
    adapter: &str,
    cands: &mut Vec<Arc<Replica>>,
    saturated: impl Fn(&Replica) -> bool,
    max_imbalance: u32,
    by_cost: bool,
    d: &mut Decision,
) -> Option<Vec<ReplicaId>> {
    let least = cands.iter().map(|r| r.in_flight()).min().unwrap_or(0);
    let within = |r: &Replica| r.in_flight() <= least + u64::from(max_imbalance);
    let fits = |r: &Replica| !saturated(r) && r.has_free_slot() && within(r);
    let with = |want: Placement| -> Vec<Arc<Replica>> {
        cands
            .iter()
            .filter(|r| fits(r) && r.adapters.placement(adapter) == want)
            .cloned()
            .collect()
    };
    let at_once = |c: &[Arc<Replica>]| {
        let loaded = c
            .iter()
            .any(|r| r.adapters.placement(adapter) == Placement::Loaded);
        let branch = if loaded {
            RouteBranch::LoraLoaded
        } else {
            RouteBranch::LoraSpread
        };
        (c.to_vec(), branch)
    };
    let found = if by_cost {
        // Loaded and free-slot replicas alike start it without a wait; the
        // prefix step's cost (prompt left to prefill, work ahead) chooses.
        let free: Vec<Arc<Replica>> = cands
            .iter()
            .filter(|r| {
                fits(r)
                    && matches!(
                        r.adapters.placement(adapter),
                        Placement::Loaded | Placement::FreeSlot
                    )
            })
            .cloned()
            .collect();
        Some(at_once(&free)).filter(|(c, _)| !c.is_empty())
    } else {
        None
    };
    let order = [
        (Placement::Loaded, RouteBranch::LoraLoaded),
        (Placement::FreeSlot, RouteBranch::LoraSpread),
        (Placement::Draining, RouteBranch::LoraDraining),
    ];
    let found = found.or_else(|| {
        order
            .into_iter()
            .map(|(want, branch)| (with(want), branch))
            .find(|(chosen, _)| !chosen.is_empty())
    });
    let Some((chosen, branch)) = found else {
        d.branches.push(RouteBranch::LoraSwap);
        return None;
    };
    d.branches.push(branch);
    *cands = chosen;
    let mut ids: Vec<ReplicaId> = cands.iter().map(|r| r.id).collect();
    ids.sort_unstable();
    Some(ids)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::test_fleet::{replicas, topology};
    use crate::replica::adapters::LoraInfo;

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
        t.pools[0].replicas.clone()
    }

    fn run(
        all: &[Arc<Replica>],
        adapter: &str,
        saturated: &dyn Fn(&Replica) -> bool,
        bound: u32,
    ) -> (Option<Vec<ReplicaId>>, Vec<RouteBranch>, usize) {
        let mut cands = all.to_vec();
        let mut d = Decision::default();
        let ids = narrow(adapter, &mut cands, saturated, bound, false, &mut d);
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

    #[test]
    fn with_a_prefix_cost_a_free_slot_competes_with_the_holder() {
        // The first replica runs `sql`, the second runs nothing (it last
        // ran `chat`). Both start a `sql` request at once: with the prefix
        // step to choose by cost (the prompt may be cached on either), both
        // stay candidates; without it the holder is preferred.
        let all = fleet(2);
        let mut g = all[0].acquire();
        g.run_adapter(&Arc::from("sql"));
        let mut c = all[1].acquire();
        c.run_adapter(&Arc::from("chat"));
        drop(c);
        let mut cands = all.to_vec();
        let mut d = Decision::default();
        let ids = narrow("sql", &mut cands, NONE, 2, true, &mut d);
        let mut both = vec![all[0].id, all[1].id];
        both.sort_unstable();
        assert_eq!(ids, Some(both));
        assert_eq!(d.branches, vec![RouteBranch::LoraLoaded]);
        assert_eq!(run(&all, "sql", NONE, 2).0, Some(vec![all[0].id]));
        // A replica where `sql` would wait for a drain is never among them,
        // and nor is one where it would keep `chat` waiting while another
        // place runs it at once.
        let mut w = all[1].acquire();
        w.run_adapter(&Arc::from("chat"));
        let mut cands = all.to_vec();
        let mut d = Decision::default();
        let ids = narrow("sql", &mut cands, NONE, 2, true, &mut d);
        assert_eq!(ids, Some(vec![all[0].id]));
        drop((g, w));
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

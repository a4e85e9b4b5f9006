//! Adapter-aware placement: a request naming a LoRA adapter goes where the
//! adapter is loaded, so it does not wait behind a swap.
//!
//! vLLM holds at most `--max-loras` adapters at once; a request for another
//! one waits until a loaded adapter's requests drain and it is swapped out.
//! Among the candidates left by the earlier steps, this step prefers, in
//! order ([`crate::replica::adapters::Placement`]):
//! 1. replicas where the adapter is loaded (`lora_loaded`),
//! 2. else replicas with a free adapter slot (`lora_spread`): a hot adapter
//!    whose replicas are all saturated or at their concurrency limit gets a
//!    new copy instead of waiting there,
//! 3. else all of them (`lora_swap`): some replica must swap.
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
    d: &mut Decision,
    now_ms: u64,
) -> Option<Vec<ReplicaId>> {
    let least = cands.iter().map(|r| r.in_flight()).min().unwrap_or(0);
    let within = |r: &Replica| r.in_flight() <= least + u64::from(max_imbalance);
    let fits = |r: &Replica| !saturated(r) && r.has_free_slot() && within(r);
    let with = |want: Placement| -> Vec<Arc<Replica>> {
        cands
            .iter()
            .filter(|r| fits(r) && r.adapters.placement(adapter, now_ms) == want)
            .cloned()
            .collect()
    };
    let (chosen, branch) = match with(Placement::Loaded) {
        loaded if !loaded.is_empty() => (loaded, RouteBranch::LoraLoaded),
        _ => match with(Placement::FreeSlot) {
            free if !free.is_empty() => (free, RouteBranch::LoraSpread),
            _ => {
                d.branches.push(RouteBranch::LoraSwap);
                return None;
            }
        },
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

    fn info(running: &[&str]) -> Option<LoraInfo> {
        Some(LoraInfo {
            max_lora: Some(1),
            running: running.iter().map(|s| s.to_string()).collect(),
            waiting: Vec::new(),
        })
    }

    #[test]
    fn loaded_then_free_slot_then_swap() {
        let t = topology(&format!(
            "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n{}",
            replicas(3, |_| String::new())
        ));
        let all = t.pools[0].replicas.clone();
        all[0].adapters.observe(info(&["sql"]));
        all[1].adapters.observe(info(&["chat"]));
        all[2].adapters.observe(info(&[]));
        let run = |adapter: &str, saturated: &dyn Fn(&Replica) -> bool| {
            let mut cands = all.clone();
            let mut d = Decision::default();
            let ids = narrow(adapter, &mut cands, saturated, 2, &mut d, 0);
            (ids, d.branches)
        };
        let none = |_: &Replica| false;
        assert_eq!(
            run("sql", &none),
            (Some(vec![all[0].id]), vec![RouteBranch::LoraLoaded])
        );
        // The only holder is saturated: a replica with a free slot takes a copy.
        let first = all[0].id;
        let busy = move |r: &Replica| r.id == first;
        assert_eq!(
            run("sql", &busy),
            (Some(vec![all[2].id]), vec![RouteBranch::LoraSpread])
        );
        // A third adapter: only the empty replica has room.
        assert_eq!(run("docs", &none).0, Some(vec![all[2].id]));
        all[2].adapters.observe(info(&["docs"]));
        assert_eq!(run("other", &none), (None, vec![RouteBranch::LoraSwap]));
        // What llmlb just sent counts as loaded until a scrape says more.
        assert_eq!(all[1].adapters.sent("sql", 10), Placement::Swap);
        assert_eq!(all[1].adapters.placement("sql", 20), Placement::Loaded);
    }

    #[test]
    fn the_holder_is_preferred_only_within_the_imbalance_bound() {
        let t = topology(&format!(
            "[[pools]]\nname = \"p\"\nmodels = [\"m\"]\n{}",
            replicas(2, |_| String::new())
        ));
        let all = t.pools[0].replicas.clone();
        all[0].adapters.observe(info(&["sql"]));
        all[1].adapters.observe(info(&["chat"]));
        let run = |bound: u32| {
            let mut cands = all.clone();
            let mut d = Decision::default();
            let ids = narrow("sql", &mut cands, |_: &Replica| false, bound, &mut d, 0);
            (ids, d.branches, cands.len())
        };
        // The holder has 3 in flight, the other replica 1.
        let _held: Vec<_> = (0..3).map(|_| all[0].acquire()).collect();
        let _other = all[1].acquire();
        // Two more than the least loaded: still within a bound of 2.
        assert_eq!(
            run(2),
            (Some(vec![all[0].id]), vec![RouteBranch::LoraLoaded], 1)
        );
        // Past a bound of 1: no preference, every candidate stays and the
        // balancer chooses by load (here the other replica, with a swap).
        assert_eq!(run(1), (None, vec![RouteBranch::LoraSwap], 2));
        // A bound of 0 keeps the holder only while it is the least loaded.
        drop(_held);
        assert_eq!(run(0).0, Some(vec![all[0].id]));
    }
}

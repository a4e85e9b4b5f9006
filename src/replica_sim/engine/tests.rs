//! Engine behaviour tests: prefix caching, LRU eviction, preemption, batch
//! limits and the cost model, all in injected time.

use super::*;
use crate::tokenize::stand_in::{render_chat, tokenize};

pub(super) fn params() -> EngineParams {
    EngineParams {
        block_size: 16,
        num_blocks: 65,
        max_num_seqs: 8,
        max_num_batched_tokens: 256,
        max_model_len: 1024,
        enable_prefix_caching: true,
        priority_scheduling: false,
    }
}

pub(super) fn cost() -> CostModel {
    CostModel {
        step_overhead: 0.005,
        prefill_overhead: 0.010,
        prefill_per_token: 0.0001,
        decode_per_seq: 0.0005,
        per_context_token: 0.000001,
        prefill_attention: 0.0,
        api_per_request: 0.0,
        api_per_output_token: 0.0,
    }
}

pub(super) fn req(id: u64, prompt: Vec<u32>, max_tokens: usize) -> NewRequest {
    NewRequest {
        id,
        prompt,
        max_tokens,
        priority: 0,
        external_tokens: 0,
    }
}

/// Distinct synthetic tokens: `n` ids starting at `base`.
pub(super) fn toks(base: u32, n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| base + i).collect()
}

/// Steps until idle; returns the end time and every outcome.
pub(super) fn run(e: &mut Engine, mut now: f64) -> (f64, Vec<StepOutcome>) {
    let mut outs = Vec::new();
    for _ in 0..100_000 {
        if !e.has_work() {
            return (now, outs);
        }
        let o = e.step(now);
        assert!(!o.is_idle(), "work pending but nothing scheduled");
        now = o.end;
        outs.push(o);
    }
    panic!("engine did not drain");
}

pub(super) fn finished(outs: &[StepOutcome]) -> Vec<Finished> {
    outs.iter().flat_map(|o| o.finished.clone()).collect()
}

#[test]
fn a_prompt_loaded_from_a_prefill_replica_decodes_at_once() {
    let mut e = Engine::new(params(), cost(), 1);
    let prompt = toks(1000, 100);
    let mut r = req(1, prompt.clone(), 4);
    r.external_tokens = prompt.len();
    e.add_request(r, 0.0).unwrap();
    let (_, outs) = run(&mut e, 0.0);
    // Every step is a decode step: no prefill in the batch.
    assert!(outs.iter().all(|o| o.shape.prefill_tokens == 0), "{outs:?}");
    assert_eq!(outs[0].shape.decode_seqs, 1);
    assert_eq!(outs.len(), 4);
    let f = &finished(&outs)[0];
    assert_eq!((f.cached_tokens, f.completion_tokens), (99, 4));
    // Its blocks entered the prefix cache: the same prompt prefilled here
    // next finds them.
    e.add_request(req(2, prompt, 1), 1.0).unwrap();
    let (_, outs) = run(&mut e, 1.0);
    assert_eq!(finished(&outs)[0].cached_tokens, 96);
}

#[test]
fn second_identical_prompt_hits_every_full_block() {
    let mut e = Engine::new(params(), cost(), 1);
    let prompt = toks(1000, 100); // 6 full blocks + 4 tokens
    e.add_request(req(1, prompt.clone(), 4), 0.0).unwrap();
    let (t, _) = run(&mut e, 0.0);
    assert_eq!(e.stats().prefix_hits, 0);
    e.add_request(req(2, prompt, 4), t).unwrap();
    let (_, outs) = run(&mut e, t);
    assert_eq!(e.stats().prefix_hits, 6 * 16);
    assert_eq!(e.stats().prefix_queries, 200);
    assert_eq!(finished(&outs)[0].cached_tokens, 96);
}

#[test]
fn a_fully_cached_prompt_still_computes_its_last_token() {
    let mut e = Engine::new(params(), cost(), 1);
    let prompt = toks(1, 64); // exactly 4 blocks
    e.add_request(req(1, prompt.clone(), 2), 0.0).unwrap();
    let (t, _) = run(&mut e, 0.0);
    e.add_request(req(2, prompt, 2), t).unwrap();
    let (_, outs) = run(&mut e, t);
    assert_eq!(
        finished(&outs)[0].cached_tokens,
        48,
        "the last block is recomputed"
    );
    assert_eq!(outs[0].shape.prefill_tokens, 16);
}

#[test]
fn shared_system_prompt_hits_exactly_its_blocks() {
    let system = "You are a careful assistant for a load balancer team. Answer in one short paragraph and cite the metric names you use. ".repeat(3);
    let a = tokenize(&render_chat([
        ("system", system.as_str()),
        ("user", "How does prefix caching work?"),
    ]));
    let b = tokenize(&render_chat([
        ("system", system.as_str()),
        ("user", "Why would a replica preempt a request?"),
    ]));
    let shared = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
    let bs = params().block_size;
    assert!(shared >= 3 * bs && shared < a.len().min(b.len()) - bs);

    let mut e = Engine::new(params(), cost(), 1);
    e.add_request(req(1, a, 4), 0.0).unwrap();
    let (t, _) = run(&mut e, 0.0);
    e.add_request(req(2, b, 4), t).unwrap();
    let (_, outs) = run(&mut e, t);
    let expected = shared / bs * bs;
    assert_eq!(e.stats().prefix_hits as usize, expected);
    assert_eq!(finished(&outs)[0].cached_tokens, expected);
}

#[test]
fn distinct_prompts_never_hit() {
    let mut e = Engine::new(params(), cost(), 1);
    for i in 0..4 {
        e.add_request(req(i, toks(10_000 * (i as u32 + 1), 80), 3), 0.0)
            .unwrap();
    }
    run(&mut e, 0.0);
    assert_eq!(e.stats().prefix_hits, 0);
    assert_eq!(e.stats().prefix_queries, 320);
}

#[test]
fn lru_evicts_least_recently_freed_prefix_first() {
    // 8 usable blocks of 16. Prompts of 40 tokens hold 3 blocks (2 full, cached).
    let p = EngineParams {
        num_blocks: 9,
        max_model_len: 128,
        ..params()
    };
    let mut e = Engine::new(p, cost(), 1);
    let (a, b) = (toks(100, 40), toks(200, 40));
    e.add_request(req(1, a.clone(), 1), 0.0).unwrap();
    let (t, _) = run(&mut e, 0.0);
    assert_eq!(e.blocks_of(1), None);
    e.add_request(req(2, b.clone(), 1), t).unwrap();
    let (t, _) = run(&mut e, t);
    // Free queue: b's partly filled block (anonymous blocks go to the head,
    // to be reused first), the never-used blocks, then a's cached blocks
    // (freed first, leaf first), then b's. a's partial block 2 went to the
    // head and b took it.
    assert_eq!(e.pool().free_order(), vec![4, 5, 6, 7, 1, 0, 3, 2]);
    // A 96-token prompt takes 6 blocks: 4 to 7 and a's two, evicting a's prefix.
    e.add_request(req(3, toks(300, 96), 1), t).unwrap();
    let (t, _) = run(&mut e, t);
    assert_eq!(e.stats().evictions, 2);
    let before = e.stats().prefix_hits;
    e.add_request(req(4, b, 1), t).unwrap();
    let (t, _) = run(&mut e, t);
    assert_eq!(
        e.stats().prefix_hits - before,
        32,
        "b, freed later, survived"
    );
    let before = e.stats().prefix_hits;
    e.add_request(req(5, a, 1), t).unwrap();
    run(&mut e, t);
    assert_eq!(
        e.stats().prefix_hits - before,
        0,
        "a, freed first, was evicted"
    );
}

#[test]
fn preemption_when_blocks_run_out_and_everyone_finishes() {
    // 10 usable blocks of 16 = 160 tokens; 3 requests of 40 prompt + 40 output = 80
    // tokens (5 blocks) each cannot all stay resident.
    let p = EngineParams {
        num_blocks: 11,
        max_model_len: 160,
        ..params()
    };
    let mut e = Engine::new(p, cost(), 1);
    for i in 0..3 {
        e.add_request(req(i, toks(1000 * (i as u32 + 1), 40), 40), 0.0)
            .unwrap();
    }
    let (_, outs) = run(&mut e, 0.0);
    assert!(e.stats().preemptions >= 1);
    let preempted: Vec<u64> = outs.iter().flat_map(|o| o.preempted.clone()).collect();
    assert!(
        preempted.contains(&2),
        "the newest request is preempted first"
    );
    let done = finished(&outs);
    assert_eq!(done.len(), 3);
    assert!(done.iter().all(|f| f.completion_tokens == 40));
    assert_eq!(e.pool().num_free(), 10, "every block is back");
    let tokens_of_2: Vec<usize> = outs
        .iter()
        .flat_map(|o| o.tokens.iter().filter(|t| t.id == 2).map(|t| t.index))
        .collect();
    assert_eq!(
        tokens_of_2,
        (0..40).collect::<Vec<_>>(),
        "no token lost or repeated"
    );
}

#[test]
fn priority_scheduling_serves_lower_priority_value_first() {
    let p = EngineParams {
        max_num_seqs: 1,
        priority_scheduling: true,
        ..params()
    };
    let mut e = Engine::new(p, cost(), 1);
    for (id, prio) in [(1, 5), (2, 0), (3, 1)] {
        let mut r = req(id, toks(100 * id as u32, 8), 1);
        r.priority = prio;
        e.add_request(r, 0.0).unwrap();
    }
    let (_, outs) = run(&mut e, 0.0);
    let order: Vec<u64> = finished(&outs).iter().map(|f| f.id).collect();
    assert_eq!(order, vec![2, 3, 1]);
}

#[test]
fn a_low_priority_request_preempting_itself_does_not_stall_the_engine() {
    // 4 usable blocks of 16. A (priority 5) and B (priority 0) each hold 2
    // blocks after prefill; when A needs a third block it is the lowest
    // priority, so it preempts itself and the step runs nothing.
    let p = EngineParams {
        num_blocks: 5,
        max_model_len: 64,
        priority_scheduling: true,
        ..params()
    };
    let mut e = Engine::new(p, cost(), 1);
    // A is admitted first, so it runs ahead of B in the batch.
    let mut a = req(1, toks(100, 31), 20);
    a.priority = 5;
    e.add_request(a, 0.0).unwrap();
    let o = e.step(0.0);
    let mut b = req(2, toks(200, 31), 20);
    b.priority = 0;
    e.add_request(b, o.end).unwrap();
    let mut now = o.end;
    let mut saw_empty_preempting_step = false;
    let mut done = Vec::new();
    for _ in 0..1000 {
        if !e.has_work() {
            break;
        }
        let o = e.step(now);
        assert!(!o.is_idle(), "work pending but the step did nothing");
        saw_empty_preempting_step |= o.num_seqs == 0 && !o.preempted.is_empty();
        done.extend(o.finished.iter().map(|f| f.id));
        now = o.end;
    }
    assert_eq!(done.len(), 2);
    assert!(e.stats().preemptions >= 1);
    assert!(
        saw_empty_preempting_step,
        "the scenario under test happened"
    );
}

#[test]
fn prefix_caching_off_means_no_hits_and_no_queries() {
    let p = EngineParams {
        enable_prefix_caching: false,
        ..params()
    };
    let mut e = Engine::new(p, cost(), 1);
    let prompt = toks(1, 100);
    e.add_request(req(1, prompt.clone(), 2), 0.0).unwrap();
    let (t, _) = run(&mut e, 0.0);
    e.add_request(req(2, prompt, 2), t).unwrap();
    let (_, outs) = run(&mut e, t);
    assert_eq!(finished(&outs)[0].cached_tokens, 0);
    assert_eq!(e.stats().prefix_queries, 0);
    assert_eq!(e.stats().prefix_hits, 0);
}

#[test]
fn chunked_prefill_spreads_a_long_prompt_over_steps() {
    let p = EngineParams {
        max_num_batched_tokens: 64,
        ..params()
    };
    let mut e = Engine::new(p, cost(), 1);
    e.add_request(req(1, toks(1, 200), 2), 0.0).unwrap();
    let (_, outs) = run(&mut e, 0.0);
    let prefill: Vec<usize> = outs.iter().map(|o| o.shape.prefill_tokens).collect();
    assert_eq!(prefill, vec![64, 64, 64, 8, 0]);
    assert!(outs[..3].iter().all(|o| o.tokens.is_empty()));
    assert_eq!(outs[3].tokens.len(), 1, "first token after the last chunk");
}

#[test]
fn time_advances_per_the_cost_model() {
    let mut e = Engine::new(params(), cost(), 1);
    e.add_request(req(1, toks(1, 100), 3), 1.0).unwrap();
    let (_, outs) = run(&mut e, 1.0);
    let c = cost();
    // Step 1: prefill 100 tokens, context 100.
    let t1 = c.step_overhead
        + c.prefill_overhead
        + 100.0 * c.prefill_per_token
        + 100.0 * c.per_context_token;
    // Steps 2, 3: decode one token with 101 then 102 tokens of context.
    let t2 = c.step_overhead + c.decode_per_seq + 101.0 * c.per_context_token;
    let t3 = c.step_overhead + c.decode_per_seq + 102.0 * c.per_context_token;
    let durations: Vec<f64> = outs.iter().map(|o| o.end - o.start).collect();
    for (got, want) in durations.iter().zip([t1, t2, t3]) {
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    }
    assert_eq!(outs.len(), 3);
    let s = e.stats();
    assert!((s.ttft.sum - t1).abs() < 1e-12);
    assert!((s.itl.sum - (t2 + t3)).abs() < 1e-12);
    assert!((s.e2e.sum - (t1 + t2 + t3)).abs() < 1e-12);
    assert!((s.busy_time - (t1 + t2 + t3)).abs() < 1e-12);
}

#[test]
fn slowdown_multiplies_step_time() {
    let mut a = Engine::new(params(), cost(), 1);
    let mut b = Engine::new(params(), cost(), 1);
    b.set_slowdown(4.0);
    for e in [&mut a, &mut b] {
        e.add_request(req(1, toks(1, 50), 5), 0.0).unwrap();
    }
    let (ta, _) = run(&mut a, 0.0);
    let (tb, _) = run(&mut b, 0.0);
    assert!((tb - 4.0 * ta).abs() < 1e-9);
}

#[test]
fn abort_frees_blocks_and_counts() {
    let mut e = Engine::new(params(), cost(), 1);
    e.add_request(req(1, toks(1, 40), 50), 0.0).unwrap();
    e.add_request(req(2, toks(500, 40), 50), 0.0).unwrap();
    let o = e.step(0.0);
    assert_eq!(e.num_running(), 2);
    let held = e.blocks_of(1).unwrap().len();
    assert_eq!(held, 3);
    assert_eq!(e.abort(1), Some(3));
    assert_eq!(e.abort(1), None);
    assert_eq!(e.num_running(), 1);
    assert_eq!(e.stats().finished_with(FinishReason::Abort), 1);
    assert_eq!(e.stats().aborted_blocks_freed, 3);
    let (_, outs) = run(&mut e, o.end);
    assert_eq!(finished(&outs).len(), 1);
    assert_eq!(e.pool().num_free(), 64);
}

#[test]
fn rejects_requests_that_cannot_run() {
    let mut e = Engine::new(params(), cost(), 1);
    assert_eq!(
        e.add_request(req(1, vec![], 1), 0.0),
        Err(AddError::EmptyPrompt)
    );
    assert_eq!(
        e.add_request(req(1, vec![1], 0), 0.0),
        Err(AddError::NoOutput)
    );
    assert!(matches!(
        e.add_request(req(1, toks(1, 1000), 25), 0.0),
        Err(AddError::TooLong {
            requested: 1025,
            ..
        })
    ));
    e.add_request(req(1, vec![1], 1), 0.0).unwrap();
    assert_eq!(
        e.add_request(req(1, vec![1], 1), 0.0),
        Err(AddError::DuplicateId(1))
    );
}

#[test]
fn params_validation_names_the_field() {
    let mut p = params();
    assert!(p.validate().is_ok());
    p.max_num_seqs = 0;
    assert!(p.validate().unwrap_err().contains("max_num_seqs"));
    let p = EngineParams {
        num_blocks: 3,
        ..params()
    };
    assert!(p.validate().unwrap_err().contains("max_model_len"));
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Every step respects the batch limits, blocks are never over-used,
        /// and every request finishes with exactly its max_tokens.
        #[test]
        fn batch_limits_hold_every_step(
            reqs in proptest::collection::vec((1usize..120, 1usize..40, 0u32..4, 0i64..3), 1..24),
            max_num_seqs in 1usize..6,
            max_num_batched_tokens in 16usize..128,
            num_blocks in 12usize..40,
            priority in any::<bool>(),
        ) {
            let p = EngineParams {
                block_size: 16,
                num_blocks,
                max_num_seqs,
                max_num_batched_tokens,
                max_model_len: 160,
                enable_prefix_caching: true,
                priority_scheduling: priority,
            };
            let mut e = Engine::new(p, cost(), 3);
            let mut expected = HashMap::new();
            for (i, &(len, out, family, prio)) in reqs.iter().enumerate() {
                // Requests of one family share a leading run of tokens.
                let mut prompt = toks(family * 1000, len.min(60));
                prompt.extend(toks(100_000 + i as u32 * 200, len.saturating_sub(60)));
                let r = NewRequest { id: i as u64, prompt, max_tokens: out, priority: prio, external_tokens: 0 };
                e.add_request(r, 0.0).unwrap();
                expected.insert(i as u64, out);
            }
            let mut now = 0.0;
            let mut done = 0;
            for _ in 0..20_000 {
                if !e.has_work() { break; }
                let o = e.step(now);
                prop_assert!(!o.is_idle(), "work pending but the step did nothing");
                prop_assert!(o.num_seqs <= max_num_seqs);
                prop_assert!(o.num_tokens <= max_num_batched_tokens);
                prop_assert!(e.num_running() <= max_num_seqs);
                prop_assert!(e.pool().num_free() < num_blocks);
                prop_assert!(o.end >= o.start);
                for f in &o.finished {
                    prop_assert_eq!(f.completion_tokens, expected[&f.id]);
                    done += 1;
                }
                now = o.end;
            }
            prop_assert_eq!(done, reqs.len());
            prop_assert_eq!(e.pool().num_free(), num_blocks - 1);
            prop_assert!(e.stats().prefix_hits <= e.stats().prefix_queries);
        }
    }
}

//! The newer step-cost terms seen through the engine, on its injected clock:
//! the API server's per-request work (its front-end queue) and per-output-
//! token work, and the quadratic attention term of prefill.

use super::cost::attention_pairs;
use super::tests::{cost, finished, params, req, run, toks};
use super::*;

fn with(f: impl FnOnce(&mut CostModel)) -> CostModel {
    let mut c = cost();
    f(&mut c);
    c
}

/// Runs `prompts` (all arriving at 0) to the end on an engine with `c`.
fn drain(p: EngineParams, c: CostModel, prompts: &[(u64, Vec<u32>, usize)]) -> Vec<StepOutcome> {
    let mut e = Engine::new(p, c, 1);
    for (id, prompt, out) in prompts {
        e.add_request(req(*id, prompt.clone(), *out), 0.0).unwrap();
    }
    run(&mut e, 0.0).1
}

fn durations(outs: &[StepOutcome]) -> Vec<f64> {
    outs.iter().map(|o| o.end - o.start).collect()
}

/// Request 0 starts alone; after its first step, `later` arrive together.
fn busy_then(c: CostModel, p: EngineParams, later: &[(u64, Vec<u32>, usize)]) -> Vec<StepOutcome> {
    let mut e = Engine::new(p, c, 1);
    e.add_request(req(0, toks(9000, 40), 40), 0.0).unwrap();
    let first = e.step(0.0);
    for (id, prompt, out) in later {
        e.add_request(req(*id, prompt.clone(), *out), first.end)
            .unwrap();
    }
    let mut outs = vec![first.clone()];
    outs.extend(run(&mut e, first.end).1);
    outs
}

#[test]
fn api_per_request_shares_the_steps_that_run_while_others_are_busy() {
    let later = [(1, toks(1, 40), 3), (2, toks(500, 40), 3)];
    let base = busy_then(cost(), params(), &later);
    let api = busy_then(with(|c| c.api_per_request = 0.004), params(), &later);
    // The lone first request met an idle engine: no front-end work.
    assert_eq!(api[0].front_end_time, 0.0);
    assert!((api[0].end - base[0].end).abs() < 1e-12);
    // The newcomers' 8 ms are spread over the steps while they last: no
    // step carries more front-end work than its own engine time.
    let spent: f64 = api.iter().map(|o| o.front_end_time).sum();
    assert!((spent - 0.008).abs() < 1e-12, "{spent}");
    for o in &api {
        assert!(o.front_end_time <= (o.end - o.start) / 2.0 + 1e-12);
    }
    let spread = api.iter().filter(|o| o.front_end_time > 0.0).count();
    assert!(spread > 1, "one step took it all");
    assert_eq!(api.iter().map(|o| o.front_end_done).sum::<usize>(), 2);
    // The newcomers reach the scheduler, and their first token, later.
    let first_token = |outs: &[StepOutcome], id: u64| {
        outs.iter()
            .find(|o| o.tokens.iter().any(|t| t.id == id && t.index == 0))
            .map(|o| o.end)
            .unwrap()
    };
    for id in [1, 2] {
        assert!(first_token(&api, id) > first_token(&base, id));
    }
    assert_eq!(finished(&api).len(), 3);
}

#[test]
fn api_per_request_is_paid_once_even_after_preemption() {
    // The cache of `preemption_when_blocks_run_out_and_everyone_finishes`:
    // three requests that cannot all stay resident.
    let p = EngineParams {
        num_blocks: 11,
        max_model_len: 160,
        ..params()
    };
    let later: Vec<_> = (1..3u64)
        .map(|i| (i, toks(1000 * (i as u32 + 1), 40), 40))
        .collect();
    let outs = busy_then(with(|c| c.api_per_request = 0.004), p, &later);
    let preempted: usize = outs.iter().map(|o| o.preempted.len()).sum();
    assert!(preempted >= 1, "the workload must preempt");
    let spent: f64 = outs.iter().map(|o| o.front_end_time).sum();
    assert!(
        (spent - 0.008).abs() < 1e-12,
        "one charge per late request, re-admissions free: {spent}"
    );
    assert_eq!(finished(&outs).len(), 3);
}

#[test]
fn an_engine_with_only_front_end_work_still_steps() {
    // 20 ms of front-end work, longer than a decode step.
    let mut e = Engine::new(params(), with(|c| c.api_per_request = 0.020), 1);
    e.add_request(req(0, toks(1, 40), 2), 0.0).unwrap();
    let first = e.step(0.0);
    // Arrives while 0 runs; 0 finishes in the next step, before the
    // newcomer's front-end work is done.
    e.add_request(req(1, toks(77, 40), 1), first.end).unwrap();
    let (_, outs) = run(&mut e, first.end);
    assert_eq!(finished(&outs).len(), 2, "{outs:?}");
    // One step runs nothing but the front end, at the core's full speed.
    let alone: Vec<&StepOutcome> = outs.iter().filter(|o| o.num_seqs == 0).collect();
    assert_eq!(alone.len(), 1);
    assert!((alone[0].end - alone[0].start - alone[0].front_end_time).abs() < 1e-12);
    assert_eq!(alone[0].front_end_done, 1);
    let spent: f64 = outs.iter().map(|o| o.front_end_time).sum();
    assert!((spent - 0.020).abs() < 1e-12);
}

#[test]
fn api_per_output_token_scales_with_the_tokens_a_step_samples() {
    let prompts: Vec<_> = (0..4u64)
        .map(|i| (i, toks(100 * i as u32 + 1, 20), 5))
        .collect();
    let base = drain(params(), cost(), &prompts);
    let api = drain(params(), with(|c| c.api_per_output_token = 0.001), &prompts);
    for (a, b) in api.iter().zip(&base) {
        assert_eq!(a.tokens.len(), b.tokens.len());
        let extra = (a.end - a.start) - (b.end - b.start);
        assert!((extra - 0.001 * a.tokens.len() as f64).abs() < 1e-12);
        assert_eq!(a.shape.output_tokens, a.tokens.len());
    }
    let total: usize = api.iter().map(|o| o.tokens.len()).sum();
    assert_eq!(total, 4 * 5);
}

#[test]
fn a_chunk_that_samples_nothing_pays_no_output_token_cost() {
    let p = EngineParams {
        max_num_batched_tokens: 64,
        ..params()
    };
    let outs = drain(
        p,
        with(|c| c.api_per_output_token = 0.001),
        &[(1, toks(1, 200), 2)],
    );
    let sampled: Vec<usize> = outs.iter().map(|o| o.shape.output_tokens).collect();
    assert_eq!(sampled, vec![0, 0, 0, 1, 1]);
}

#[test]
fn quadratic_attention_is_the_same_whether_or_not_prefill_is_chunked() {
    let k = 1e-7;
    let c = with(|c| c.prefill_attention = k);
    let whole = drain(params(), c.clone(), &[(1, toks(1, 200), 1)]);
    let chunked_params = EngineParams {
        max_num_batched_tokens: 64,
        ..params()
    };
    let chunked = drain(chunked_params, c, &[(1, toks(1, 200), 1)]);
    let pairs = |outs: &[StepOutcome]| outs.iter().map(|o| o.shape.prefill_pairs).sum::<u64>();
    assert_eq!(pairs(&whole), attention_pairs(0, 200));
    assert_eq!(pairs(&chunked), attention_pairs(0, 200));
    // One step: the linear cost plus k per pair.
    let lin = drain(params(), cost(), &[(1, toks(1, 200), 1)]);
    let extra = durations(&whole)[0] - durations(&lin)[0];
    assert!((extra - k * attention_pairs(0, 200) as f64).abs() < 1e-12);
}

#[test]
fn quadratic_attention_skips_the_cached_prefix_but_attends_to_it() {
    // The second identical 64-token prompt finds 3 blocks of 16 in the cache
    // and computes the last 16 tokens: 16 tokens after 48 cached ones.
    let c = with(|c| c.prefill_attention = 1e-7);
    let mut e = Engine::new(params(), c, 1);
    e.add_request(req(1, toks(1, 64), 1), 0.0).unwrap();
    let (now, _) = run(&mut e, 0.0);
    e.add_request(req(2, toks(1, 64), 1), now).unwrap();
    let (_, outs) = run(&mut e, now);
    assert_eq!(outs[0].shape.prefill_tokens, 16);
    assert_eq!(outs[0].shape.prefill_pairs, attention_pairs(48, 16));
}

//! The newer step-cost terms seen through the engine, on its injected clock:
//! the API server's per-request and per-output-token work, and the quadratic
//! attention term of prefill.

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
fn api_per_request_is_charged_to_the_step_that_admits_it_while_others_run() {
    let later = [(1, toks(1, 40), 3), (2, toks(500, 40), 3)];
    let base = busy_then(cost(), params(), &later);
    let api = busy_then(with(|c| c.api_per_request = 0.004), params(), &later);
    assert_eq!(base.len(), api.len());
    let (b, a) = (durations(&base), durations(&api));
    // The lone first request met an idle engine: no charge.
    assert!((a[0] - b[0]).abs() < 1e-12);
    assert_eq!(api[0].shape.new_requests, 0);
    // Step 2 admits both newcomers beside the running one: it pays for both.
    assert_eq!(api[1].shape.new_requests, 2);
    assert!(
        (a[1] - b[1] - 2.0 * 0.004).abs() < 1e-12,
        "{} {}",
        a[1],
        b[1]
    );
    for (x, y) in a[2..].iter().zip(&b[2..]) {
        assert!((x - y).abs() < 1e-12, "later steps do not pay again");
    }
    // Their first tokens come out that much later.
    assert_eq!(api[1].tokens.iter().filter(|t| t.index == 0).count(), 2);
    assert!((api[1].end - base[1].end - 0.008).abs() < 1e-12);
}

#[test]
fn api_per_request_is_not_charged_again_after_preemption() {
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
    let charged: usize = outs.iter().map(|o| o.shape.new_requests).sum();
    assert_eq!(
        charged, 2,
        "one charge per late request, re-admissions free"
    );
    assert_eq!(finished(&outs).len(), 3);
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

//! The newer step-cost terms seen through the engine, on its injected clock:
//! the API server's per-request work (its front-end queue) and per-output-
//! token work (streaming, in the same queue), and the quadratic attention
//! term of prefill.

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

/// Request 0 starts alone; after the engine's first step, `later` arrive
/// together.
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

/// When `id` got its first token.
fn first_token(outs: &[StepOutcome], id: u64) -> f64 {
    outs.iter()
        .find(|o| o.tokens.iter().any(|t| t.id == id && t.index == 0))
        .map(|o| o.end)
        .unwrap()
}

#[test]
fn api_per_request_delays_a_lone_request_on_an_idle_engine() {
    let api = 0.004;
    let base = drain(params(), cost(), &[(0, toks(9000, 40), 3)]);
    let with_api = drain(
        params(),
        with(|c| c.api_per_request = api),
        &[(0, toks(9000, 40), 3)],
    );
    // The engine waits for the API server, then runs as it would have.
    assert_eq!(with_api[0].num_seqs, 0);
    assert!((with_api[0].front_end_time - api).abs() < 1e-12);
    let ttft = |outs: &[StepOutcome]| first_token(outs, 0);
    assert!((ttft(&with_api) - ttft(&base) - api).abs() < 1e-12);
    for (a, b) in durations(&with_api[1..]).iter().zip(durations(&base)) {
        assert!((a - b).abs() < 1e-12);
    }
    assert_eq!(with_api.len(), base.len() + 1);
}

#[test]
fn api_per_request_works_beside_the_steps_one_request_at_a_time() {
    let later = [(1, toks(1, 40), 3), (2, toks(500, 40), 3)];
    let base = busy_then(cost(), params(), &later);
    let api = busy_then(with(|c| c.api_per_request = 0.004), params(), &later);
    // Steps that run a request are not lengthened by the API server's
    // work: the engine time of each is its cost model's.
    let c = cost();
    for o in api.iter().filter(|o| o.num_seqs > 0) {
        assert!((o.end - o.start - c.step_time(&o.shape)).abs() < 1e-12);
    }
    // The two newcomers arrive together and are done 4 and 8 ms later, one
    // after the other, before the scheduler sees them.
    let arrived = api[0].end;
    assert_eq!(api.iter().map(|o| o.front_end_done).sum::<usize>(), 3);
    for (id, done) in [(1, arrived + 0.004), (2, arrived + 0.008)] {
        assert!(first_token(&api, id) > first_token(&base, id));
        assert!(first_token(&api, id) > done);
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
    // One pass through the API server per request, re-admissions free.
    assert_eq!(outs.iter().map(|o| o.front_end_done).sum::<usize>(), 3);
    assert_eq!(finished(&outs).len(), 3);
}

#[test]
fn an_engine_with_only_front_end_work_still_steps() {
    // 20 ms of API-server work, longer than the running request's steps.
    let mut e = Engine::new(params(), with(|c| c.api_per_request = 0.020), 1);
    e.add_request(req(0, toks(1, 40), 2), 0.0).unwrap();
    let (now, _) = run(&mut e, 0.0);
    e.add_request(req(1, toks(77, 40), 1), now).unwrap();
    let (_, outs) = run(&mut e, now);
    assert_eq!(finished(&outs).len(), 1, "{outs:?}");
    // One step runs nothing but waits for the API server.
    let alone: Vec<&StepOutcome> = outs.iter().filter(|o| o.num_seqs == 0).collect();
    assert_eq!(alone.len(), 1);
    assert!((alone[0].end - alone[0].start - 0.020).abs() < 1e-12);
    assert_eq!(outs[1].front_end_done, 1);
}

#[test]
fn api_per_output_token_does_not_lengthen_the_steps() {
    let prompts: Vec<_> = (0..4u64)
        .map(|i| (i, toks(100 * i as u32 + 1, 20), 5))
        .collect();
    let base = drain(params(), cost(), &prompts);
    let api = drain(params(), with(|c| c.api_per_output_token = 0.001), &prompts);
    assert_eq!(durations(&api), durations(&base));
    let total: usize = api.iter().map(|o| o.tokens.len()).sum();
    assert_eq!(total, 4 * 5);
}

/// Runs `e` from `now` until idle, handing each step's outputs to the API
/// server as the driver does; returns `(request, token index, when the
/// client gets it)` for every token.
fn streamed(e: &mut Engine, mut now: f64) -> (f64, Vec<(u64, usize, f64)>) {
    let mut got = Vec::new();
    for _ in 0..10_000 {
        if !e.has_work() {
            break;
        }
        let o = e.step(now);
        now = o.end;
        let at = e.stream_out(o.end, o.tokens.len());
        assert!(at >= o.end);
        got.extend(o.tokens.iter().map(|t| (t.id, t.index, at)));
    }
    (now, got)
}

/// An engine under `c` with `n` requests of 20 distinct prompt tokens and
/// `output` output tokens each, all arrived at 0.
fn loaded(c: CostModel, n: u64, output: usize) -> Engine {
    let mut e = Engine::new(params(), c, 1);
    for i in 0..n {
        e.add_request(req(i, toks(100 * i as u32 + 1, 20), output), 0.0)
            .unwrap();
    }
    e
}

fn first_streamed(got: &[(u64, usize, f64)], id: u64) -> f64 {
    got.iter()
        .find(|&&(r, i, _)| r == id && i == 0)
        .map(|&(_, _, at)| at)
        .unwrap()
}

#[test]
fn a_burst_being_taken_in_holds_back_the_tokens_of_its_first_requests() {
    // Six requests at once, 4 ms of API-server work each: the first reaches
    // the scheduler at 4 ms and gets its token from the engine soon after,
    // but the API server streams it only once the burst is in (24 ms).
    let burst = |c: CostModel| {
        let mut e = loaded(c, 6, 2);
        streamed(&mut e, 0.0).1
    };
    let got = burst(with(|c| c.api_per_request = 0.004));
    let first = first_streamed(&got, 0);
    assert!((first - 0.024).abs() < 1e-12, "{got:?}");
    // Nothing reaches a client before the burst is in.
    assert!(got.iter().all(|&(_, _, at)| at >= 0.024 - 1e-12), "{got:?}");
    // Without API-server work every step's tokens are streamed at its end.
    let mut e = loaded(cost(), 6, 2);
    let mut now = 0.0;
    while e.has_work() {
        let o = e.step(now);
        now = o.end;
        assert_eq!(e.stream_out(o.end, o.tokens.len()), o.end);
    }
}

#[test]
fn a_newcomer_waits_behind_the_tokens_the_api_server_streams() {
    // Four requests decode; when one of their steps ends a newcomer
    // arrives. Returns its first token's streaming time and the step's end.
    let newcomer = |c: CostModel| {
        let mut e = loaded(c, 4, 8);
        let mut now = 0.0;
        loop {
            let o = e.step(now);
            now = o.end;
            e.stream_out(o.end, o.tokens.len());
            if o.tokens.len() == 4 {
                break;
            }
        }
        e.add_request(req(9, toks(7000, 20), 1), now).unwrap();
        let (_, got) = streamed(&mut e, now);
        (first_streamed(&got, 9), now)
    };
    let api = 0.002;
    let (plain, at) = newcomer(with(|c| c.api_per_request = api));
    let (behind, at2) = newcomer(with(|c| {
        c.api_per_request = api;
        c.api_per_output_token = 0.003;
    }));
    // The token work does not lengthen the steps.
    assert_eq!(at, at2);
    // Its own work, then a step; with 3 ms a token, the API server first
    // streams the four running requests' tokens of each step (12 ms).
    assert!(plain > at + api, "{plain} {at}");
    assert!(behind > at2 + api + 0.012, "{behind} {at2}");
    assert!(behind - at2 > plain - at, "{behind} {plain}");
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

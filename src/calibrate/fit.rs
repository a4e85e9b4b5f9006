//! Fits the replica simulator's step-time model ([`CostModel`]) to what the
//! probes measured, by ordinary least squares on a few small linear systems.
//!
//! - **decode** (short and long contexts): the client's median inter-token
//!   latency at batch size `B` is one step, `step_overhead + decode_per_seq
//!   B + per_context_token C`, where `C = B (prompt + output / 2)` is the
//!   context the step attends (the prompt plus half the output, on average);
//! - **prefill** (one request at a time, prompts of growing length `L`):
//!   the time to first token is `a + b L + c L (L + 1) / 2`; `c` is
//!   `prefill_attention` (attention's query-key pairs), `b` less the context
//!   term is `prefill_per_token`, and `a` less a step and less the API
//!   server's work per request (below) is `prefill_overhead`: the simulator
//!   charges that work to every request before the scheduler sees it, so a
//!   step that admits a prompt must not pay it again;
//! - **requests** (bursts of short requests, a closed loop, with one and
//!   with eight output tokens): the API server works beside the engine, one
//!   piece of work at a time, so the wall time per request is the larger of
//!   its work on the request and its streamed tokens (`api_per_request +
//!   tokens × api_per_output_token`) and the engine's share (its steps batch
//!   up to `max_num_seqs` of them). When the API server is the bottleneck
//!   of both bursts, the slope between them is its work per token and the
//!   rest its work per request; when the engine is, the probe does not tell
//!   the API server's work apart and it stays in the prefill overhead.
//!
//! Two readings guard against a replica's hiccups: a lone prompt's time to
//! first token is the replica's own mean unless a slow request pushed it
//! above the client's median, and a decode group's gap is the client's
//! unless it is under half the replica's own inter-token mean (the API
//! server handed the stream over in bursts).
//!
//! Negative solutions (noise around a term the hardware does not show) are
//! clamped to 0. The same model as `scripts/sim_fidelity.py --fit`, which
//! this replaces. Cost: a 3x3 solve per group.

use serde::Serialize;

use crate::replica_sim::engine::CostModel;

/// What one probe group measured (seconds; `None` when nothing came back).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Measured {
    pub kind: ProbeKind,
    pub concurrency: usize,
    pub prompt_len: usize,
    pub max_tokens: usize,
    /// Requests answered in full.
    pub ok: usize,
    /// Requests that failed (their first error is in `error`).
    pub failed: usize,
    pub error: Option<String>,
    /// Wall time of the group.
    pub wall: f64,
    /// Client-side median time to first token.
    pub ttft_p50: Option<f64>,
    /// Client-side token gap: the median over requests of each request's
    /// mean gap over its decode steps (the gaps between its tokens, less
    /// those in which another request of the group got its first token:
    /// that step also ran a prefill), which chunks read together or steps
    /// run late do not shrink.
    pub itl_p50: Option<f64>,
    /// The replica's own mean time to first token over the group (from its
    /// `/metrics`), when it exports one.
    pub server_ttft_mean: Option<f64>,
    /// The replica's own mean inter-token latency over the group, when it
    /// exports one.
    pub server_itl_mean: Option<f64>,
    /// Output tokens per second over the group.
    pub throughput: f64,
}

impl Measured {
    /// One probe sent in several rounds, as one: each figure is its median
    /// over the rounds that answered, requests and failures are summed.
    /// `None` for no round.
    pub fn merge(rounds: &[Measured]) -> Option<Measured> {
        let first = rounds.first()?;
        let answered: Vec<&Measured> = rounds.iter().filter(|m| m.ok > 0).collect();
        let med = |f: &dyn Fn(&Measured) -> Option<f64>| {
            median(answered.iter().filter_map(|m| f(m)).collect())
        };
        Some(Measured {
            ok: rounds.iter().map(|m| m.ok).sum(),
            failed: rounds.iter().map(|m| m.failed).sum(),
            error: rounds.iter().find_map(|m| m.error.clone()),
            wall: med(&|m| Some(m.wall)).unwrap_or(first.wall),
            ttft_p50: med(&|m| m.ttft_p50),
            itl_p50: med(&|m| m.itl_p50),
            server_ttft_mean: med(&|m| m.server_ttft_mean),
            server_itl_mean: med(&|m| m.server_itl_mean),
            throughput: med(&|m| Some(m.throughput)).unwrap_or(0.0),
            ..first.clone()
        })
    }
}

/// The middle value (the mean of the two middle ones for an even count).
fn median(mut xs: Vec<f64>) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    Some(crate::bench::stats::percentile(&xs, 50.0))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProbeKind {
    Prefill,
    Decode,
    DecodeLong,
    Requests,
}

impl ProbeKind {
    pub fn label(self) -> &'static str {
        match self {
            ProbeKind::Prefill => "prefill",
            ProbeKind::Decode => "decode",
            ProbeKind::DecodeLong => "decode, long context",
            ProbeKind::Requests => "requests",
        }
    }
}

/// One row of the fitted-against-measured table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    pub kind: ProbeKind,
    pub concurrency: usize,
    pub prompt_len: usize,
    /// What was compared: `ttft` (prefill), `itl` (decode), `per_request`.
    pub what: &'static str,
    pub measured: f64,
    pub fitted: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Fit {
    pub cost: CostModel,
    pub rows: Vec<Row>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FitError {
    #[error("too few {0} probes answered to fit the model (need {1})")]
    TooFew(&'static str, usize),
    #[error(
        "the {0} probes do not determine the model (their lengths or batch sizes are all alike)"
    )]
    Singular(&'static str),
}

/// Least squares for `rows` of `(x_1..x_n, y)`: the `x` minimising
/// `|A x - y|²`, by the normal equations and Gaussian elimination with
/// partial pivoting. `None` when the system is singular.
pub fn least_squares<const N: usize>(rows: &[([f64; N], f64)]) -> Option<[f64; N]> {
    let mut ata = [[0.0; N]; N];
    let mut aty = [0.0; N];
    for (x, y) in rows {
        for i in 0..N {
            for j in 0..N {
                ata[i][j] += x[i] * x[j];
            }
            aty[i] += x[i] * y;
        }
    }
    // Scale-aware singularity test: columns differ by orders of magnitude.
    let scale: f64 = (0..N).map(|i| ata[i][i].abs()).fold(0.0, f64::max);
    for c in 0..N {
        let p = (c..N).max_by(|&a, &b| ata[a][c].abs().total_cmp(&ata[b][c].abs()))?;
        ata.swap(c, p);
        aty.swap(c, p);
        if ata[c][c].abs() <= scale * 1e-14 {
            return None;
        }
        let pivot = ata[c];
        for k in c + 1..N {
            let f = ata[k][c] / pivot[c];
            for (a, p) in ata[k][c..].iter_mut().zip(&pivot[c..]) {
                *a -= f * p;
            }
            aty[k] -= f * aty[c];
        }
    }
    let mut x = [0.0; N];
    for c in (0..N).rev() {
        let tail: f64 = (c + 1..N).map(|k| ata[c][k] * x[k]).sum();
        x[c] = (aty[c] - tail) / ata[c][c];
    }
    Some(x)
}

/// A lone prompt's time to first token: the replica's own mean, which
/// leaves out the client's HTTP path, unless one slow request (the first
/// after the replica started, say) pushed it above the client's median.
fn prefill_time(m: &Measured) -> Option<f64> {
    match (m.server_ttft_mean, m.ttft_p50) {
        (Some(s), Some(c)) => Some(s.min(c)),
        (s, c) => s.or(c),
    }
}

/// A decode step as the client saw it, unless the client's gap is under
/// half the replica's own mean: then the API server handed the tokens over
/// in bursts (it got the CPU late) and the client's gaps say nothing about
/// the steps, so the replica's mean stands in.
fn decode_gap(m: &Measured) -> Option<f64> {
    match (m.itl_p50, m.server_itl_mean) {
        (Some(c), Some(s)) if c < s / 2.0 => Some(s),
        (c, s) => c.or(s),
    }
}

fn pairs(l: usize) -> f64 {
    let l = l as f64;
    l * (l + 1.0) / 2.0
}

/// The context one decode step of `m` attends: the batch times the prompt
/// plus half the output.
fn decode_context(m: &Measured) -> f64 {
    m.concurrency as f64 * (m.prompt_len as f64 + m.max_tokens as f64 / 2.0)
}

/// Fits the cost model to `probes` (see the module docs). `max_num_seqs`
/// bounds the batch of the requests probe.
pub fn fit(probes: &[Measured], max_num_seqs: usize) -> Result<Fit, FitError> {
    let of = |kind| probes.iter().filter(move |m| m.kind == kind && m.ok > 0);
    let decode: Vec<_> = of(ProbeKind::Decode)
        .chain(of(ProbeKind::DecodeLong))
        .filter_map(|m| decode_gap(m).map(|g| (m, g)))
        .collect();
    if decode.len() < 3 {
        return Err(FitError::TooFew("decode", 3));
    }
    let rows: Vec<_> = decode
        .iter()
        .map(|&(m, g)| ([1.0, m.concurrency as f64, decode_context(m)], g))
        .collect();
    let [_, _, per_ctx] = least_squares(&rows).ok_or(FitError::Singular("decode"))?;
    let per_ctx = per_ctx.max(0.0);
    // Refit the first two with the context term fixed when it was clamped,
    // so the clamp does not bias them.
    let (step, per_seq) = {
        let rows: Vec<_> = decode
            .iter()
            .map(|&(m, g)| ([1.0, m.concurrency as f64], g - per_ctx * decode_context(m)))
            .collect();
        let [s, p] = least_squares(&rows).ok_or(FitError::Singular("decode"))?;
        (s.max(0.0), p.max(0.0))
    };

    let prefill: Vec<_> = of(ProbeKind::Prefill)
        .filter_map(|m| prefill_time(m).map(|t| (m, t)))
        .collect();
    if prefill.len() < 3 {
        return Err(FitError::TooFew("prefill", 3));
    }
    let rows: Vec<_> = prefill
        .iter()
        .map(|(m, t)| ([1.0, m.prompt_len as f64, pairs(m.prompt_len)], *t))
        .collect();
    let [a, b, c] = least_squares(&rows).ok_or(FitError::Singular("prefill"))?;
    let c = c.max(0.0);
    let prefill_per_token = (b - per_ctx).max(0.0);

    // The intercept `a` of a lone prompt's time to first token holds the
    // API server's work on the request, then the step and the engine's own
    // prefill overhead. A requests probe (k at a time, T output tokens each,
    // wall time w per request) is bound by the API server when w exceeds
    // the engine's share per request; then w is the API server's work on a
    // request and its T streamed tokens. Two such probes of different T
    // give the work per token (the slope) and per request (the rest, capped
    // at what the intercept leaves beside the step).
    let decode_step = |k: f64, m: &Measured| {
        step + per_seq * k + per_ctx * k * (m.prompt_len as f64 + m.max_tokens as f64 / 2.0)
    };
    let engine_share = |m: &Measured, overhead: f64| {
        let k = m.concurrency.min(max_num_seqs).max(1) as f64;
        let l = m.prompt_len as f64;
        let decodes = m.max_tokens.saturating_sub(1) as f64;
        (overhead + k * l * b + c * k * pairs(m.prompt_len) + decodes * decode_step(k, m)) / k
    };
    let requests: Vec<_> = of(ProbeKind::Requests)
        .map(|m| (m, m.wall / m.ok as f64))
        .collect();
    let bound: Vec<_> = requests
        .iter()
        .filter(|&&(m, w)| w > engine_share(m, a))
        .map(|&(m, w)| ([1.0, m.max_tokens as f64], w))
        .collect();
    let (per_request, api_per_output_token) = match least_squares(&bound) {
        Some([r, t]) if t > 0.0 => (r + t, t),
        _ => match bound.first() {
            Some(&(_, w)) => (w, 0.0),
            None => (0.0, 0.0),
        },
    };
    // `per_request` is a one-token request's work: its own and its token's.
    let api_per_request = (per_request - api_per_output_token)
        .min((a - step).max(0.0))
        .max(0.0);
    let prefill_overhead = (a - step - api_per_request).max(0.0);
    let request_rows: Vec<_> = requests
        .into_iter()
        .map(|(m, w)| {
            let api = api_per_request + api_per_output_token * m.max_tokens as f64;
            (m, w, engine_share(m, step + prefill_overhead).max(api))
        })
        .collect();
    let cost = CostModel {
        step_overhead: step,
        prefill_overhead,
        prefill_per_token,
        decode_per_seq: per_seq,
        per_context_token: per_ctx,
        prefill_attention: c,
        api_per_request,
        api_per_output_token,
    };

    let mut out = Vec::new();
    for (m, t) in &prefill {
        out.push(Row {
            kind: m.kind,
            concurrency: m.concurrency,
            prompt_len: m.prompt_len,
            what: "ttft",
            measured: *t,
            fitted: api_per_request
                + step
                + prefill_overhead
                + (prefill_per_token + per_ctx) * m.prompt_len as f64
                + c * pairs(m.prompt_len),
        });
    }
    for &(m, g) in &decode {
        out.push(Row {
            kind: m.kind,
            concurrency: m.concurrency,
            prompt_len: m.prompt_len,
            what: "itl",
            measured: g,
            fitted: step + per_seq * m.concurrency as f64 + per_ctx * decode_context(m),
        });
    }
    for (m, per_request, fitted) in request_rows {
        out.push(Row {
            kind: m.kind,
            concurrency: m.concurrency,
            prompt_len: m.prompt_len,
            what: "per_request",
            measured: per_request,
            fitted,
        });
    }
    Ok(Fit { cost, rows: out })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(
        kind: ProbeKind,
        concurrency: usize,
        prompt_len: usize,
        max_tokens: usize,
    ) -> Measured {
        Measured {
            kind,
            concurrency,
            prompt_len,
            max_tokens,
            ok: 4,
            failed: 0,
            error: None,
            wall: 1.0,
            ttft_p50: None,
            itl_p50: None,
            server_ttft_mean: None,
            server_itl_mean: None,
            throughput: 0.0,
        }
    }

    #[test]
    fn rounds_merge_to_each_figures_median() {
        let round = |ttft: f64, throughput: f64, ok: usize| Measured {
            ttft_p50: Some(ttft),
            throughput,
            ok,
            failed: 4 - ok,
            error: (ok < 4).then(|| "reset".to_string()),
            ..probe(ProbeKind::Prefill, 1, 256, 2)
        };
        // The slow spell (0.100 s) of the second round does not decide.
        let m = Measured::merge(&[
            round(0.012, 300.0, 4),
            round(0.100, 90.0, 4),
            round(0.013, 280.0, 3),
        ])
        .unwrap();
        assert_eq!(m.ttft_p50, Some(0.013));
        assert_eq!(m.throughput, 280.0);
        assert_eq!((m.ok, m.failed), (11, 1));
        assert_eq!(m.error.as_deref(), Some("reset"));
        assert_eq!((m.kind, m.prompt_len), (ProbeKind::Prefill, 256));
        // A round that answered nothing has no say; two rounds give the mean.
        let m = Measured::merge(&[
            round(0.012, 300.0, 4),
            round(0.5, 0.0, 0),
            round(0.014, 320.0, 4),
        ])
        .unwrap();
        assert!((m.ttft_p50.unwrap() - 0.013).abs() < 1e-12);
        assert_eq!(m.throughput, 310.0);
        assert!(Measured::merge(&[]).is_none());
    }

    #[test]
    fn least_squares_recovers_an_exact_plane() {
        let truth = [0.5, -2.0, 3.0];
        let rows: Vec<_> = [(1.0, 2.0), (3.0, 1.0), (0.0, 5.0), (2.0, 2.0)]
            .iter()
            .map(|&(u, v)| ([1.0, u, v], truth[0] + truth[1] * u + truth[2] * v))
            .collect();
        let x = least_squares(&rows).unwrap();
        for (got, want) in x.iter().zip(truth) {
            assert!((got - want).abs() < 1e-9, "{x:?}");
        }
        // The same x twice: singular.
        assert!(least_squares(&[([1.0, 2.0], 1.0), ([2.0, 4.0], 2.0)]).is_none());
    }

    /// Probes generated from a known cost model are fitted back to it.
    #[test]
    fn fit_recovers_the_model_that_made_the_probes() {
        let truth = CostModel {
            step_overhead: 0.003,
            prefill_overhead: 0.002,
            prefill_per_token: 3e-5,
            decode_per_seq: 6e-4,
            per_context_token: 2e-8,
            prefill_attention: 7e-8,
            api_per_request: 0.002,
            api_per_output_token: 0.001,
        };
        let mut probes = Vec::new();
        for l in [16, 128, 256, 512, 1024, 1536] {
            // A lone request: the API server's work, then one step.
            let mut m = probe(ProbeKind::Prefill, 1, l, 2);
            m.server_ttft_mean = Some(
                truth.api_per_request
                    + truth.step_overhead
                    + truth.prefill_overhead
                    + (truth.prefill_per_token + truth.per_context_token) * l as f64
                    + truth.prefill_attention * pairs(l),
            );
            probes.push(m);
        }
        for (kind, b, l, out) in [
            (ProbeKind::Decode, 1, 16, 96),
            (ProbeKind::Decode, 4, 16, 96),
            (ProbeKind::Decode, 16, 16, 96),
            (ProbeKind::DecodeLong, 1, 1024, 64),
            (ProbeKind::DecodeLong, 3, 1024, 64),
        ] {
            let mut m = probe(kind, b, l, out);
            m.itl_p50 = Some(
                truth.step_overhead
                    + truth.decode_per_seq * b as f64
                    + truth.per_context_token * decode_context(&m),
            );
            probes.push(m);
        }
        // The API server (2 ms a request, 1 ms a token) is slower than the
        // engine's share of a batch of 32 in both bursts: it sets the pace.
        for tokens in [1, 8] {
            let mut r = probe(ProbeKind::Requests, 32, 16, tokens);
            r.ok = 160;
            r.wall = 160.0 * (truth.api_per_request + truth.api_per_output_token * tokens as f64);
            probes.push(r);
        }

        let f = fit(&probes, 32).unwrap();
        let close = |name: &str, got: f64, want: f64| {
            assert!(
                (got - want).abs() <= 1e-6 * want.max(1e-3),
                "{name}: fitted {got:e}, made with {want:e}"
            );
        };
        close("step_overhead", f.cost.step_overhead, truth.step_overhead);
        close(
            "decode_per_seq",
            f.cost.decode_per_seq,
            truth.decode_per_seq,
        );
        close(
            "per_context_token",
            f.cost.per_context_token,
            truth.per_context_token,
        );
        close(
            "prefill_per_token",
            f.cost.prefill_per_token,
            truth.prefill_per_token,
        );
        close(
            "prefill_attention",
            f.cost.prefill_attention,
            truth.prefill_attention,
        );
        close(
            "api_per_request",
            f.cost.api_per_request,
            truth.api_per_request,
        );
        close(
            "api_per_output_token",
            f.cost.api_per_output_token,
            truth.api_per_output_token,
        );
        close(
            "prefill_overhead",
            f.cost.prefill_overhead,
            truth.prefill_overhead,
        );
        for row in &f.rows {
            close(row.what, row.fitted, row.measured);
        }
        assert_eq!(f.rows.len(), 13);
    }

    /// When the engine, not the API server, sets the pace of the requests
    /// probe, the API server's work cannot be told apart: it stays in the
    /// prefill overhead, and a lone prompt's time to first token still
    /// comes out whole.
    #[test]
    fn an_engine_bound_requests_probe_leaves_the_api_work_in_the_prefill_overhead() {
        let (step, intercept, per_token) = (0.004, 0.009, 2e-5);
        let mut probes = Vec::new();
        for l in [16, 256, 1024] {
            let mut m = probe(ProbeKind::Prefill, 1, l, 2);
            m.server_ttft_mean = Some(intercept + per_token * l as f64);
            probes.push(m);
        }
        for (kind, b, l) in [
            (ProbeKind::Decode, 1, 16),
            (ProbeKind::Decode, 16, 16),
            (ProbeKind::DecodeLong, 1, 1024),
            (ProbeKind::DecodeLong, 3, 1024),
        ] {
            let mut m = probe(kind, b, l, 64);
            m.itl_p50 = Some(step + 1e-4 * b as f64);
            probes.push(m);
        }
        // 512-token prompts: the engine's share of a batch of 32 is
        // (9 ms + 32 x 512 x 20 us) / 32 = 10.5 ms a request; the wall time
        // measured a little under it (noise).
        let mut r = probe(ProbeKind::Requests, 32, 512, 1);
        r.ok = 160;
        let engine = (intercept + 32.0 * 512.0 * per_token) / 32.0;
        r.wall = 160.0 * engine * 0.98;
        probes.push(r);
        let f = fit(&probes, 32).unwrap();
        assert_eq!(f.cost.api_per_request, 0.0);
        assert!((f.cost.prefill_overhead - (intercept - step)).abs() < 1e-9);
        for row in f.rows.iter().filter(|r| r.what == "ttft") {
            assert!((row.fitted - row.measured).abs() < 1e-9, "{row:?}");
        }
    }

    /// A slow first request inflates the replica's mean time to first
    /// token, and a stream handed over in one burst shrinks the client's
    /// token gap to nothing; neither becomes the figure the fit uses.
    #[test]
    fn a_slow_first_request_or_a_burst_stream_is_not_read_as_a_step() {
        let mut p = probe(ProbeKind::Prefill, 1, 16, 2);
        p.server_ttft_mean = Some(0.057);
        p.ttft_p50 = Some(0.0127);
        assert_eq!(prefill_time(&p), Some(0.0127));
        p.server_ttft_mean = Some(0.0105);
        assert_eq!(prefill_time(&p), Some(0.0105));
        let mut d = probe(ProbeKind::Decode, 1, 16, 96);
        d.itl_p50 = Some(0.000_001);
        d.server_itl_mean = Some(0.0045);
        assert_eq!(decode_gap(&d), Some(0.0045));
        d.itl_p50 = Some(0.0049);
        assert_eq!(decode_gap(&d), Some(0.0049));
        d.server_itl_mean = None;
        assert_eq!(decode_gap(&d), Some(0.0049));
    }

    #[test]
    fn too_few_probes_is_an_error_not_a_guess() {
        let mut m = probe(ProbeKind::Decode, 1, 16, 96);
        m.itl_p50 = Some(0.001);
        assert_eq!(fit(&[m], 32), Err(FitError::TooFew("decode", 3)));
    }
}

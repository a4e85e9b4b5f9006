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
//!   term is `prefill_per_token`, and `a` less a step is `prefill_overhead`
//!   (the simulator, like the replica probed one request at a time, charges
//!   no front-end queue to a request that meets an idle engine, so the API
//!   server's work on a lone request stays in this term);
//! - **requests** (many one-token requests at once): the wall time per
//!   request, less the engine's share of it (its steps batch up to
//!   `max_num_seqs` of them), is the API server's work per request
//!   (`api_per_request`).
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
    /// mean gap (first to last token over the gaps between them), which
    /// chunks read together or steps run late do not shrink.
    pub itl_p50: Option<f64>,
    /// The replica's own mean time to first token over the group (from its
    /// `/metrics`), when it exports one.
    pub server_ttft_mean: Option<f64>,
    /// Output tokens per second over the group.
    pub throughput: f64,
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
        .filter(|m| m.itl_p50.is_some())
        .collect();
    if decode.len() < 3 {
        return Err(FitError::TooFew("decode", 3));
    }
    let rows: Vec<_> = decode
        .iter()
        .map(|m| {
            (
                [1.0, m.concurrency as f64, decode_context(m)],
                m.itl_p50.unwrap_or_default(),
            )
        })
        .collect();
    let [_, _, per_ctx] = least_squares(&rows).ok_or(FitError::Singular("decode"))?;
    let per_ctx = per_ctx.max(0.0);
    // Refit the first two with the context term fixed when it was clamped,
    // so the clamp does not bias them.
    let (step, per_seq) = {
        let rows: Vec<_> = decode
            .iter()
            .map(|m| {
                (
                    [1.0, m.concurrency as f64],
                    m.itl_p50.unwrap_or_default() - per_ctx * decode_context(m),
                )
            })
            .collect();
        let [s, p] = least_squares(&rows).ok_or(FitError::Singular("decode"))?;
        (s.max(0.0), p.max(0.0))
    };

    let prefill: Vec<_> = of(ProbeKind::Prefill)
        .filter_map(|m| m.server_ttft_mean.or(m.ttft_p50).map(|t| (m, t)))
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

    let mut api_per_request: f64 = 0.0;
    let mut request_rows = Vec::new();
    for m in of(ProbeKind::Requests) {
        let k = m.concurrency.min(max_num_seqs).max(1) as f64;
        let l = m.prompt_len as f64;
        let engine = (step + (a - step).max(0.0) + k * l * b + c * k * pairs(m.prompt_len)) / k;
        let per_request = m.wall / m.ok as f64;
        api_per_request = (per_request - engine).max(0.0);
        request_rows.push((m, per_request, engine));
    }
    let prefill_overhead = (a - step).max(0.0);
    let cost = CostModel {
        step_overhead: step,
        prefill_overhead,
        prefill_per_token,
        decode_per_seq: per_seq,
        per_context_token: per_ctx,
        prefill_attention: c,
        api_per_request,
        api_per_output_token: 0.0,
    };

    let mut out = Vec::new();
    for (m, t) in &prefill {
        out.push(Row {
            kind: m.kind,
            concurrency: m.concurrency,
            prompt_len: m.prompt_len,
            what: "ttft",
            measured: *t,
            fitted: step
                + prefill_overhead
                + (prefill_per_token + per_ctx) * m.prompt_len as f64
                + c * pairs(m.prompt_len),
        });
    }
    for m in &decode {
        out.push(Row {
            kind: m.kind,
            concurrency: m.concurrency,
            prompt_len: m.prompt_len,
            what: "itl",
            measured: m.itl_p50.unwrap_or_default(),
            fitted: step + per_seq * m.concurrency as f64 + per_ctx * decode_context(m),
        });
    }
    for (m, per_request, engine) in request_rows {
        out.push(Row {
            kind: m.kind,
            concurrency: m.concurrency,
            prompt_len: m.prompt_len,
            what: "per_request",
            measured: per_request,
            fitted: engine + api_per_request,
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
            throughput: 0.0,
        }
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
            prefill_per_token: 3e-4,
            decode_per_seq: 6e-4,
            per_context_token: 2e-8,
            prefill_attention: 7e-8,
            api_per_request: 0.002,
            api_per_output_token: 0.0,
        };
        let mut probes = Vec::new();
        for l in [16, 128, 256, 512, 1024, 1536] {
            let mut m = probe(ProbeKind::Prefill, 1, l, 2);
            m.server_ttft_mean = Some(
                truth.step_overhead
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
        let mut r = probe(ProbeKind::Requests, 32, 16, 1);
        r.ok = 160;
        let k = 32.0;
        let a = truth.step_overhead + truth.prefill_overhead;
        let b = truth.prefill_per_token + truth.per_context_token;
        let engine = (truth.step_overhead
            + (a - truth.step_overhead)
            + k * 16.0 * b
            + truth.prefill_attention * k * pairs(16))
            / k;
        r.wall = 160.0 * (engine + truth.api_per_request);
        probes.push(r);

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
            "prefill_overhead",
            f.cost.prefill_overhead,
            truth.prefill_overhead,
        );
        for row in &f.rows {
            close(row.what, row.fitted, row.measured);
        }
        assert_eq!(f.rows.len(), 12);
    }

    #[test]
    fn too_few_probes_is_an_error_not_a_guess() {
        let mut m = probe(ProbeKind::Decode, 1, 16, 96);
        m.itl_p50 = Some(0.001);
        assert_eq!(fit(&[m], 32), Err(FitError::TooFew("decode", 3)));
    }
}

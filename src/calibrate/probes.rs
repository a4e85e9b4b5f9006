//! The probes: which requests the calibration sends, and how one group of
//! them is sent and measured.
//!
//! Every prompt is a list of token ids (`/v1/completions` takes one), drawn
//! at random per request so nothing is found in the prefix cache, and every
//! request asks for exactly `max_tokens` (`ignore_eos`). The plan is sized to
//! the replica: prompts fit its context, and a batch of decodes fits its KV
//! cache (a probe that preempts measures preemption, not a step).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::fit::{Measured, ProbeKind};
use super::replica::Replica;
use crate::bench::client::BenchClient;
use crate::bench::record::{Outcome, RequestRecord};
use crate::bench::text::SplitMix;
use crate::bench::workload::{Prompt, RequestSpec};

/// One group: `requests` requests of `prompt_len` token ids and `max_tokens`
/// output each, `concurrency` at a time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Group {
    pub kind: ProbeKind,
    pub prompt_len: usize,
    pub max_tokens: usize,
    pub concurrency: usize,
    pub requests: usize,
}

/// What the plan is sized to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub max_model_len: usize,
    pub max_num_seqs: usize,
    /// Tokens the KV cache holds and its block size, when the replica says.
    pub kv_tokens: Option<usize>,
    pub block_size: usize,
}

impl Shape {
    /// Most requests of `tokens` tokens each whose blocks fit the cache at once.
    fn fitting(&self, tokens: usize) -> usize {
        let per_seq = tokens.div_ceil(self.block_size.max(1)) * self.block_size.max(1);
        let by_kv = self.kv_tokens.map_or(usize::MAX, |kv| kv / per_seq.max(1));
        by_kv.min(self.max_num_seqs).max(1)
    }
}

/// The groups to send, in order: prefills of growing length one at a time,
/// decode batches of growing size, bursts of one- and eight-token requests,
/// decodes over a long context.
pub fn plan(shape: &Shape) -> Vec<Group> {
    let mut groups = Vec::new();
    let longest = shape
        .max_model_len
        .saturating_sub(4)
        .min(shape.kv_tokens.unwrap_or(usize::MAX));
    for len in [16, 128, 256, 512, 1024, 1536, 3072, 6144] {
        if len <= longest {
            groups.push(Group {
                kind: ProbeKind::Prefill,
                prompt_len: len,
                max_tokens: 2,
                concurrency: 1,
                requests: 8,
            });
        }
    }
    let (prompt, out) = (16, 96.min(shape.max_model_len.saturating_sub(17)).max(8));
    let most = shape.fitting(prompt + out);
    let mut sizes: Vec<usize> = [1, 4, 16, 64, 256]
        .into_iter()
        .filter(|&b| b < most)
        .collect();
    sizes.push(most);
    sizes.dedup();
    for b in sizes {
        groups.push(Group {
            kind: ProbeKind::Decode,
            prompt_len: prompt,
            max_tokens: out,
            concurrency: b,
            requests: (2 * b).max(3),
        });
    }
    // Bursts of short requests, one token each and then eight: the API
    // server's work per request and per streamed token.
    let burst = 32.min(shape.max_num_seqs).max(1);
    for max_tokens in [1, 8] {
        groups.push(Group {
            kind: ProbeKind::Requests,
            prompt_len: 16,
            max_tokens,
            concurrency: burst,
            requests: 5 * burst,
        });
    }
    let long = 1024.min(shape.max_model_len / 2);
    let long_out = 64.min(shape.max_model_len.saturating_sub(long + 1)).max(4);
    let most_long = shape.fitting(long + long_out).min(8);
    let mut long_sizes = vec![1];
    if most_long > 1 {
        long_sizes.push(most_long);
    }
    for b in long_sizes {
        groups.push(Group {
            kind: ProbeKind::DecodeLong,
            prompt_len: long,
            max_tokens: long_out,
            concurrency: b,
            requests: (2 * b).max(3),
        });
    }
    groups
}

/// Random token ids, all different from the first on (so no two prompts
/// share a block), below 4,000 and above the ids models keep for specials.
pub fn prompt(rng: &mut SplitMix, len: usize) -> Vec<u32> {
    (0..len)
        .map(|_| 100 + (rng.next_u64() % 3_900) as u32)
        .collect()
}

fn median(mut xs: Vec<f64>) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    Some(xs[xs.len() / 2])
}

/// A request's mean gap between tokens, in seconds: from its first token
/// to the end of its stream over the gaps between its tokens. The median of
/// single gaps would collapse when the client reads several chunks at once
/// (a busy machine) or a replica emits two steps' tokens together.
fn mean_gap(r: &RequestRecord) -> Option<f64> {
    let gaps = r.output_tokens.checked_sub(1).filter(|&g| g > 0)?;
    let first = r.ttft_ms?;
    Some((r.e2e_ms - first).max(0.0) / 1000.0 / gaps as f64)
}

/// A request's mean gap over its decode steps alone, in seconds: the gaps
/// in which another request of the group got its first token are left out,
/// since the step that ended them also ran that request's prefill (vLLM
/// batches a joining prompt with the running decodes). In a closed loop
/// every request that finishes lets the next one in, so a long-prompt
/// group's gaps would otherwise carry its own prefills, and the fit would
/// charge them to the context attended (`per_context_token`), which the
/// simulator adds to every decode step. `firsts` are the group's
/// first-token times (ms since the group's start). Falls back to
/// [`mean_gap`] without per-gap times.
fn decode_gap(r: &RequestRecord, firsts: &[f64]) -> Option<f64> {
    let first = r.start_ms + r.ttft_ms?;
    if r.itl_ms.is_empty() {
        return mean_gap(r);
    }
    let (mut sum, mut n, mut t) = (0.0, 0usize, first);
    for gap in &r.itl_ms {
        let next = t + gap;
        if !firsts.iter().any(|&f| f > t && f <= next) {
            sum += gap;
            n += 1;
        }
        t = next;
    }
    if n == 0 {
        return mean_gap(r);
    }
    Some(sum / n as f64 / 1000.0)
}

/// Sends one group and measures it. `on_done` is called after each request.
pub async fn run_group(
    client: &Arc<BenchClient>,
    replica: &Replica,
    group: &Group,
    rng: &mut SplitMix,
    deadline: Instant,
    on_done: &(dyn Fn() + Sync),
) -> Measured {
    let before = replica.metrics().await.ok();
    let gate = Arc::new(Semaphore::new(group.concurrency));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(group.requests);
    for _ in 0..group.requests {
        let spec = RequestSpec {
            prompt: Prompt::Tokens(prompt(rng, group.prompt_len)),
            input_tokens: group.prompt_len,
            output_tokens: group.max_tokens as u32,
        };
        let permit = tokio::select! {
            p = gate.clone().acquire_owned() => p.expect("the gate is never closed"),
            _ = tokio::time::sleep_until(deadline) => break,
        };
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let rec = client.send(&spec, start).await;
            drop(permit);
            rec
        }));
        // Let the request start before the next one is prepared, so a
        // concurrency-1 group is truly one at a time.
        tokio::task::yield_now().await;
    }
    let mut records: Vec<RequestRecord> = Vec::with_capacity(tasks.len());
    for t in tasks {
        if let Ok(r) = t.await {
            records.push(r);
        }
        on_done();
    }
    let wall = start.elapsed().as_secs_f64();
    let after = replica.metrics().await.ok();
    let ok: Vec<_> = records
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Ok))
        .collect();
    let failed = records.len() - ok.len();
    let error = records
        .iter()
        .find(|r| !matches!(r.outcome, Outcome::Ok))
        .map(|r| {
            r.error
                .clone()
                .unwrap_or_else(|| format!("{:?}", r.outcome))
        });
    let ttft = ok
        .iter()
        .filter_map(|r| r.ttft_ms)
        .map(|ms| ms / 1000.0)
        .collect();
    let firsts: Vec<f64> = ok
        .iter()
        .filter_map(|r| r.ttft_ms.map(|t| r.start_ms + t))
        .collect();
    let itl = ok.iter().filter_map(|r| decode_gap(r, &firsts)).collect();
    let output: u64 = ok.iter().map(|r| r.output_tokens).sum();
    Measured {
        kind: group.kind,
        concurrency: group.concurrency,
        prompt_len: group.prompt_len,
        max_tokens: group.max_tokens,
        ok: ok.len(),
        failed,
        error,
        wall,
        ttft_p50: median(ttft),
        itl_p50: median(itl),
        server_ttft_mean: match (&before, &after) {
            (Some(b), Some(a)) => a.ttft_mean_since(b),
            _ => None,
        },
        server_itl_mean: match (&before, &after) {
            (Some(b), Some(a)) => a.itl_mean_since(b),
            _ => None,
        },
        throughput: if wall > 0.0 {
            output as f64 / wall
        } else {
            0.0
        },
    }
}

/// Sleeps a moment between groups so one group's tail does not overlap the
/// next group's start.
pub async fn settle() {
    tokio::time::sleep(Duration::from_millis(200)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_fits_the_cpu_replica() {
        // The vLLM CPU replica of the project: 2,048 context, 31 blocks of 128.
        let shape = Shape {
            max_model_len: 2048,
            max_num_seqs: 32,
            kv_tokens: Some(31 * 128),
            block_size: 128,
        };
        let p = plan(&shape);
        let prefill: Vec<_> = p
            .iter()
            .filter(|g| g.kind == ProbeKind::Prefill)
            .map(|g| g.prompt_len)
            .collect();
        assert_eq!(prefill, vec![16, 128, 256, 512, 1024, 1536]);
        let decode: Vec<_> = p
            .iter()
            .filter(|g| g.kind == ProbeKind::Decode)
            .map(|g| g.concurrency)
            .collect();
        // 112 tokens take one block each: 31 fit.
        assert_eq!(decode, vec![1, 4, 16, 31]);
        let long: Vec<_> = p
            .iter()
            .filter(|g| g.kind == ProbeKind::DecodeLong)
            .map(|g| (g.concurrency, g.prompt_len))
            .collect();
        // 1,088 tokens take 9 blocks: 3 fit.
        assert_eq!(long, vec![(1, 1024), (3, 1024)]);
        // 482 on the CPU replica: 12 s there.
        let total: usize = p.iter().map(|g| g.requests).sum();
        assert!(total < 500, "{total} requests");
    }

    #[test]
    fn the_plan_scales_to_a_large_gpu() {
        let shape = Shape {
            max_model_len: 32_768,
            max_num_seqs: 256,
            kv_tokens: Some(400_000),
            block_size: 16,
        };
        let p = plan(&shape);
        let decode: Vec<_> = p
            .iter()
            .filter(|g| g.kind == ProbeKind::Decode)
            .map(|g| g.concurrency)
            .collect();
        assert_eq!(decode, vec![1, 4, 16, 64, 256]);
        assert!(p.iter().any(|g| g.prompt_len == 6144));
    }

    fn record(start_ms: f64, ttft_ms: f64, itl_ms: Vec<f64>) -> RequestRecord {
        RequestRecord {
            start_ms,
            ttft_ms: Some(ttft_ms),
            e2e_ms: ttft_ms + itl_ms.iter().sum::<f64>(),
            output_tokens: itl_ms.len() as u64 + 1,
            itl_ms,
            input_tokens: 16,
            outcome: Outcome::Ok,
            replica: None,
            error: None,
        }
    }

    #[test]
    fn a_gap_that_ran_another_prefill_is_left_out() {
        // Decode steps of 5 ms; a 40 ms step when the second request's
        // prompt joins (its first token at 10 + 10 + 40 = 60 ms).
        let a = record(0.0, 10.0, vec![5.0, 5.0, 40.0, 5.0, 5.0]);
        let b = record(20.0, 40.0, vec![5.0, 5.0]);
        let firsts = [10.0, 60.0];
        let gap = decode_gap(&a, &firsts).unwrap();
        assert!((gap - 0.005).abs() < 1e-12, "{gap}");
        assert!((mean_gap(&a).unwrap() - 0.012).abs() < 1e-12);
        // Its own first token is not another's prefill.
        assert!((decode_gap(&b, &firsts).unwrap() - 0.005).abs() < 1e-12);
    }

    #[test]
    fn prompts_are_distinct_and_in_range() {
        let mut rng = SplitMix::new(1);
        let a = prompt(&mut rng, 64);
        let b = prompt(&mut rng, 64);
        assert_ne!(a[..4], b[..4]);
        assert!(a.iter().chain(&b).all(|&t| (100..4000).contains(&t)));
    }
}

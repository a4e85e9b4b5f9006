//! Cache-aware scoring: the expected time to first token of a request on
//! each candidate replica, in seconds, plus what its prefill costs the
//! requests waiting there; the lowest wins.
//!
//! ```text
//! ttft = queue wait                     (s)
//!      + uncached tokens ÷ prefill rate (tokens ÷ tokens/s)
//!      + KV wait                        (s)
//!
//! queue wait, scraped load fresh for every candidate:
//!            = waiting now × prefill seconds per request
//!            + one decode step when anything is running   (interference)
//! queue wait, otherwise (llmlb's own counts for every candidate):
//!            = in flight × seconds_per_request_ahead
//! KV wait    = 0 with `kv_wait = "none"` (the default), or when the
//!              uncached tokens fit in the free KV cache; else, with
//!              `kv_wait = "batch"`:
//!            = remaining output tokens per running request × decode step
//!              (llmlb's own estimate for its requests past their first
//!              byte; without one, or before a decode step is learned:
//!              running × seconds_per_request_ahead)
//! free KV tokens = capacity × (1 − kv_usage) − tokens sent since the scrape
//!                  (prompt less the cached prefix a request in flight there
//!                  carries, plus output; and llmlb's requests the scrape
//!                  did not see yet)
//! ```
//!
//! (free KV tokens: [`KvRoom::free_tokens`](crate::replica::KvRoom), the
//! model `kv_aware` reads projected usage from; only a capacity the replica
//! reports counts here.)
//!
//! A LoRA request on a replica where other adapters hold every slot
//! ([`AdapterWait`], from `routing::lora`) starts after the longer of its
//! queue wait and their drain:
//!
//! ```text
//! drain = their requests still prefilling × prefill seconds per request
//!       + output tokens they have left × decode step
//!         (before a decode step is learned: requests in the way
//!          × seconds_per_request_ahead)
//! ```
//!
//! The rates are the replica's own, learned from its timing histograms
//! ([`crate::replica::LearnedRates`]), weighed against the candidates'
//! median by the requests they were learned from; until a replica has
//! produced a sample, the median of the candidates that have stands in,
//! and only when none has do the pool's `prefill_tokens_per_second` and
//! `seconds_per_request_ahead` (and a decode step of zero) serve as priors
//! (`same_hardware`). "Waiting now" and "running now" are the scraped gauges
//! corrected by what llmlb sent, saw answered and saw finish since the
//! scrape ([`crate::replica::ScrapedLoad::queue_now`]).
//!
//! The KV term is what keeps a warm replica from being buried: a request
//! whose uncached blocks do not fit in the replica's free KV cache waits in
//! the engine's queue until running requests finish and free their blocks
//! (or it is admitted and a running request is preempted and recomputed),
//! so it is charged the time the running batch takes to turn over. (vLLM
//! counts blocks that hold a cached prefix but no running request as free,
//! and so does this term; the request's own output growth is not counted.)
//! When the capacity or the usage is unknown, no KV term is charged.
//! It is off unless `kv_wait = "batch"`: charged in full it moved prefixes
//! off warm replicas whose free cache was short of a few blocks, and on real
//! vLLM replicas and the simulator alike that cost about ten points of
//! prefix hits and a higher p99 (docs/BENCHMARKS.md, "The KV wait").
//!
//! The pick minimises `ttft + pending × uncached prefill`, where pending is
//! the requests on the replica whose first token is still ahead (llmlb's
//! own requests without a first byte, or the scraped waiting queue when it
//! is longer, plus, for a LoRA request, other adapters' requests waiting
//! there for its adapter to drain; at most 8; see [`best`]): a prefill a replica repeats is
//! engine time every one of them waits for, so under load a miss costs the
//! fleet more than its own TTFT. With nothing pending anywhere this is the
//! TTFT alone.
//!
//! With `evictions = "charged"` (the default) the pick also pays for what
//! the request pushes out of a full cache:
//!
//! ```text
//! evicted tokens = uncached tokens − empty room        (at least 0)
//! empty room     = reported capacity − blocks llmlb's index lists there
//! cost          += evicted tokens ÷ prefill rate       (s)
//! ```
//!
//! A replica writes a prompt's uncached blocks into empty room first and
//! then over the least recently used cached ones, which belong to other
//! prefixes; the next request of such a prefix prefills them again. So on
//! replicas whose caches hold only a few prefixes, moving a prefix off its
//! warm replica costs two prefills, and filling a replica with room costs
//! one. Nothing is charged while the capacity is unknown (no
//! `cache_config_info`) or the room suffices (docs/BENCHMARKS.md, "Charging
//! evictions").
//!
//! With `preemptions = "charged"` (the default) it pays for the running
//! requests the placement gets preempted: when the uncached tokens and the
//! answers still to be written there (this one's counted as long as the
//! others') do not fit in the free KV cache, each prompt's worth of the
//! shortfall, the first whole, is a prompt prefilled again
//! ([`CostModel::preempted_tokens`]). On real vLLM replicas whose caches
//! hold two prompts this kept the requests that would have waited behind a
//! replica about to stall off it (docs/lab/preemption-charge.md).
//!
//! The cost counts a prefix's home ([`super::home`]) as holding the part
//! the prefix's requests share even when it does not hold it now (the
//! returned TTFT does not): a miss goes home unless another replica is
//! faster by more than that part's prefill, and warms the replica its next
//! requests will look at. In `exact` mode a replica that holds the prefix
//! now but will evict it before the request's turn (the requests queued
//! there write over it first) is counted the same way: the prefix is
//! stored again where it lives rather than copied to a second replica.
//!
//! A warm replica therefore loses to a cold one exactly when its queue, plus
//! what it lacks in free cache, costs more than the prefill the cache would
//! save (and, under load, the delay that prefill puts on the cold one's
//! queue): one dominant system prompt spreads over as many replicas as its
//! load needs instead of melting one. (The same trade-off as Dynamo's KV
//! router cost and llm-d's weighted prefix, queue and KV scorers, expressed
//! in seconds so the terms share a unit.)
//!
//! A near tie goes to a replica that can start the prompt now: when the
//! cheapest candidate's free KV cache cannot take the prompt's uncached
//! tokens (the engine holds it back until a running request ends) and
//! another's can, at a cost within `fit_band` (1.25×) of the cheapest, the
//! other serves it. The band is narrower than the prefill a warm replica
//! saves, so it moves cold and near-cold prompts, not prefixes.
//!
//! Ties (an empty index, even load) go to the earliest replica in the
//! prefix's rendezvous order, so independent llmlb instances agree.
//!
//! Cost: O(candidates), including the three medians of the candidates'
//! learned rates (found by selection, one small vector each) when
//! `rate_band` is above 1 or a candidate lacks a rate; no other allocation
//! besides the `ahead` vector.

use crate::config::{Evictions, KvWait, Preemptions};
use crate::replica::{Rates, ReplicaView};

/// The pool's prior rates, used until a replica or one of its peers has learned.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CostModel {
    pub prefill_tokens_per_second: f64,
    pub seconds_per_request_ahead: f64,
    /// Whether a replica short of free KV cache is charged a wait.
    pub kv_wait: KvWait,
    /// Whether a placement is charged for the cached blocks it evicts.
    pub evictions: Evictions,
    /// Whether a placement is charged for the running requests it gets
    /// preempted.
    pub preemptions: Preemptions,
    /// Learned rates within this factor of the candidates' median count as
    /// the median (`same_hardware`).
    pub rate_band: f64,
    /// A replica whose free KV cache takes the prompt wins over a cheaper
    /// one whose cache does not, when its cost is within this factor.
    pub fit_band: f64,
}

/// What is ahead of a new request on one replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ahead {
    /// From a fresh scrape, corrected by what llmlb did since.
    Scraped {
        waiting: u64,
        running: u64,
        /// Free KV-cache tokens, when the replica reports its capacity and usage.
        free_kv_tokens: Option<u64>,
        /// llmlb's estimate of the output tokens its requests on the
        /// replica that are past their first byte still have to produce,
        /// per request (0: none decoding).
        remaining_per_request: u64,
    },
    /// llmlb's own in-flight count (no fresh scrape for some candidate).
    Local { in_flight: u64 },
}

impl Ahead {
    /// Whether `tokens` fit in the replica's free KV cache as scraped
    /// (corrected by what llmlb sent since); unknown counts as room.
    fn has_room_for(self, tokens: u64) -> bool {
        match self {
            Ahead::Scraped { free_kv_tokens, .. } => {
                free_kv_tokens.is_none_or(|free| tokens <= free)
            }
            Ahead::Local { .. } => true,
        }
    }
}

impl CostModel {
    /// Seconds to prefill `tokens` at the replica's learned prefill rate,
    /// else the prior.
    pub fn prefill_seconds(&self, rates: &Rates, tokens: u64) -> f64 {
        let rate = rates
            .prefill_tokens_per_second
            .unwrap_or(self.prefill_tokens_per_second);
        tokens as f64 / rate
    }

    /// With `preemptions = "charged"`: the tokens prefilled again because a
    /// request with `uncached` tokens to write goes to a replica with `ahead`.
    ///
    /// ```text
    /// short      = uncached + (running + 1) × remaining output per request
    ///              − free KV tokens                                  (at least 0)
    /// prefilled  = ⌈short ÷ prompt⌉ × prompt
    /// ```
    ///
    /// Every running request writes its remaining answer into the cache, and
    /// this one about as much (llmlb's estimate per request past its first
    /// byte). When that does not fit, the engine preempts the newest running
    /// request at a decode step that finds no free block and prefills it again
    /// later, its blocks written anew; each preemption is counted as a prompt
    /// of this length, the first one whole however small the shortfall (a
    /// preemption is all or nothing). Nothing is charged without a fresh
    /// scrape of the capacity and usage.
    pub fn preempted_tokens(&self, ahead: Ahead, uncached: u64, prompt: u64) -> u64 {
        let Ahead::Scraped {
            running,
            free_kv_tokens: Some(free),
            remaining_per_request,
            ..
        } = ahead
        else {
            return 0;
        };
        if self.preemptions == Preemptions::Free || prompt == 0 {
            return 0;
        }
        let need = uncached + (running + 1) * remaining_per_request;
        need.saturating_sub(free).div_ceil(prompt) * prompt
    }

    /// Expected time to first token, in seconds, of a request with
    /// `uncached_tokens` left to prefill on a replica with `ahead` and `rates`.
    pub fn expected_ttft(&self, ahead: Ahead, rates: &Rates, uncached_tokens: u64) -> f64 {
        let per_request = rates
            .prefill_seconds_per_request
            .unwrap_or(self.seconds_per_request_ahead);
        let prefill = self.prefill_seconds(rates, uncached_tokens);
        match ahead {
            Ahead::Local { in_flight } => {
                in_flight as f64 * self.seconds_per_request_ahead + prefill
            }
            Ahead::Scraped {
                waiting,
                running,
                remaining_per_request,
                ..
            } => {
                let step = rates.decode_step_seconds;
                let interference = if running > 0 {
                    step.unwrap_or(0.0)
                } else {
                    0.0
                };
                let fits = self.kv_wait == KvWait::None || ahead.has_room_for(uncached_tokens);
                let kv_wait = match (fits, step) {
                    (true, _) => 0.0,
                    (false, Some(step)) if remaining_per_request > 0 => {
                        remaining_per_request as f64 * step
                    }
                    (false, _) => running.max(1) as f64 * self.seconds_per_request_ahead,
                };
                waiting as f64 * per_request + interference + prefill + kv_wait
            }
        }
    }
}

/// What is ahead of a new request on each candidate: from scraped metrics
/// when they are fresh for *every* candidate, else llmlb's own counts for
/// all of them (the two are never compared with each other).
pub fn requests_ahead(views: &[ReplicaView], max_age_ms: u64) -> Vec<Ahead> {
    let scraped: Option<Vec<Ahead>> = views
        .iter()
        .map(|v| {
            let l = v.fresh_load(max_age_ms)?;
            let in_system = l.in_system_now()?;
            let waiting = l.queue_now().unwrap_or(0).min(in_system);
            let free_kv_tokens = l.kv_room(None).map(|k| k.free_tokens());
            Some(Ahead::Scraped {
                waiting,
                running: in_system - waiting,
                free_kv_tokens,
                remaining_per_request: v
                    .decoding_output
                    .checked_div(v.in_flight.saturating_sub(v.prefilling))
                    .unwrap_or(0),
            })
        })
        .collect();
    match scraped {
        Some(s) if !views.is_empty() => s,
        _ => views
            .iter()
            .map(|v| Ahead::Local {
                in_flight: v.in_flight,
            })
            .collect(),
    }
}

/// One candidate as the scorer sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Candidate {
    /// What is ahead of this request on the replica.
    pub ahead: Ahead,
    /// The replica's learned rates (priors fill what is missing).
    pub rates: Rates,
    /// Prompt tokens the replica probably has cached.
    pub cached_tokens: u64,
    /// Prompt tokens the replica is counted as keeping for the prefix's
    /// next requests, whether it holds them at the request's turn or not
    /// (the prefix's home, [`super::home`]; in `exact` mode also what it
    /// holds now that the requests queued there will evict first): the
    /// cost reads the larger of the two, the returned TTFT only what is
    /// cached.
    pub kept_tokens: u64,
    /// llmlb's requests on the replica still waiting for their first byte.
    pub prefilling: u64,
    /// Their prompt tokens predicted not cached there.
    pub queued_tokens: u64,
    /// Empty room in the replica's prefix cache, in tokens (its reported
    /// capacity less what llmlb's index lists there), when the capacity is
    /// known: tokens written beyond it evict cached ones.
    pub room_tokens: Option<u64>,
    /// Position in the prefix's rendezvous order (tie-break, 0 first).
    pub rank: usize,
    /// A LoRA request's wait for other adapters there (none for the base
    /// model, or where its adapter runs or has a free slot).
    pub adapter: AdapterWait,
}

/// What a LoRA request waits for on one replica besides its queue, or keeps
/// waiting (`crate::replica::adapters`): the cost reads it as a drain.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdapterWait {
    /// Requests of the adapters holding every slot there, which must all
    /// finish before it starts: those still waiting for their first token,
    pub blockers_prefilling: u64,
    /// and those decoding,
    pub blockers_decoding: u64,
    /// with this many output tokens left each (llmlb's estimate).
    pub remaining_output: u64,
    /// Requests of other adapters waiting there for its adapter to drain:
    /// it starts before them and they wait for it.
    pub waiters: u64,
}

impl AdapterWait {
    /// Seconds until the blockers have finished: their prefills one after
    /// another, then the output left, one decode step a token; before a
    /// decode step is learned, `seconds_per_request_ahead` per blocker.
    fn drain_seconds(&self, model: &CostModel, rates: &Rates) -> f64 {
        let blockers = self.blockers_prefilling + self.blockers_decoding;
        if blockers == 0 {
            return 0.0;
        }
        match rates.decode_step_seconds {
            Some(step) => {
                let per_request = rates
                    .prefill_seconds_per_request
                    .unwrap_or(model.seconds_per_request_ahead);
                self.blockers_prefilling as f64 * per_request + self.remaining_output as f64 * step
            }
            None => blockers as f64 * model.seconds_per_request_ahead,
        }
    }
}

/// Most requests a repeated prefill is counted as delaying (see [`best`]).
const MAX_DELAYED: f64 = 8.0;

/// Index of the candidate with the lowest cost, with its expected TTFT.
///
/// The cost is the expected TTFT plus the delay the request's prefill
/// imposes on others: the uncached tokens at the candidate's prefill rate,
/// times the requests there whose first token is still ahead (llmlb's own
/// requests without a first byte, or the scraped waiting queue when that is
/// longer; at most `MAX_DELAYED`, 8). The engine runs one prefill at a time
/// (chunked or not, the steps are serial), so every one of them gets its
/// first token that much later: under load a miss costs more than its own
/// TTFT, and a warm replica keeps its prefix until its queue is longer by
/// that much. With nothing pending anywhere the term is 0 and the rule is
/// the lowest TTFT.
pub fn best(model: &CostModel, prompt_tokens: u64, cands: &[Candidate]) -> Option<(usize, f64)> {
    let mut best: Option<(usize, f64, f64, bool)> = None;
    // The cheapest candidate whose free KV cache takes the uncached prompt.
    let mut best_fitting: Option<(usize, f64, f64)> = None;
    // The medians are needed to snap rates within a band above 1, or to
    // stand in for a rate a candidate has not learned yet.
    let typical = if model.rate_band > 1.0 || cands.iter().any(|c| c.rates.lacks_any()) {
        TypicalRates::of(cands)
    } else {
        TypicalRates::NONE
    };
    for (i, c) in cands.iter().enumerate() {
        let c = &Candidate {
            rates: same_hardware(c.rates, typical, model.rate_band),
            ..*c
        };
        let uncached = prompt_tokens.saturating_sub(c.cached_tokens);
        // A LoRA request that waits for other adapters to drain starts
        // after the longer of its queue and the drain (no drain, no queue
        // priced twice: every request without an adapter wait).
        let wait = c.adapter.drain_seconds(model, &c.rates);
        let drain = if wait > 0.0 {
            (wait - model.expected_ttft(c.ahead, &c.rates, 0)).max(0.0)
        } else {
            0.0
        };
        let t = model.expected_ttft(c.ahead, &c.rates, uncached) + drain;
        // The prefills queued there, by their own lengths: a queue of cold
        // prompts takes longer than its count at the mean time a request.
        let t = t.max(model.prefill_seconds(&c.rates, queued_tokens(c) + uncached));
        let missing = prompt_tokens.saturating_sub(c.cached_tokens.max(c.kept_tokens));
        let prefill = model.prefill_seconds(&c.rates, missing);
        let kept = model.prefill_seconds(&c.rates, uncached - missing);
        // Whose first token is still ahead there: llmlb's own requests
        // without a first byte, or the replica's queue when it is longer
        // (other clients).
        let ahead = match c.ahead {
            Ahead::Scraped { waiting, .. } => waiting.max(c.prefilling),
            Ahead::Local { .. } => c.prefilling,
        };
        // Other adapters' requests waiting there for a slot wait for this
        // one too.
        let delayed = ((ahead + c.adapter.waiters) as f64).min(MAX_DELAYED);
        // With `evictions = "charged"`: what the uncached tokens push out
        // of a full cache, prefilled again when their prefix comes back.
        let evicted = match (model.evictions, c.room_tokens) {
            (Evictions::Charged, Some(room)) => uncached.saturating_sub(room),
            _ => 0,
        };
        // With `preemptions = "charged"`: the running requests its
        // placement gets preempted, prefilled again.
        let preempted = model.preempted_tokens(c.ahead, uncached, prompt_tokens);
        let cost =
            t - kept + delayed * prefill + model.prefill_seconds(&c.rates, evicted + preempted);
        let wins = match best {
            None => true,
            Some((b, bc, _, _)) => cost < bc || (cost == bc && c.rank < cands[b].rank),
        };
        let fits = c.ahead.has_room_for(uncached);
        if wins {
            best = Some((i, cost, t, fits));
        }
        if fits && best_fitting.is_none_or(|(_, fc, _)| cost < fc) {
            best_fitting = Some((i, cost, t));
        }
    }
    // A near tie goes to a replica that can start the prompt now.
    match (best, best_fitting) {
        (Some((_, bc, _, false)), Some((f, fc, ft))) if fc <= bc * model.fit_band => Some((f, ft)),
        _ => best.map(|(i, _, t, _)| (i, t)),
    }
}

/// The uncached prompt tokens of llmlb's requests queued on the replica.
/// A request counts until its first byte, and a JSON answer's first byte
/// is its last: where the replica's own queue (fresh) is shorter than
/// llmlb's requests without a first byte, those are mostly decoding, so
/// only as many are counted as wait there, plus the one prefilling, at
/// their mean.
fn queued_tokens(c: &Candidate) -> u64 {
    match c.ahead {
        Ahead::Scraped { waiting, .. } if waiting + 1 < c.prefilling => {
            c.queued_tokens / c.prefilling * (waiting + 1)
        }
        _ => c.queued_tokens,
    }
}

/// How many requests' worth of evidence the candidates' median counts as
/// when a replica's own learned prefill rate, slower than the median, is
/// weighed against it.
const PRIOR_REQUESTS: f64 = 8.0;

/// The same for a rate faster than the median: a replica that looks faster
/// draws more requests, so an error that way feeds itself, while one that
/// looks slower draws fewer and corrects itself (see `same_hardware`).
const PRIOR_REQUESTS_FASTER: f64 = 64.0;

/// The candidates' median learned rates (over those that learned one; the
/// median, so that one replica far off does not move it).
#[derive(Debug, Clone, Copy)]
struct TypicalRates {
    tokens_per_second: Option<f64>,
    seconds_per_request: Option<f64>,
    decode_step: Option<f64>,
}

impl TypicalRates {
    const NONE: TypicalRates = TypicalRates {
        tokens_per_second: None,
        seconds_per_request: None,
        decode_step: None,
    };

    fn of(cands: &[Candidate]) -> TypicalRates {
        let median = |f: fn(&Rates) -> Option<f64>| {
            let mut v: Vec<f64> = cands.iter().filter_map(|c| f(&c.rates)).collect();
            let n = v.len();
            if n == 0 {
                return None;
            }
            // Selection, not a sort: linear in the candidates.
            let (below, &mut upper, _) = v.select_nth_unstable_by(n / 2, f64::total_cmp);
            Some(if n % 2 == 1 {
                upper
            } else {
                let lower = below
                    .iter()
                    .copied()
                    .max_by(f64::total_cmp)
                    .unwrap_or(upper);
                (lower + upper) / 2.0
            })
        };
        TypicalRates {
            tokens_per_second: median(|r| r.prefill_tokens_per_second),
            seconds_per_request: median(|r| r.prefill_seconds_per_request),
            decode_step: median(|r| r.decode_step_seconds),
        }
    }
}

/// A replica's rates as the cost reads them: a learned prefill rate within
/// a factor `band` of the candidates' median counts as the median, and a
/// rate the replica has not learned yet is the median of those that have.
///
/// Replicas of the same hardware learn different rates, and the difference
/// feeds itself: the one that looks faster gets more of the cold requests,
/// which changes what its histograms measure next. On a trace with few
/// prefix hits that loaded some replicas 1.2–1.5× the mean
/// (docs/BENCHMARKS.md, "Rates of one hardware"). Within the band a
/// replica is compared by its queue and cache alone; one slower or faster
/// than the median by more than the band (other hardware, a fault) keeps its
/// own rate. Two replicas three times apart are each 1.5× from their
/// median, outside the default band of 1.25.
///
/// A rate learned from few requests is weak evidence: the first request a
/// replica finishes may have been prefilled while it was idle, and a rate
/// 2.5× its peers' from that one request made it look faster than all of
/// them until its queue was dozens long (no new sample came while the
/// queue waited for KV cache). So before it is compared with the band, a
/// replica's own rate is averaged with the median, weighted by its requests
/// against [`PRIOR_REQUESTS`] (8) for the median when the rate is slower,
/// [`PRIOR_REQUESTS_FASTER`] (64) when it is faster: a slower replica is
/// told apart after a few dozen requests, a faster one after a few hundred
/// (docs/BENCHMARKS.md, "Rates learned from few requests").
///
/// A replica without a sample yet (it has not finished a request since it
/// joined) would otherwise be costed at the pool's configured priors, which
/// under load are often several times faster than what its peers measure:
/// it looks cheapest and takes every cold request until its first ones
/// finish (docs/BENCHMARKS.md, "Rates learned from few requests"). Its
/// peers' median is the better guess; the priors stand in only
/// when no candidate has learned. The decode step is only filled in, never
/// snapped: it grows with the batch and so is part of the load signal.
///
/// A replica whose two prefill rates differ from the medians in opposite
/// directions counts as the median whatever the band says, while both are
/// within [`MIX_BAND`] of it ([`prompt_mix`]).
fn same_hardware(rates: Rates, typical: TypicalRates, band: f64) -> Rates {
    let evidence = rates.prefill_requests as f64;
    let mix = band > 1.0 && prompt_mix(&rates, &typical);
    // `faster(x, m)`: whether `x` says the replica is faster than `m` does.
    let snap =
        |own: Option<f64>, typical: Option<f64>, faster: fn(f64, f64) -> bool| match (own, typical)
        {
            (Some(x), Some(m)) if band > 1.0 => {
                let k = if faster(x, m) {
                    PRIOR_REQUESTS_FASTER
                } else {
                    PRIOR_REQUESTS
                };
                let x = (evidence * x + k * m) / (evidence + k);
                Some(if mix || (x <= m * band && x * band >= m) {
                    m
                } else {
                    x
                })
            }
            (None, m) => m,
            (own, _) => own,
        };
    Rates {
        prefill_tokens_per_second: snap(
            rates.prefill_tokens_per_second,
            typical.tokens_per_second,
            |x, m| x > m,
        ),
        prefill_seconds_per_request: snap(
            rates.prefill_seconds_per_request,
            typical.seconds_per_request,
            |x, m| x < m,
        ),
        decode_step_seconds: rates.decode_step_seconds.or(typical.decode_step),
        ..rates
    }
}

/// How far from the medians a replica's prefill rates may be and still be
/// told apart as a prompt mix ([`prompt_mix`]) rather than other hardware.
const MIX_BAND: f64 = 2.0;

/// Whether a replica's prefill rates differ from the candidates' medians
/// the way another prompt mix makes them differ, not other hardware: a
/// prefill costs a fixed time plus a time per token, so a replica given
/// shorter prompts (or more cache hits) measures fewer tokens a second and
/// fewer seconds a request, one given longer prompts the opposite. Slower
/// hardware (or a fault, or a heavier load) is slower by both. Each rate
/// must be within [`MIX_BAND`] of its median: a replica several times off
/// keeps its own rates whichever way they point.
///
/// On identical simulated replicas, rates snapped this way lowered both
/// prefix modes' p99 TTFT on the conversation trace by 3–12 % and kept a
/// replica 2–3× slower told apart (docs/ROUTING.md, "Learned rates").
fn prompt_mix(rates: &Rates, typical: &TypicalRates) -> bool {
    let within = |x: f64, m: f64| x <= m * MIX_BAND && x * MIX_BAND >= m;
    match (
        rates.prefill_tokens_per_second,
        typical.tokens_per_second,
        rates.prefill_seconds_per_request,
        typical.seconds_per_request,
    ) {
        (Some(t), Some(tm), Some(s), Some(sm)) => {
            (t > tm) != (s < sm) && within(t, tm) && within(s, sm)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    const MODEL: CostModel = CostModel {
        prefill_tokens_per_second: 10_000.0,
        seconds_per_request_ahead: 0.02,
        kv_wait: KvWait::Batch,
        evictions: Evictions::Free,
        preemptions: Preemptions::Free,
        rate_band: 1.25,
        fit_band: 1.0,
    };

    const NO_RATES: Rates = Rates {
        prefill_tokens_per_second: None,
        prefill_seconds_per_request: None,
        decode_step_seconds: None,
        output_tokens: None,
        prefill_requests: 0,
    };

    /// Requests behind a rate learned long enough to stand on its own.
    const SETTLED: u64 = 1_000;

    fn cand(ahead: Ahead, rates: Rates, cached_tokens: u64, rank: usize) -> Candidate {
        Candidate {
            ahead,
            rates,
            cached_tokens,
            kept_tokens: 0,
            prefilling: 0,
            queued_tokens: 0,
            room_tokens: None,
            rank,
            adapter: AdapterWait::default(),
        }
    }

    /// A candidate compared by llmlb's own in-flight count, at the priors.
    fn local(in_flight: u64, cached_tokens: u64, rank: usize) -> Candidate {
        cand(Ahead::Local { in_flight }, NO_RATES, cached_tokens, rank)
    }

    #[test]
    fn a_lora_request_starts_after_the_longer_of_its_queue_and_the_drain() {
        // 1,000 prompt tokens, at the priors (0.02 s a request ahead,
        // 10,000 tokens/s, no decode step learned: a blocker costs 0.02 s).
        let warm = |blockers, waiters| Candidate {
            adapter: AdapterWait {
                blockers_decoding: blockers,
                waiters,
                ..AdapterWait::default()
            },
            ..local(3, 1_000, 0)
        };
        let cold = local(0, 0, 1);
        // Three blockers drain within the queue of three (0.06 s), less
        // than the cold replica's prefill (0.1 s).
        assert_eq!(best(&MODEL, 1_000, &[warm(3, 0), cold]).unwrap().0, 0);
        // Six drain in 0.12 s: the cold replica wins.
        let (i, ttft) = best(&MODEL, 1_000, &[warm(6, 0), cold]).unwrap();
        assert_eq!((i, ttft), (1, 0.1));
        // A learned decode step prices the blockers' output left: 20 tokens
        // at 2 ms is 0.04 s, within the queue; 80 are 0.16 s.
        let stepped = |remaining| Candidate {
            rates: Rates {
                decode_step_seconds: Some(0.002),
                ..NO_RATES
            },
            adapter: AdapterWait {
                blockers_decoding: 1,
                remaining_output: remaining,
                ..AdapterWait::default()
            },
            ..warm(0, 0)
        };
        assert_eq!(best(&MODEL, 1_000, &[stepped(20), cold]).unwrap().0, 0);
        assert_eq!(best(&MODEL, 1_000, &[stepped(80), cold]).unwrap().0, 1);
        // Requests of other adapters waiting for a slot wait for its
        // prefill too: half the prompt cached and one request ahead (0.07 s
        // TTFT) beats the cold replica alone, not with two waiting there
        // 0.05 s each for its prefill.
        let half = |waiters| Candidate {
            adapter: AdapterWait {
                waiters,
                ..AdapterWait::default()
            },
            ..local(1, 500, 0)
        };
        assert_eq!(best(&MODEL, 1_000, &[half(0), cold]).unwrap().0, 0);
        assert_eq!(best(&MODEL, 1_000, &[half(2), cold]).unwrap().0, 1);
    }

    #[test]
    fn warm_but_busy_loses_exactly_when_slower() {
        // 2,050-token prompt, 2,000 cached on the warm replica: the cache
        // saves 0.2 s, each request ahead costs 0.02 s, so the warm replica
        // wins with up to 9 ahead and loses from 10 on.
        for ahead in 0..20u64 {
            let cands = [local(ahead, 2_000, 1), local(0, 0, 0)];
            let (i, _) = best(&MODEL, 2_050, &cands).unwrap();
            let warm_ttft = MODEL.expected_ttft(Ahead::Local { in_flight: ahead }, &NO_RATES, 50);
            let cold_ttft = MODEL.expected_ttft(Ahead::Local { in_flight: 0 }, &NO_RATES, 2_050);
            assert_eq!(i == 0, warm_ttft < cold_ttft, "ahead {ahead}");
        }
    }

    fn scraped(waiting: u64, running: u64, free: u64, remaining: u64) -> Ahead {
        Ahead::Scraped {
            waiting,
            running,
            free_kv_tokens: Some(free),
            remaining_per_request: remaining,
        }
    }

    const LEARNED: Rates = Rates {
        prefill_tokens_per_second: Some(2_500.0),
        prefill_seconds_per_request: Some(0.1),
        decode_step_seconds: Some(0.02),
        prefill_requests: SETTLED,
        ..NO_RATES
    };

    #[test]
    fn a_warm_replica_behind_cold_prompts_loses_to_an_idle_cold_one() {
        // 1,900 of 2,000 prompt tokens cached on the warm replica, one
        // request waiting there: at 0.1 s a request it would win. But the
        // request waiting is a cold prompt of 4,000 tokens (1.6 s at
        // 2,500 tokens/s); the cold replica prefills all 2,000 in 0.8 s.
        let warm = Candidate {
            queued_tokens: 4_000,
            prefilling: 1,
            ..cand(scraped(1, 0, 40_000, 0), LEARNED, 1_900, 0)
        };
        let cold = cand(scraped(0, 0, 40_000, 0), LEARNED, 0, 1);
        let (i, t) = best(&MODEL, 2_000, &[warm, cold]).unwrap();
        assert_eq!(i, 1, "the idle cold replica wins");
        assert!((t - 0.8).abs() < 1e-9, "{t}");
        // The same queue priced by its count alone: the warm one wins.
        let (i, _) = best(
            &MODEL,
            2_000,
            &[
                Candidate {
                    queued_tokens: 0,
                    ..warm
                },
                cold,
            ],
        )
        .unwrap();
        assert_eq!(i, 0);
    }

    #[test]
    fn requests_past_their_queue_count_only_as_many_as_the_replica_queues() {
        // Five of llmlb's requests there without a first byte, 5,000
        // uncached tokens in all, but the replica has none waiting: JSON
        // answers decoding, their first byte still to come. One may be
        // prefilling (1,000 tokens at their mean, 0.44 s with this
        // request's 100): the warm replica wins.
        let warm = Candidate {
            queued_tokens: 5_000,
            prefilling: 5,
            ..cand(scraped(0, 5, 40_000, 0), LEARNED, 1_900, 0)
        };
        let cold = cand(scraped(0, 0, 40_000, 0), LEARNED, 0, 1);
        let (i, _) = best(&MODEL, 2_000, &[warm, cold]).unwrap();
        assert_eq!(i, 0);
        // Queued there, all five are ahead of it (2.04 s): the cold one wins.
        let queued = Candidate {
            ahead: scraped(5, 0, 40_000, 0),
            ..warm
        };
        let (i, _) = best(&MODEL, 2_000, &[queued, cold]).unwrap();
        assert_eq!(i, 1);
    }

    #[test]
    fn a_warm_replica_with_no_free_kv_loses_to_an_idle_cold_one() {
        // 2,000 of 2,050 prompt tokens cached on the warm replica, but its
        // cache is full of running requests with 200 tokens still to go.
        let warm = cand(scraped(0, 4, 0, 200), LEARNED, 2_000, 0);
        let cold = cand(scraped(0, 0, 4_096, 0), LEARNED, 0, 1);
        let (i, t) = best(&MODEL, 2_050, &[warm, cold]).unwrap();
        assert_eq!(i, 1, "the idle cold replica wins");
        assert!((t - 2_050.0 / 2_500.0).abs() < 1e-9, "{t}");
        // With room for the 50 uncached tokens, the warm one wins again.
        let roomy = Candidate {
            ahead: scraped(0, 4, 60, 200),
            ..warm
        };
        assert_eq!(best(&MODEL, 2_050, &[roomy, cold]).unwrap().0, 0);
        // Without a KV wait (the default), the warm one keeps its prefix:
        // its queue is empty and its batch frees blocks as it goes.
        let none = CostModel {
            kv_wait: KvWait::None,
            ..MODEL
        };
        let (i, t) = best(&none, 2_050, &[warm, cold]).unwrap();
        assert_eq!(i, 0);
        assert!((t - (0.02 + 50.0 / 2_500.0)).abs() < 1e-9, "{t}");
    }

    #[test]
    fn a_near_tie_goes_to_the_replica_whose_free_kv_takes_the_prompt() {
        // 1,500 prompt tokens at 2,500 tokens/s; both replicas decode (a
        // 0.02 s step of interference), nothing waits on either. The first
        // holds some of the prompt, but its free KV cache cannot take the
        // rest: the engine would hold the prompt back until a running
        // request ends. The second holds none of it and has room.
        let model = CostModel {
            kv_wait: KvWait::None,
            fit_band: 1.25,
            ..MODEL
        };
        let short = |cached, free| cand(scraped(0, 2, free, 100), LEARNED, cached, 0);
        let roomy = cand(scraped(0, 1, 4_000, 100), LEARNED, 0, 1);
        // 200 held, 1,300 to prefill in 1,000 free tokens: 0.54 s against
        // 0.62 s, within 1.25 times, so the one with room serves it.
        let (i, t) = best(&model, 1_500, &[short(200, 1_000), roomy]).unwrap();
        assert_eq!(i, 1);
        assert!((t - 0.62).abs() < 1e-9, "{t}");
        // With the band off the cheaper one does.
        let off = CostModel {
            fit_band: 1.0,
            ..model
        };
        assert_eq!(best(&off, 1_500, &[short(200, 1_000), roomy]).unwrap().0, 0);
        // Holding 500 of it (0.42 s), it is cheaper by more than the band:
        // the prefix stays.
        assert_eq!(best(&model, 1_500, &[short(500, 500), roomy]).unwrap().0, 0);
        // A free KV cache not reported counts as room: nothing moves.
        let unknown = Candidate {
            ahead: Ahead::Scraped {
                waiting: 0,
                running: 2,
                free_kv_tokens: None,
                remaining_per_request: 100,
            },
            ..short(200, 0)
        };
        assert_eq!(best(&model, 1_500, &[unknown, roomy]).unwrap().0, 0);
    }

    #[test]
    fn under_load_a_miss_is_charged_the_delay_of_the_queue_it_joins() {
        // 2,000 of 2,050 prompt tokens cached on the warm replica; each
        // waiting request costs 0.1 s, a decode step 0.02 s, and prefill
        // runs at 2,500 tokens/s (a miss 0.82 s, a hit 0.02 s).
        let warm = |waiting| cand(scraped(waiting, 4, 100_000, 50), LEARNED, 2_000, 1);
        let cold = |waiting| cand(scraped(waiting, 4, 100_000, 50), LEARNED, 0, 0);
        // Nothing waits on the cold replica (cost = its TTFT, 0.84 s); the
        // warm one costs 0.1 s per waiting request plus its 0.04 s TTFT
        // plus the 0.02 s hit prefill each of them waits for: it wins with
        // 6 waiting (0.76 s) and loses with 7 (0.88 s).
        assert_eq!(best(&MODEL, 2_050, &[warm(6), cold(0)]).unwrap().0, 0);
        assert_eq!(best(&MODEL, 2_050, &[warm(7), cold(0)]).unwrap().0, 1);
        // With 2 waiting on the cold replica its TTFT (1.04 s) beats the
        // warm one's with 11 waiting (1.14 s), but the 0.82 s prefill it
        // would repeat delays those 2: cost 2.68 s against 1.30 s, and
        // the warm replica keeps the prefix. The TTFT returned is the
        // winner's own.
        let (i, t) = best(&MODEL, 2_050, &[warm(11), cold(2)]).unwrap();
        assert_eq!(i, 0);
        assert!((t - 1.14).abs() < 1e-9, "{t}");
        // llmlb's own requests still without a first byte count when the
        // scrape shows fewer waiting (it is older, or they are prefilling).
        let mut pending = cold(0);
        pending.prefilling = 2;
        assert_eq!(best(&MODEL, 2_050, &[warm(11), pending]).unwrap().0, 0);
        // Without a fresh scrape llmlb's own counts are all there is: 11
        // in flight ahead on the warm replica (0.22 s) against a 0.2 s
        // longer prefill on the cold one. Nothing pending there: the cold
        // one wins; 1 request waiting for its first byte there (0.2 s
        // more): the warm one does.
        let local_warm = local(11, 2_000, 1);
        let mut local_cold = local(0, 0, 0);
        assert_eq!(best(&MODEL, 2_050, &[local_warm, local_cold]).unwrap().0, 1);
        local_cold.prefilling = 1;
        assert_eq!(best(&MODEL, 2_050, &[local_warm, local_cold]).unwrap().0, 0);
    }

    #[test]
    fn charged_evictions_keep_a_prefix_where_it_is_and_fill_empty_room_first() {
        // 2,000 of 2,050 tokens cached on the warm replica, 9 waiting
        // there, against a cold one with nothing waiting; both caches are
        // full (no empty room).
        let charged = CostModel {
            evictions: Evictions::Charged,
            kv_wait: KvWait::None,
            ..MODEL
        };
        let free = CostModel {
            evictions: Evictions::Free,
            ..charged
        };
        let full = |waiting, cached, rank| Candidate {
            room_tokens: Some(0),
            ..cand(scraped(waiting, 4, 0, 50), LEARNED, cached, rank)
        };
        let warm = full(9, 2_000, 1);
        let cold = full(0, 0, 0);
        // Warm: TTFT 0.9 s waiting + 0.02 step + 0.02 prefill = 0.94 s,
        // plus the 0.02 s prefill the 8 counted waiting wait for: 1.10 s.
        // Cold: 0.02 + 0.82 = 0.84 s. Free: the cold one wins.
        assert_eq!(best(&free, 2_050, &[warm, cold]).unwrap().0, 1);
        // Charged: the cold one's full cache loses 2,050 cached tokens
        // (0.82 s more: 1.66 s) against the warm one's 50 (1.12 s): the warm one
        // keeps the prefix, and the TTFT returned is still its own.
        let (i, t) = best(&charged, 2_050, &[warm, cold]).unwrap();
        assert_eq!(i, 0);
        assert!((t - 0.94).abs() < 1e-9, "{t}");
        // A cold replica with room for the prompt evicts nothing and wins
        // as it did; room for half of it is charged the other half.
        let roomy = Candidate {
            room_tokens: Some(4_096),
            ..cold
        };
        assert_eq!(best(&charged, 2_050, &[warm, roomy]).unwrap().0, 1);
        let half = Candidate {
            room_tokens: Some(1_025),
            ..cold
        };
        assert_eq!(best(&charged, 2_050, &[warm, half]).unwrap().0, 0);
        // A prefix nothing holds goes where it evicts nothing, whatever
        // the rendezvous order says; without a known capacity, no charge.
        let new = [
            full(0, 0, 0),
            Candidate {
                room_tokens: Some(2_050),
                ..full(0, 0, 1)
            },
        ];
        assert_eq!(best(&charged, 2_050, &new).unwrap().0, 1);
        let unknown = [
            Candidate {
                room_tokens: None,
                ..full(0, 0, 0)
            },
            new[1],
        ];
        assert_eq!(best(&charged, 2_050, &unknown).unwrap().0, 0);
    }

    #[test]
    fn charged_preemptions_move_a_hit_off_a_replica_whose_answers_will_not_fit() {
        let charged = CostModel {
            kv_wait: KvWait::None,
            preemptions: Preemptions::Charged,
            ..MODEL
        };
        let free = CostModel {
            preemptions: Preemptions::Free,
            ..charged
        };
        // 1,450 of 1,500 prompt tokens cached on the warm replica, one
        // waiting and six running there with 16 output tokens left each,
        // and 100 free KV tokens: its 50 uncached tokens and the seven
        // answers' 112 need 162. The cold replica has room for all of it.
        let warm = |free_kv| cand(scraped(1, 6, free_kv, 16), LEARNED, 1_450, 0);
        let cold = cand(scraped(0, 2, 3_000, 16), LEARNED, 0, 1);
        // Warm: 0.1 s waiting + 0.02 step + 0.02 prefill, and the 0.02 s
        // its one waiting request waits for it: 0.16 s. Cold: 0.02 + 0.6.
        assert_eq!(best(&free, 1_500, &[warm(100), cold]).unwrap().0, 0);
        // Charged: 62 tokens short is one preemption, a 1,500-token prompt
        // prefilled again (0.6 s): 0.76 s, and the cold replica wins.
        assert_eq!(best(&charged, 1_500, &[warm(100), cold]).unwrap().0, 1);
        // With room for the answers nothing is charged.
        assert_eq!(best(&charged, 1_500, &[warm(162), cold]).unwrap().0, 0);
        // Whole prompts: one token short is one, a prompt and a token two.
        let short = |by: u64| charged.preempted_tokens(scraped(0, 0, 1_000, 0), 1_000 + by, 1_500);
        assert_eq!((short(0), short(1), short(1_501)), (0, 1_500, 3_000));
        // Without a fresh scrape of the cache, or free, no charge.
        let local = Ahead::Local { in_flight: 9 };
        assert_eq!(charged.preempted_tokens(local, 5_000, 1_500), 0);
        assert_eq!(free.preempted_tokens(scraped(0, 0, 0, 0), 5_000, 1_500), 0);
    }

    #[test]
    fn learned_rates_replace_the_priors_per_replica() {
        // Same cache, same queue: the replica that learned it prefills three
        // times slower loses; without learned rates the priors tie them.
        let fast = cand(scraped(1, 1, 10_000, 0), LEARNED, 0, 1);
        let slow = Candidate {
            rates: Rates {
                prefill_tokens_per_second: Some(2_500.0 / 3.0),
                prefill_seconds_per_request: Some(0.3),
                decode_step_seconds: Some(0.06),
                prefill_requests: SETTLED,
                ..NO_RATES
            },
            rank: 0,
            ..fast
        };
        assert_eq!(best(&MODEL, 1_000, &[slow, fast]).unwrap().0, 1);
        let unlearned = |rank| Candidate {
            rates: NO_RATES,
            rank,
            ..fast
        };
        assert_eq!(
            best(&MODEL, 1_000, &[unlearned(1), unlearned(0)])
                .unwrap()
                .0,
            1
        );
        // Scraped queue terms: 1 waiting × 0.1 s + one 0.02 s step + 0.4 s.
        let t = MODEL.expected_ttft(fast.ahead, &LEARNED, 1_000);
        assert!((t - 0.52).abs() < 1e-9, "{t}");
    }

    #[test]
    fn rates_of_one_hardware_count_as_their_median() {
        let with_rate = |tokens_per_second: f64, waiting, rank| Candidate {
            rates: Rates {
                prefill_tokens_per_second: Some(tokens_per_second),
                prefill_seconds_per_request: Some(0.1),
                decode_step_seconds: Some(0.02),
                prefill_requests: SETTLED,
                ..NO_RATES
            },
            ..cand(scraped(waiting, 1, 10_000, 0), LEARNED, 0, rank)
        };
        // Rates 10 % apart, the same queue: one hardware, so the tie goes
        // by rendezvous rank, not to the replica that measured faster.
        let (a, b) = (with_rate(2_400.0, 0, 0), with_rate(2_640.0, 0, 1));
        assert_eq!(best(&MODEL, 1_000, &[a, b]).unwrap().0, 0);
        // With the band off, the faster-measured one wins.
        let own = CostModel {
            rate_band: 1.0,
            ..MODEL
        };
        assert_eq!(best(&own, 1_000, &[a, b]).unwrap().0, 1);
        // A replica three times slower is outside the band, and so is its
        // pair: both keep their own rates, and the slow one loses even with
        // the lower rank.
        let (slow, fast) = (with_rate(2_500.0 / 3.0, 0, 0), with_rate(2_500.0, 0, 1));
        assert_eq!(best(&MODEL, 1_000, &[slow, fast]).unwrap().0, 1);
        // Among four, an outlier keeps its own rate while the other three
        // share the median: the outlier at a fifth of the others' speed
        // loses, and the three are told apart by their queues.
        let four = [
            with_rate(500.0, 0, 0),
            with_rate(2_500.0, 1, 1),
            with_rate(2_600.0, 0, 2),
            with_rate(2_700.0, 1, 3),
        ];
        assert_eq!(best(&MODEL, 1_000, &four).unwrap().0, 2);
    }

    #[test]
    fn a_replica_that_has_not_learned_is_costed_at_its_peers_rates() {
        let learned = Rates {
            prefill_tokens_per_second: Some(1_000.0),
            prefill_seconds_per_request: Some(0.5),
            decode_step_seconds: Some(0.05),
            prefill_requests: SETTLED,
            ..NO_RATES
        };
        let a = cand(scraped(2, 1, 10_000, 0), learned, 0, 0);
        let b = cand(scraped(3, 1, 10_000, 0), NO_RATES, 0, 1);
        // At the priors (10,000 tokens/s, 0.02 s a request) the replica
        // without a sample looks ten times faster and would take the
        // request despite its longer queue; at its peer's rates it costs
        // what its queue says, with the band on or off.
        assert_eq!(best(&MODEL, 2_000, &[a, b]).unwrap().0, 0);
        let own = CostModel {
            rate_band: 1.0,
            ..MODEL
        };
        assert_eq!(best(&own, 2_000, &[a, b]).unwrap().0, 0);
        // Without any sample the priors stand, and the shorter queue wins.
        let a = cand(scraped(2, 1, 10_000, 0), NO_RATES, 0, 1);
        assert_eq!(best(&MODEL, 2_000, &[a, b]).unwrap().0, 0);
    }

    /// Fewer tokens a second and fewer seconds a request than the median
    /// is a replica given shorter prompts: it counts as the median. Slower
    /// by both, or several times off, it keeps its own rates.
    #[test]
    fn a_replica_that_differs_by_its_prompt_mix_counts_as_the_median() {
        let typical = TypicalRates {
            tokens_per_second: Some(4_000.0),
            seconds_per_request: Some(0.2),
            decode_step: Some(0.02),
        };
        let at = |tokens_per_second: f64, seconds_per_request: f64| {
            let rates = Rates {
                prefill_tokens_per_second: Some(tokens_per_second),
                prefill_seconds_per_request: Some(seconds_per_request),
                decode_step_seconds: Some(0.02),
                prefill_requests: 1_000_000,
                ..NO_RATES
            };
            let r = same_hardware(rates, typical, 1.25);
            (
                r.prefill_tokens_per_second.unwrap().round(),
                (r.prefill_seconds_per_request.unwrap() * 1e3).round(),
            )
        };
        // Short prompts: slower per token, faster per request; and the
        // other way round for long ones.
        assert_eq!(at(2_500.0, 0.12), (4_000.0, 200.0));
        assert_eq!(at(6_000.0, 0.3), (4_000.0, 200.0));
        // Slower by both: other hardware, its own rates.
        assert_eq!(at(2_500.0, 0.32), (2_500.0, 320.0));
        // Opposite ways, but one rate more than twice off: its own.
        assert_eq!(at(1_500.0, 0.12), (1_500.0, 120.0));
        // Within the band either way: the median, as before.
        assert_eq!(at(3_600.0, 0.21), (4_000.0, 200.0));
    }

    #[test]
    fn a_rate_learned_from_few_requests_counts_little_against_its_peers() {
        let rate = |tokens_per_second: f64, prefill_requests: u64| Rates {
            prefill_tokens_per_second: Some(tokens_per_second),
            prefill_seconds_per_request: Some(0.1),
            decode_step_seconds: Some(0.02),
            prefill_requests,
            ..NO_RATES
        };
        let at = |rates, rank| cand(scraped(1, 1, 10_000, 0), rates, 0, rank);
        // A replica whose one request was prefilled while it was idle
        // measured 6,000 tokens/s against its peers' 2,500: faster, so
        // weighed against their median as 64 requests' worth, it counts as
        // 2,554, inside the band, so it is one of them and the tie goes by
        // rank.
        let lucky = [
            at(rate(2_500.0, SETTLED), 0),
            at(rate(6_000.0, 1), 1),
            at(rate(2_500.0, SETTLED), 2),
        ];
        assert_eq!(best(&MODEL, 2_000, &lucky).unwrap().0, 0);
        // The same rate behind a thousand requests is a faster replica.
        let faster = [lucky[0], at(rate(6_000.0, SETTLED), 1), lucky[2]];
        assert_eq!(best(&MODEL, 2_000, &faster).unwrap().0, 1);
        // Eight requests are not enough to be believed faster (2,889,
        // inside the band) but are enough to be believed slower: 1,000
        // tokens/s counts as 1,750, outside the band, and that replica
        // loses even with the first rank.
        let eight_faster = [lucky[0], at(rate(6_000.0, 8), 1), lucky[2]];
        assert_eq!(best(&MODEL, 2_000, &eight_faster).unwrap().0, 0);
        let eight_slower = [
            at(rate(1_000.0, 8), 0),
            at(rate(2_500.0, SETTLED), 1),
            lucky[2],
        ];
        assert_eq!(best(&MODEL, 2_000, &eight_slower).unwrap().0, 1);
    }

    #[test]
    fn the_median_is_the_middle_rate_or_the_mean_of_the_two_middle_ones() {
        let with = |tokens_per_second: Option<f64>| Candidate {
            rates: Rates {
                prefill_tokens_per_second: tokens_per_second,
                ..NO_RATES
            },
            ..local(0, 0, 0)
        };
        let of = |rates: &[Option<f64>]| {
            let cands: Vec<Candidate> = rates.iter().map(|&r| with(r)).collect();
            TypicalRates::of(&cands).tokens_per_second
        };
        assert_eq!(of(&[]), None);
        assert_eq!(of(&[None, None]), None);
        assert_eq!(of(&[Some(3.0), None, Some(1.0), Some(2.0)]), Some(2.0));
        assert_eq!(of(&[Some(4.0), Some(1.0), Some(3.0), Some(2.0)]), Some(2.5));
        assert_eq!(of(&[Some(5.0)]), Some(5.0));
    }

    #[test]
    fn ties_follow_rendezvous_rank() {
        let c = |rank| local(1, 0, rank);
        assert_eq!(best(&MODEL, 100, &[c(2), c(0), c(1)]).unwrap().0, 1);
        assert_eq!(best(&MODEL, 100, &[]), None);
    }

    #[test]
    fn scraped_load_only_when_fresh_for_all() {
        use crate::replica::ScrapedLoad;
        let fresh = |w| {
            Some(ScrapedLoad {
                running: Some(1),
                waiting: Some(w),
                ..ScrapedLoad::default()
            })
        };
        let mut views = vec![
            ReplicaView {
                in_flight: 7,
                load: fresh(3),
                ..ReplicaView::default()
            },
            ReplicaView {
                in_flight: 2,
                load: fresh(0),
                ..ReplicaView::default()
            },
        ];
        let scraped = |waiting, running| Ahead::Scraped {
            waiting,
            running,
            free_kv_tokens: None,
            remaining_per_request: 0,
        };
        assert_eq!(
            requests_ahead(&views, 1_000),
            vec![scraped(3, 1), scraped(0, 1)]
        );
        views[1].load = None;
        assert_eq!(
            requests_ahead(&views, 1_000),
            vec![Ahead::Local { in_flight: 7 }, Ahead::Local { in_flight: 2 }]
        );
    }

    /// One dominant system prompt, 8 replicas, every request lasting the
    /// time of 80 arrivals (10 in flight per replica on average). With the
    /// cache-aware score, no replica ever holds more than 1.5× the mean
    /// in-flight load once the fleet is warm, and each serves within ±25 %
    /// of the mean count. Sending every hit to its warm replica would put
    /// everything on one.
    #[test]
    fn dominant_prompt_spreads_instead_of_melting_one_replica() {
        const N: usize = 8;
        const DURATION: usize = 80;
        let prompt = 2_050u64;
        let system = 2_000u64;
        let mut warm = [false; N];
        let mut in_flight = [0u64; N];
        let mut served = [0u64; N];
        let mut finishing: VecDeque<(usize, usize)> = VecDeque::new();
        let mut worst_ratio: f64 = 0.0;
        for t in 0..4_000usize {
            while finishing.front().is_some_and(|(end, _)| *end <= t) {
                let (_, r) = finishing.pop_front().unwrap();
                in_flight[r] -= 1;
            }
            let cands: Vec<Candidate> = (0..N)
                .map(|r| local(in_flight[r], if warm[r] { system } else { 0 }, r))
                .collect();
            let (r, _) = best(&MODEL, prompt, &cands).unwrap();
            warm[r] = true;
            in_flight[r] += 1;
            served[r] += 1;
            finishing.push_back((t + DURATION, r));
            if t >= 2 * DURATION {
                let mean = in_flight.iter().sum::<u64>() as f64 / N as f64;
                let max = *in_flight.iter().max().unwrap() as f64;
                worst_ratio = worst_ratio.max(max / mean);
            }
        }
        assert!(
            warm.iter().all(|w| *w),
            "the prefix spread to every replica"
        );
        assert!(worst_ratio <= 1.5, "max/mean in flight {worst_ratio}");
        let mean = served.iter().sum::<u64>() as f64 / N as f64;
        for s in served {
            assert!(
                (s as f64) <= 1.25 * mean && (s as f64) >= 0.75 * mean,
                "{served:?}"
            );
        }
    }
}

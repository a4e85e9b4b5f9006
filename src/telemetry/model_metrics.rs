//! Per-model request metrics, recorded when an answer ends: what a user of
//! a model saw (time to first token, whether it streamed, tokens), plus
//! `llmlb_build_info`. Only requests that reached a pool are counted, so the
//! `model` label holds configured names, never whatever a client sent.

use std::sync::OnceLock;

use prometheus::{Histogram, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

use super::Family;

/// Time-to-first-token buckets in seconds.
const TTFT_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

#[derive(Debug, Clone)]
pub struct ModelMetrics {
    /// `llmlb_time_to_first_token_seconds{pool,model,stream}`.
    pub ttft: HistogramVec,
    /// `llmlb_model_requests_total{pool,model,stream,status}`.
    pub requests: IntCounterVec,
    /// `llmlb_model_tokens_total{pool,model,kind}` (`prompt`, `completion`, `cached`).
    pub tokens: IntCounterVec,
    /// Predicted against reported cached prompt tokens (prefix routing).
    pub prefix_loop: super::PrefixLoopMetrics,
}

impl ModelMetrics {
    pub fn register(registry: &Registry) -> ModelMetrics {
        let family = Family::new(registry);
        let ttft = family.histogram("llmlb_time_to_first_token_seconds", "Time from request arrival to the first generated text (streams) or the first byte of the answer (stream=\"false\": the whole generation).", &["pool", "model", "stream"], TTFT_BUCKETS);
        let requests = family.counter(
            "llmlb_model_requests_total",
            "Requests finished, by pool, model, streaming and status.",
            &["pool", "model", "stream", "status"],
        );
        let tokens = family.counter("llmlb_model_tokens_total", "Tokens reported in the replicas' usage, by pool, model and kind (prompt, completion, cached).", &["pool", "model", "kind"]);
        let build = IntGauge::with_opts(
            Opts::new("llmlb_build_info", "Always 1; the labels name the build.")
                .const_label("version", env!("CARGO_PKG_VERSION")),
        )
        .expect("metric");
        build.set(1);
        family.collector(build);
        // CPU seconds, resident memory, open file descriptors, threads,
        // start time (`process_*`, Linux only; nothing elsewhere).
        family.collector(prometheus::process_collector::ProcessCollector::for_self());
        ModelMetrics {
            ttft,
            requests,
            tokens,
            prefix_loop: super::PrefixLoopMetrics::register(registry),
        }
    }
}

/// The `kind` labels of `llmlb_model_tokens_total`, in [`ModelSeries::record`]'s order.
const TOKEN_KINDS: [&str; 3] = ["prompt", "completion", "cached"];

/// One model's series in one pool, streamed or not, looked up by label the
/// first time each is needed and kept (with the replica that answered,
/// `ReplicaSeries::model`) rather than on every request: `with_label_values`
/// hashes its labels and takes the vector's lock each time. Statuses other
/// than 200 keep the lookup by label (rare, and an open set). A series still
/// appears in `/metrics` only once something was counted in it.
#[derive(Debug)]
pub struct ModelSeries {
    model: Box<str>,
    stream: bool,
    ok: OnceLock<IntCounter>,
    ttft: OnceLock<Histogram>,
    tokens: [OnceLock<IntCounter>; 3],
}

impl ModelSeries {
    pub fn new(model: &str, stream: bool) -> ModelSeries {
        ModelSeries {
            model: model.into(),
            stream,
            ok: OnceLock::new(),
            ttft: OnceLock::new(),
            tokens: Default::default(),
        }
    }

    /// Whether this is `model`'s series, streamed or not.
    pub fn is(&self, model: &str, stream: bool) -> bool {
        self.stream == stream && &*self.model == model
    }

    /// Counts one finished request in `pool` under its status `label`, its
    /// time to first token (seconds) and the tokens its usage reported
    /// (prompt, completion, cached).
    pub fn record(
        &self,
        m: &ModelMetrics,
        pool: &str,
        label: &str,
        ttft: Option<f64>,
        tokens: [Option<u64>; 3],
    ) {
        let stream = if self.stream { "true" } else { "false" };
        let model = &*self.model;
        if label == "200" {
            self.ok
                .get_or_init(|| m.requests.with_label_values(&[pool, model, stream, "200"]))
                .inc();
        } else {
            m.requests
                .with_label_values(&[pool, model, stream, label])
                .inc();
        }
        if let Some(t) = ttft {
            self.ttft
                .get_or_init(|| m.ttft.with_label_values(&[pool, model, stream]))
                .observe(t);
        }
        for ((n, kind), handle) in tokens.into_iter().zip(TOKEN_KINDS).zip(&self.tokens) {
            if let Some(n) = n {
                handle
                    .get_or_init(|| m.tokens.with_label_values(&[pool, model, kind]))
                    .inc_by(n);
            }
        }
    }
}

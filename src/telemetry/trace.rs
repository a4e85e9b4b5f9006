//! Request traces over OTLP (`[telemetry.otlp]`), with the OpenTelemetry SDK.
//!
//! One span per request (`llmlb.request`, kind server) from the moment the
//! request is handed over until its answer ends or the client goes away,
//! and children for the stages that take time: `llmlb.queue` (the wait for
//! a pool's admission permit), `llmlb.route` (the routing decision) and one
//! `llmlb.upstream` per attempt (kind client, until the replica's response
//! headers arrive or the attempt fails). A client's W3C `traceparent` (and
//! `tracestate`) is continued; each attempt sends its own context to the
//! replica, so a replica that traces (vLLM with `--otlp-traces-endpoint`)
//! joins the same trace.
//!
//! Finished spans are batched on a tokio task and posted as OTLP/JSON every
//! `export_interval`; an export that fails or times out drops its spans,
//! never slows a request. With no `[telemetry.otlp]` table there is no
//! [`Tracing`] at all and the request path does not touch this module.
//!
//! Each running llmlb owns its provider (nothing global), so several
//! instances in one process, as the tests run them, do not mix their spans.

use std::time::Duration;

use http::HeaderMap;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_http::{HeaderExtractor, HeaderInjector};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{BatchConfigBuilder, Sampler, SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::{Resource, runtime};

use crate::config::OtlpConfig;

/// The trace exporter could not be built from the config.
#[derive(Debug, thiserror::Error)]
#[error("telemetry.otlp: {0}")]
pub struct TraceSetupError(String);

/// A running exporter and the tracer that feeds it.
#[derive(Debug)]
pub struct Tracing {
    provider: SdkTracerProvider,
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
}

impl Tracing {
    /// Starts the exporter's batch task; needs a tokio runtime.
    pub fn start(config: &OtlpConfig) -> Result<Tracing, TraceSetupError> {
        let client =
            opentelemetry_http::hyper::HyperClient::with_default_connector(config.timeout, None);
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpJson)
            .with_endpoint(config.traces_url())
            .with_timeout(config.timeout)
            .build()
            .map_err(|e| TraceSetupError(e.to_string()))?;
        let batch = BatchConfigBuilder::default()
            .with_scheduled_delay(config.export_interval)
            .build();
        let processor = BatchSpanProcessor::builder(exporter, runtime::Tokio)
            .with_batch_config(batch)
            .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(processor)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                config.sample_ratio,
            ))))
            .with_resource(
                Resource::builder()
                    .with_service_name(config.service_name.clone())
                    .build(),
            )
            .build();
        let tracer = provider.tracer("llmlb");
        Ok(Tracing {
            provider,
            tracer,
            propagator: TraceContextPropagator::new(),
        })
    }

    /// The span of one request, continuing the client's trace if it sent one.
    pub fn request(&self, headers: &HeaderMap, method: &str, path: &str) -> RequestTrace {
        let parent = self.propagator.extract(&HeaderExtractor(headers));
        let span = self
            .tracer
            .span_builder(format!("{method} {path}"))
            .with_kind(SpanKind::Server)
            .with_attributes([
                KeyValue::new("http.request.method", method.to_string()),
                KeyValue::new("url.path", path.to_string()),
            ])
            .start_with_context(&self.tracer, &parent);
        RequestTrace {
            tracer: self.tracer.clone(),
            propagator: self.propagator.clone(),
            cx: parent.with_span(span),
        }
    }

    /// Sends what is buffered and stops the exporter (at shutdown).
    pub async fn shutdown(&self) {
        let provider = self.provider.clone();
        // The SDK blocks on the batch task's answer: off the runtime's workers.
        let done = tokio::task::spawn_blocking(move || provider.shutdown());
        match tokio::time::timeout(Duration::from_secs(10), done).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "trace exporter shutdown"),
            Ok(Err(e)) => tracing::warn!(error = %e, "trace exporter shutdown"),
            Err(_) => tracing::warn!("trace exporter did not stop within 10s"),
        }
    }
}

/// The span of one request; ends when [`RequestTrace::end`] is called or
/// the value is dropped.
#[derive(Debug)]
pub struct RequestTrace {
    tracer: SdkTracer,
    propagator: TraceContextPropagator,
    cx: Context,
}

impl RequestTrace {
    /// A child span that ends when the returned value is dropped.
    pub fn stage(&self, name: &'static str) -> StageSpan {
        let span = self.tracer.start_with_context(name, &self.cx);
        StageSpan {
            cx: self.cx.with_span(span),
        }
    }

    /// The span of one upstream attempt; `headers` (the request about to
    /// go to the replica) get its `traceparent`.
    pub fn attempt(&self, replica: &str, attempt: usize, headers: &mut HeaderMap) -> StageSpan {
        let span = self
            .tracer
            .span_builder("llmlb.upstream")
            .with_kind(SpanKind::Client)
            .with_attributes([
                KeyValue::new("llmlb.replica", replica.to_string()),
                KeyValue::new("llmlb.attempt", attempt as i64),
            ])
            .start_with_context(&self.tracer, &self.cx);
        let cx = self.cx.with_span(span);
        self.propagator
            .inject_context(&cx, &mut HeaderInjector(headers));
        StageSpan { cx }
    }

    /// Adds an attribute to the request's span.
    pub fn set(&self, key: &'static str, value: impl Into<opentelemetry::Value>) {
        self.cx
            .span()
            .set_attribute(KeyValue::new(key, value.into()));
    }

    /// Ends the request's span with its final status and outcome; `error`
    /// sets the span's status to an error named by the outcome.
    pub fn end(self, status: u16, outcome: &'static str, error: bool) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
        span.set_attribute(KeyValue::new("llmlb.outcome", outcome));
        if error {
            span.set_status(Status::error(outcome));
        }
        span.end();
    }
}

impl Drop for RequestTrace {
    fn drop(&mut self) {
        self.cx.span().end();
    }
}

/// A child span (a stage or an upstream attempt), ended on drop.
#[derive(Debug)]
pub struct StageSpan {
    cx: Context,
}

impl StageSpan {
    pub fn set(&self, key: &'static str, value: impl Into<opentelemetry::Value>) {
        self.cx
            .span()
            .set_attribute(KeyValue::new(key, value.into()));
    }

    /// Marks the stage failed, with a short reason.
    pub fn fail(&self, reason: &'static str) {
        self.cx.span().set_status(Status::error(reason));
    }
}

impl Drop for StageSpan {
    fn drop(&mut self) {
        self.cx.span().end();
    }
}

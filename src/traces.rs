//! Traces: OpenTelemetry spans for requests, runs, turns and tool calls, exported over
//! OTLP/HTTP (protobuf) when `--otlp-endpoint` is set.
//!
//! The span tree of a run (names and attributes follow the OpenTelemetry HTTP and GenAI
//! semantic conventions where they fit):
//!
//! ```text
//! POST /agui/{agent}          SERVER    the request that started the run
//! └─ invoke_agent {agent}     INTERNAL  the run: admission to its last terminal event
//!    ├─ turn                  INTERNAL  one segment: RUN_STARTED to its terminal event
//!    │  └─ execute_tool {name} INTERNAL a tool call: its start to its result or answer
//!    └─ turn                  INTERNAL  the next segment, after the client answered
//! ```
//!
//! A run outlives its request, so the run span usually ends after its parent. Every other
//! request has its own `SERVER` span (continuing a W3C `traceparent` when the client sends
//! one); the turn a request opens by answering a suspended run links to that request's span.
//!
//! Attributes carry ids (thread, run, tool call), names, status codes, outcomes and error
//! codes, never message text, tool arguments, query strings or a token.
//!
//! Off (no endpoint) there is no provider, no exporter and no span: every hook is behind an
//! `Option` that is `None`. On, spans are batched and sent from the SDK's own thread; the
//! HTTP client (`http::otlp`) runs on the daemon's tokio runtime. [`Exporter::shutdown`]
//! flushes what is left during the graceful shutdown.

use std::collections::HashMap;
use std::time::Duration;

use opentelemetry::trace::{
    Link, SpanContext, SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};

/// How long one export may take.
pub const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// An OTLP/HTTP collector's traces URL, validated: `http[s]://host[:port][/path]`, with no
/// credentials and no query. Given as the collector's base URL (the
/// `OTEL_EXPORTER_OTLP_ENDPOINT` convention), it gets `/v1/traces` appended; a URL that
/// already ends with `/v1/traces` is kept as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpEndpoint(String);

impl OtlpEndpoint {
    pub fn parse(text: &str) -> Result<OtlpEndpoint, String> {
        let fail = |why: &str| format!("invalid OTLP endpoint {text:?}: {why}");
        let uri: http::Uri = text.trim().parse().map_err(|_| fail("not a URL"))?;
        let scheme = match uri.scheme_str() {
            Some(scheme @ ("http" | "https")) => scheme,
            _ => return Err(fail("expected http[s]://HOST[:PORT][/PATH]")),
        };
        let Some(authority) = uri.authority() else {
            return Err(fail("expected http[s]://HOST[:PORT][/PATH]"));
        };
        if authority.as_str().contains('@') {
            return Err(fail("credentials in the URL are not supported"));
        }
        if uri.query().is_some() {
            return Err(fail("a query is not supported"));
        }
        let path = uri.path().trim_end_matches('/');
        let path = if path.ends_with("/v1/traces") {
            path.to_owned()
        } else {
            format!("{path}/v1/traces")
        };
        Ok(OtlpEndpoint(format!("{scheme}://{authority}{path}")))
    }

    /// The collector is reached over TLS.
    pub fn is_https(&self) -> bool {
        self.0.starts_with("https://")
    }

    /// The URL spans are posted to.
    pub fn traces_url(&self) -> &str {
        &self.0
    }
}

/// Why traces could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("cannot set up the OTLP exporter: {0}")]
pub struct TraceError(String);

impl From<std::io::Error> for TraceError {
    fn from(error: std::io::Error) -> TraceError {
        TraceError(error.to_string())
    }
}

/// The span pipeline: batches spans and exports them. Owned by the server, flushed at the
/// end of the shutdown sequence.
#[derive(Debug)]
pub struct Exporter {
    provider: SdkTracerProvider,
}

/// Makes spans; cloned into the HTTP layer and the runtime.
#[derive(Debug, Clone)]
pub struct Tracer {
    inner: SdkTracer,
}

impl Exporter {
    /// Starts the pipeline towards `endpoint`, exporting with `client` (the HTTP layer's,
    /// handed in by the server: this module knows no HTTP stack).
    pub fn start(
        endpoint: &OtlpEndpoint,
        client: impl opentelemetry_http::HttpClient + 'static,
    ) -> Result<(Exporter, Tracer), TraceError> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(endpoint.traces_url())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|e| TraceError(e.to_string()))?;
        let resource = Resource::builder_empty()
            .with_service_name("agui-serve")
            .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        let tracer = Tracer {
            inner: provider.tracer("agui-serve"),
        };
        Ok((Exporter { provider }, tracer))
    }

    /// Exports every span ended so far and stops the pipeline, waiting at most `within`.
    pub async fn shutdown(self, within: Duration) {
        let provider = self.provider;
        // The SDK blocks while its thread exports; the export itself runs on this runtime.
        let done =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(within)).await;
        match done {
            Ok(Ok(())) => tracing::info!("traces flushed"),
            Ok(Err(error)) => tracing::warn!(%error, "traces not flushed"),
            Err(error) => tracing::warn!(%error, "traces not flushed"),
        }
    }
}

/// What the HTTP layer knows of a request when it starts.
#[derive(Debug)]
pub struct RequestInfo<'a> {
    pub method: &'a str,
    /// The matched route's template (`/agui/threads/{id}/stream`), if a route matched.
    pub route: Option<String>,
    pub path: &'a str,
    pub scheme: &'static str,
    /// `1.1` or `2`.
    pub protocol_version: &'static str,
}

impl Tracer {
    /// Starts a request's `SERVER` span, a child of `parent` (the client's `traceparent`,
    /// or an empty context).
    pub fn request(&self, parent: &Context, info: RequestInfo<'_>) -> RequestSpan {
        let name = match &info.route {
            Some(route) => format!("{} {route}", info.method),
            None => info.method.to_owned(),
        };
        let mut attributes = vec![
            KeyValue::new("http.request.method", info.method.to_owned()),
            KeyValue::new("url.path", info.path.to_owned()),
            KeyValue::new("url.scheme", info.scheme),
            KeyValue::new("network.protocol.version", info.protocol_version),
        ];
        if let Some(route) = info.route {
            attributes.push(KeyValue::new("http.route", route));
        }
        let span = self
            .inner
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .start_with_context(&self.inner, parent);
        RequestSpan {
            cx: parent.with_span(span),
        }
    }

    /// Starts a run's `invoke_agent` span, a child of the current context's span (the
    /// request that starts the run: the HTTP layer runs its handler in that context).
    pub fn run(&self, agent: &str, thread_id: &str, run_id: &str) -> RunTrace {
        let parent = Context::current();
        let span = self
            .inner
            .span_builder(format!("invoke_agent {agent}"))
            .with_kind(SpanKind::Internal)
            .with_attributes([
                KeyValue::new("gen_ai.operation.name", "invoke_agent"),
                KeyValue::new("gen_ai.agent.name", agent.to_owned()),
                KeyValue::new("gen_ai.conversation.id", thread_id.to_owned()),
                KeyValue::new("agui.run.id", run_id.to_owned()),
            ])
            .start_with_context(&self.inner, &parent);
        RunTrace {
            tracer: self.inner.clone(),
            run: Context::new().with_span(span),
            turn: None,
            turns: 0,
            tools: HashMap::new(),
        }
    }
}

/// The span context of the current context's span, when it has one (a request answering a
/// suspended run hands it to the turn it opens, as a link).
pub fn current_span_context() -> Option<SpanContext> {
    let cx = Context::current();
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid().then(|| sc.clone())
}

/// A request's span; ended with the response's status.
#[derive(Debug)]
pub struct RequestSpan {
    cx: Context,
}

impl RequestSpan {
    /// The context the request's handler runs in (its span is the parent of what it starts).
    pub fn context(&self) -> Context {
        self.cx.clone()
    }

    /// Ends the span when the response head is ready (a stream goes on in its run's span).
    pub fn end(self, status: u16) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status),
        ));
        if status >= 500 {
            span.set_attribute(KeyValue::new("error.type", status.to_string()));
            span.set_status(Status::error(""));
        }
        span.end();
    }
}

/// How a turn (a run segment) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnOutcome {
    Finished,
    /// Waits on the client: frontend tool calls or a permission.
    Suspended,
    /// Waits on the client: AG-UI interrupts.
    Interrupted,
    Cancelled,
    Error,
}

impl TurnOutcome {
    fn word(self) -> &'static str {
        match self {
            TurnOutcome::Finished => "finished",
            TurnOutcome::Suspended => "suspended",
            TurnOutcome::Interrupted => "interrupted",
            TurnOutcome::Cancelled => "cancelled",
            TurnOutcome::Error => "error",
        }
    }
}

/// A run's spans: the run, its current turn and its open tool calls. Held by the run's pump
/// only. Whatever is still open when it is dropped ends then.
#[derive(Debug)]
pub struct RunTrace {
    tracer: SdkTracer,
    run: Context,
    turn: Option<Context>,
    turns: i64,
    tools: HashMap<String, OpenTool>,
}

#[derive(Debug)]
struct OpenTool {
    cx: Context,
    /// The client runs it (a frontend tool or a permission question): it ends when the
    /// client answers, i.e. when the next turn opens.
    on_client: bool,
}

impl RunTrace {
    /// A turn starts: `run_id` is the segment's AG-UI run id; `link` the span of the request
    /// that answered the previous turn, if any.
    pub fn turn_started(&mut self, run_id: &str, link: Option<SpanContext>) {
        self.end_turn(None, None);
        self.turns += 1;
        let mut builder = self
            .tracer
            .span_builder("turn")
            .with_kind(SpanKind::Internal)
            .with_attributes([
                KeyValue::new("agui.run.id", run_id.to_owned()),
                KeyValue::new("agui.turn.index", self.turns),
            ]);
        if let Some(link) = link {
            builder = builder.with_links(vec![Link::with_context(link)]);
        }
        let span = builder.start_with_context(&self.tracer, &self.run);
        self.turn = Some(self.run.with_span(span));
    }

    /// The current turn ends (`code`: the `RUN_ERROR` code of an error).
    pub fn turn_ended(&mut self, how: TurnOutcome, code: Option<&str>) {
        self.end_turn(Some(how), code);
    }

    fn end_turn(&mut self, how: Option<TurnOutcome>, code: Option<&str>) {
        let Some(turn) = self.turn.take() else {
            return;
        };
        let span = turn.span();
        if let Some(how) = how {
            span.set_attribute(KeyValue::new("agui.turn.end", how.word()));
            mark_error(&span, how, code);
        }
        span.end();
    }

    /// A tool call opens (the agent's, unless [`RunTrace::tool_on_client`] says otherwise).
    pub fn tool_started(&mut self, tool_call_id: &str, name: &str) {
        let parent = self.turn.as_ref().unwrap_or(&self.run);
        let span = self
            .tracer
            .span_builder(format!("execute_tool {name}"))
            .with_kind(SpanKind::Internal)
            .with_attributes([
                KeyValue::new("gen_ai.operation.name", "execute_tool"),
                KeyValue::new("gen_ai.tool.name", name.to_owned()),
                KeyValue::new("gen_ai.tool.call.id", tool_call_id.to_owned()),
                KeyValue::new("gen_ai.tool.type", "extension"),
            ])
            .start_with_context(&self.tracer, parent);
        let cx = parent.with_span(span);
        if let Some(earlier) = self.tools.insert(
            tool_call_id.to_owned(),
            OpenTool {
                cx,
                on_client: false,
            },
        ) {
            earlier.cx.span().end();
        }
    }

    /// The tool call is the client's to run (a frontend tool, a permission question).
    pub fn tool_on_client(&mut self, tool_call_id: &str) {
        if let Some(tool) = self.tools.get_mut(tool_call_id) {
            tool.on_client = true;
            tool.cx
                .span()
                .set_attribute(KeyValue::new("gen_ai.tool.type", "function"));
        }
    }

    /// A tool call got its result.
    pub fn tool_ended(&mut self, tool_call_id: &str) {
        if let Some(tool) = self.tools.remove(tool_call_id) {
            tool.cx.span().end();
        }
    }

    /// The client answered (or the wait failed closed): its tool calls end, those in
    /// `abandoned` as errors.
    pub fn client_answered(&mut self, abandoned: &[String]) {
        let ids: Vec<String> = self
            .tools
            .iter()
            .filter(|(_, tool)| tool.on_client)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            let Some(tool) = self.tools.remove(&id) else {
                continue;
            };
            let span = tool.cx.span();
            if abandoned.contains(&id) {
                span.set_attribute(KeyValue::new("error.type", "cancelled"));
                span.set_status(Status::error("no answer"));
            }
            span.end();
        }
    }

    /// The run ends: whatever is open ends with it.
    pub fn ended(&mut self, how: TurnOutcome, code: Option<&str>) {
        for (_, tool) in self.tools.drain() {
            tool.cx.span().end();
        }
        self.end_turn(Some(how), code);
        let span = self.run.span();
        span.set_attribute(KeyValue::new("agui.run.outcome", how.word()));
        mark_error(&span, how, code);
        span.end();
    }
}

fn mark_error(span: &opentelemetry::trace::SpanRef<'_>, how: TurnOutcome, code: Option<&str>) {
    if how == TurnOutcome::Error {
        span.set_attribute(KeyValue::new(
            "error.type",
            code.unwrap_or("error").to_owned(),
        ));
        span.set_status(Status::error(""));
    }
}

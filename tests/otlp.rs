//! Traces over OTLP/HTTP: the built binary with `--otlp-endpoint` sends its spans to a small
//! OTLP/HTTP receiver in this test (hyper, protobuf decoded with opentelemetry-proto), and
//! every run is one span tree: the request that started it, `invoke_agent demo`, its turns
//! and its tool calls, with the GenAI and HTTP attributes and never the token.

mod support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message as _;
use serde_json::{Value, json};
use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_agui-serve");

/// What the receiver got: the decoded spans, the resource attributes, and each request's
/// path and content type.
#[derive(Default)]
struct Received {
    spans: Vec<Span>,
    resource: Vec<(String, String)>,
    requests: Vec<(String, String)>,
}

/// An OTLP/HTTP receiver on a loopback port: decodes every `ExportTraceServiceRequest`
/// and answers with an empty `ExportTraceServiceResponse`.
async fn receiver() -> (String, Arc<Mutex<Received>>) {
    receiver_on(None).await
}

/// The receiver, over TLS with `tls`.
async fn receiver_on(tls: Option<tokio_rustls::TlsAcceptor>) -> (String, Arc<Mutex<Received>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let scheme = if tls.is_some() { "https" } else { "http" };
    let url = format!("{scheme}://{}", listener.local_addr().expect("addr"));
    let received = Arc::new(Mutex::new(Received::default()));
    let sink = received.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let sink = sink.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let sink = sink.clone();
                    async move {
                        let path = req.uri().path().to_owned();
                        let kind = req
                            .headers()
                            .get("content-type")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_owned();
                        let body = req.into_body().collect().await?.to_bytes();
                        let export =
                            ExportTraceServiceRequest::decode(body).expect("an OTLP export");
                        let mut sink = sink.lock().expect("lock");
                        sink.requests.push((path, kind));
                        for resource_spans in export.resource_spans {
                            if let Some(resource) = resource_spans.resource {
                                sink.resource = resource
                                    .attributes
                                    .iter()
                                    .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
                                    .collect();
                            }
                            for scope in resource_spans.scope_spans {
                                sink.spans.extend(scope.spans);
                            }
                        }
                        let response = hyper::Response::builder()
                            .header("content-type", "application/x-protobuf")
                            .body(Full::new(Bytes::new()))
                            .expect("response");
                        Ok::<_, hyper::Error>(response)
                    }
                });
                let http = hyper::server::conn::http1::Builder::new();
                match tls {
                    None => {
                        let _ = http.serve_connection(TokioIo::new(stream), service).await;
                    }
                    Some(tls) => {
                        let Ok(stream) = tls.accept(stream).await else {
                            return;
                        };
                        let _ = http.serve_connection(TokioIo::new(stream), service).await;
                    }
                }
            });
        }
    });
    (url, received)
}

fn text(value: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(Any::StringValue(s)) => s.clone(),
        Some(Any::IntValue(i)) => i.to_string(),
        Some(Any::BoolValue(b)) => b.to_string(),
        Some(Any::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

fn attrs(span: &Span) -> HashMap<String, String> {
    span.attributes
        .iter()
        .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
        .collect()
}

/// The daemon as an operator runs it, plain HTTP on a free port, spans to `endpoint`.
struct Daemon {
    child: Child,
    base: String,
    stderr: Arc<Mutex<String>>,
}

impl Daemon {
    /// The demo agent, and the scripted ACP agent as `scripted`.
    fn start(endpoint: &str) -> Daemon {
        Daemon::start_with(endpoint, &[])
    }

    fn start_with(endpoint: &str, envs: &[(&str, &std::path::Path)]) -> Daemon {
        let home = temp_dir("otlp-home");
        let config = home.join("agui.toml");
        // JSON strings are valid TOML basic strings.
        let toml = format!(
            "[[agents]]\nname = \"demo\"\nkind = \"demo\"\n\n\
             [[agents]]\nname = \"scripted\"\nkind = \"acp\"\ncommand = [{}]\n\
             env = {{ SCRIPTED_AGENT_STATE = {} }}\n\
             sandbox = {{ write = [{}] }}\n",
            json!(scripted_agent()),
            json!(home.join("scripted")),
            json!(home.join("scripted")),
        );
        std::fs::write(&config, toml).expect("config");
        let mut child = Command::new(BIN)
            .args(["--port", "0", "--no-tls", "--token", TOKEN])
            .args(["--otlp-endpoint", endpoint])
            .args(["--data-dir", &home.join("data").to_string_lossy()])
            .args(["--config", &config.to_string_lossy()])
            .env_remove("AGUI_CONFIG")
            .env("HOME", &home)
            .envs(envs.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn agui-serve");
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let mut err = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = std::io::Read::read_to_string(&mut err, &mut text);
            sink.lock().expect("lock").push_str(&text);
        });
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        out.read_line(&mut line).expect("stdout");
        let base = line
            .trim()
            .strip_prefix("agui-serve listening on ")
            .expect("the listening line")
            .to_owned();
        Daemon {
            child,
            base,
            stderr,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    async fn run(&self, body: &Value) -> Vec<SseFrame> {
        self.run_on("demo", body).await
    }

    async fn run_on(&self, agent: &str, body: &Value) -> Vec<SseFrame> {
        let response = client()
            .post(self.url(&format!("/{agent}")))
            .bearer_auth(TOKEN)
            .json(body)
            .sent()
            .await;
        assert_eq!(response.status(), 200);
        let frames = SseReader::new(response).collect().await;
        assert_valid_segment(&frames);
        frames
    }

    /// SIGTERM, then the exit: the shutdown flushes the spans. Returns the daemon's log.
    fn stop(mut self) -> String {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(status.success(), "clean exit: {status}");
                // The log ends with the process.
                let deadline = Instant::now() + Duration::from_secs(5);
                while Arc::strong_count(&self.stderr) > 1 && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(10));
                }
                return self.stderr.lock().expect("lock").clone();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("the daemon did not exit after SIGTERM");
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tool_run(thread: &str, run: &str, messages: Value) -> Value {
    json!({
        "threadId": thread, "runId": run, "protocolVersion": "1.0", "messages": messages,
        "tools": [{"name": "chart", "description": "draws a chart", "parameters": {"type": "object"}}],
    })
}

/// Every span of the trace holding `span`, checked to be one tree under one root.
fn tree<'a>(spans: &'a [Span], member: &Span) -> (&'a Span, Vec<&'a Span>) {
    let trace: Vec<&Span> = spans
        .iter()
        .filter(|s| s.trace_id == member.trace_id)
        .collect();
    let roots: Vec<&&Span> = trace
        .iter()
        .filter(|s| s.parent_span_id.is_empty())
        .collect();
    assert_eq!(roots.len(), 1, "one root per trace: {:?}", names(&trace));
    for span in &trace {
        if !span.parent_span_id.is_empty() {
            assert!(
                trace.iter().any(|p| p.span_id == span.parent_span_id),
                "{}'s parent is in its trace",
                span.name
            );
        }
    }
    (roots[0], trace)
}

fn names(spans: &[&Span]) -> Vec<String> {
    spans.iter().map(|s| s.name.clone()).collect()
}

fn children<'a>(trace: &[&'a Span], parent: &Span) -> Vec<&'a Span> {
    let mut found: Vec<&Span> = trace
        .iter()
        .filter(|s| s.parent_span_id == parent.span_id)
        .copied()
        .collect();
    found.sort_by_key(|s| s.start_time_unix_nano);
    found
}

fn the_run<'a>(spans: &'a [Span], run_id: &str) -> &'a Span {
    let runs: Vec<&Span> = spans
        .iter()
        .filter(|s| s.name == "invoke_agent demo" && attrs(s)["agui.run.id"] == run_id)
        .collect();
    assert_eq!(runs.len(), 1, "one invoke_agent span for run {run_id}");
    runs[0]
}

/// The request span that is the root of a run's tree.
fn assert_request_root(root: &Span, status: &str) {
    let a = attrs(root);
    assert_eq!(root.name, "POST /agui/{agent}");
    assert_eq!(root.kind, SpanKind::Server as i32);
    assert_eq!(a["http.request.method"], "POST");
    assert_eq!(a["http.route"], "/agui/{agent}");
    assert_eq!(a["url.path"], "/agui/demo");
    assert_eq!(a["http.response.status_code"], status);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_run_is_one_span_tree_with_genai_names_and_no_token() {
    let (endpoint, received) = receiver().await;
    let daemon = Daemon::start(&endpoint);

    // A plain run.
    let frames = daemon.run(&run_body("otlp-plain", "p1", "hello")).await;
    assert_eq!(text_of(&frames), "You said: hello");

    // A frontend tool call: the run suspends, the client answers in a second request.
    let user = json!({"id": "tool-u", "role": "user", "content": "/tool chart {\"x\":1}"});
    let first = daemon
        .run(&tool_run("otlp-tool", "t1", json!([user])))
        .await;
    let start = first
        .iter()
        .find(|f| f.kind() == "TOOL_CALL_START")
        .expect("a tool call");
    let call_id = start.data["toolCallId"].as_str().expect("id").to_owned();
    let answer = json!([
        user,
        {"id": call_id, "role": "assistant", "toolCalls": [{"id": call_id, "type": "function", "function": {"name": "chart", "arguments": "{\"x\":1}"}}]},
        {"id": "tool-t", "role": "tool", "toolCallId": call_id, "content": "a bar chart"}
    ]);
    let second = daemon.run(&tool_run("otlp-tool", "t2", answer)).await;
    assert_eq!(text_of(&second), "Tool chart returned: a bar chart");

    // A failing run.
    let failed = daemon.run(&run_body("otlp-fail", "f1", "/fail boom")).await;
    assert_eq!(failed.last().expect("terminal").kind(), "RUN_ERROR");

    // An ACP agent's own tool calls.
    let acp = daemon
        .run_on("scripted", &run_body("otlp-acp", "a1", "tools"))
        .await;
    assert_eq!(text_of(&acp), "Used two tools.");

    // The token in a query (as EventSource sends it), and a W3C traceparent.
    let response = client()
        .get(daemon.url(&format!("/threads/otlp-plain/messages?token={TOKEN}")))
        .sent()
        .await;
    assert_eq!(response.status(), 200);
    let response = client()
        .get(daemon.url("/info"))
        .bearer_auth(TOKEN)
        .header(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        )
        .sent()
        .await;
    assert_eq!(response.status(), 200);

    daemon.stop();
    let received = received.lock().expect("lock");
    assert!(!received.requests.is_empty(), "spans were exported");
    for (path, kind) in &received.requests {
        assert_eq!(path, "/v1/traces");
        assert_eq!(kind, "application/x-protobuf");
    }
    assert!(
        received
            .resource
            .contains(&("service.name".to_owned(), "agui-serve".to_owned()))
    );
    let spans = &received.spans;

    // The plain run: POST -> invoke_agent demo -> one turn.
    let run = the_run(spans, "p1");
    let (root, trace) = tree(spans, run);
    assert_request_root(root, "200");
    assert_eq!(
        run.parent_span_id, root.span_id,
        "the run is the request's child"
    );
    let a = attrs(run);
    assert_eq!(a["gen_ai.operation.name"], "invoke_agent");
    assert_eq!(a["gen_ai.agent.name"], "demo");
    assert_eq!(a["gen_ai.conversation.id"], "otlp-plain");
    assert_eq!(a["agui.run.outcome"], "finished");
    let turns = children(&trace, run);
    assert_eq!(names(&turns), ["turn"]);
    let turn = attrs(turns[0]);
    assert_eq!(turn["agui.run.id"], "p1");
    assert_eq!(turn["agui.turn.end"], "finished");
    assert_eq!(trace.len(), 3, "{:?}", names(&trace));

    // The tool run: two turns (suspended, then answered), the tool call in the first, the
    // second linked to the request that answered.
    let run = the_run(spans, "t1");
    let (root, trace) = tree(spans, run);
    assert_request_root(root, "200");
    assert_eq!(run.parent_span_id, root.span_id);
    assert_eq!(attrs(run)["gen_ai.conversation.id"], "otlp-tool");
    assert_eq!(attrs(run)["agui.run.outcome"], "finished");
    let turns = children(&trace, run);
    assert_eq!(names(&turns), ["turn", "turn"]);
    let (one, two) = (attrs(turns[0]), attrs(turns[1]));
    assert_eq!(
        (one["agui.run.id"].as_str(), one["agui.turn.end"].as_str()),
        ("t1", "suspended")
    );
    assert_eq!(
        (two["agui.run.id"].as_str(), two["agui.turn.end"].as_str()),
        ("t2", "finished")
    );
    let tools = children(&trace, turns[0]);
    assert_eq!(names(&tools), ["execute_tool chart"]);
    let tool = attrs(tools[0]);
    assert_eq!(tool["gen_ai.operation.name"], "execute_tool");
    assert_eq!(tool["gen_ai.tool.name"], "chart");
    assert_eq!(tool["gen_ai.tool.call.id"], call_id);
    assert_eq!(tool["gen_ai.tool.type"], "function");
    assert!(
        tools[0].end_time_unix_nano >= turns[1].start_time_unix_nano - 1_000_000,
        "the client's tool call lasts until the answer"
    );
    assert_eq!(
        turns[1].links.len(),
        1,
        "the answered turn links its request"
    );
    let answering = spans
        .iter()
        .find(|s| s.span_id == turns[1].links[0].span_id)
        .expect("the answering request's span");
    assert_request_root(answering, "200");
    assert_ne!(
        answering.trace_id, run.trace_id,
        "the answer is its own request"
    );
    assert_eq!(trace.len(), 5, "{:?}", names(&trace));

    // The failing run: the error code, never the message.
    let run = the_run(spans, "f1");
    let a = attrs(run);
    assert_eq!(a["agui.run.outcome"], "error");
    assert_eq!(a["error.type"], "AGENT_ERROR");
    assert_eq!(run.status.as_ref().map(|s| s.code), Some(2), "status error");
    let (_, trace) = tree(spans, run);
    assert_eq!(attrs(children(&trace, run)[0])["agui.turn.end"], "error");

    // The ACP agent's tool calls: the agent's own ("extension"), inside the turn.
    let run = spans
        .iter()
        .find(|s| s.name == "invoke_agent scripted")
        .expect("the ACP run");
    assert_eq!(attrs(run)["gen_ai.agent.name"], "scripted");
    let (root, trace) = tree(spans, run);
    assert_eq!(attrs(root)["url.path"], "/agui/scripted");
    let turns = children(&trace, run);
    assert_eq!(names(&turns), ["turn"]);
    let tools = children(&trace, turns[0]);
    assert_eq!(
        names(&tools),
        ["execute_tool get_weather", "execute_tool read"]
    );
    for tool in &tools {
        let a = attrs(tool);
        assert_eq!(a["gen_ai.tool.type"], "extension");
        assert!(a["gen_ai.tool.call.id"].starts_with("call_"));
        assert!(tool.end_time_unix_nano <= turns[0].end_time_unix_nano);
    }

    // A request continues the client's trace; a query never reaches a span.
    let info = spans
        .iter()
        .find(|s| s.name == "GET /agui/info")
        .expect("the info request's span");
    assert_eq!(
        hex(&info.trace_id),
        "0af7651916cd43dd8448eb211c80319c",
        "traceparent honoured"
    );
    assert_eq!(hex(&info.parent_span_id), "b7ad6b7169203331");
    let messages = spans
        .iter()
        .find(|s| s.name == "GET /agui/threads/{id}/messages")
        .expect("the messages request's span");
    assert_eq!(
        attrs(messages)["url.path"],
        "/agui/threads/otlp-plain/messages"
    );

    // The token was on every request (header or query); no attribute carries it.
    let mut values = 0;
    for span in spans {
        for (key, value) in attrs(span) {
            values += 1;
            assert!(!value.contains(TOKEN), "{} {key} = {value}", span.name);
        }
        assert!(!span.name.contains(TOKEN));
    }
    assert!(values > 50, "attributes were seen: {values}");
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An https collector: its certificate is trusted through `SSL_CERT_FILE` (the system's
/// roots otherwise), and without that trust nothing is exported and the log says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spans_reach_an_https_collector_the_roots_trust() {
    let certs = temp_dir("otlp-tls");
    let acceptor = agui_serve::http::tls::self_signed_acceptor(&certs).expect("certificate");
    let (cert, _) = agui_serve::http::tls::self_signed_paths(&certs);
    let (endpoint, received) = receiver_on(Some(acceptor)).await;
    assert!(endpoint.starts_with("https://127.0.0.1:"));

    let daemon = Daemon::start_with(&endpoint, &[("SSL_CERT_FILE", cert.as_path())]);
    daemon.run(&run_body("otlp-tls", "s1", "hello")).await;
    daemon.stop();
    let spans = received.lock().expect("lock").spans.clone();
    let (_, trace) = tree(&spans, the_run(&spans, "s1"));
    assert_eq!(trace.len(), 3, "{:?}", names(&trace));

    // The same collector, not trusted: the roots hold another certificate only.
    let untrusted = temp_dir("otlp-tls-other");
    agui_serve::http::tls::self_signed_acceptor(&untrusted).expect("another certificate");
    let (wrong, _) = agui_serve::http::tls::self_signed_paths(&untrusted);
    let before = received.lock().expect("lock").spans.len();
    let daemon = Daemon::start_with(&endpoint, &[("SSL_CERT_FILE", wrong.as_path())]);
    daemon.run(&run_body("otlp-tls", "s2", "hello")).await;
    let log = daemon.stop();
    assert_eq!(
        received.lock().expect("lock").spans.len(),
        before,
        "nothing exported"
    );
    assert!(log.contains("trace export failed"), "{log}");
}

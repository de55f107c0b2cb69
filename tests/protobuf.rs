//! The protobuf encoding of the event stream (`Accept: application/vnd.ag-ui.event+proto`)
//! on the run and reattach routes: frames decoded with the types generated from the
//! vendored schema, compared with the SSE stream of the same input.

mod support;

use agui_serve::protocol::proto::{EVENT_ID_KEY, MEDIA_TYPE, UNREPRESENTED, ag_ui};
use prost::Message as _;
use prost_types::value::Kind;
use serde_json::{Value, json};
use support::*;

use ag_ui::event::Event as Arm;

/// One decoded frame, with what the tests compare: the AG-UI type it stands for (a
/// `CUSTOM` [`UNREPRESENTED`] event stands for the event it carries).
#[derive(Debug)]
struct Decoded {
    event: ag_ui::Event,
    kind: String,
    id: Option<String>,
}

/// Reads the protobuf frames of a response: a 4-byte big-endian length, then the message.
struct ProtoReader {
    response: reqwest::Response,
    buf: Vec<u8>,
}

impl ProtoReader {
    fn new(response: reqwest::Response) -> ProtoReader {
        assert_eq!(response.status(), 200);
        assert_eq!(header(&response, "content-type"), Some(MEDIA_TYPE));
        ProtoReader {
            response,
            buf: Vec::new(),
        }
    }

    async fn next(&mut self) -> Option<Decoded> {
        loop {
            if self.buf.len() >= 4 {
                let len = u32::from_be_bytes(self.buf[..4].try_into().expect("prefix")) as usize;
                if self.buf.len() >= 4 + len {
                    let event = ag_ui::Event::decode(&self.buf[4..4 + len]).expect("an Event");
                    self.buf.drain(..4 + len);
                    return Some(decoded(event));
                }
            }
            match self.response.chunk().await.expect("stream") {
                Some(chunk) => self.buf.extend_from_slice(&chunk),
                None => {
                    assert!(self.buf.is_empty(), "trailing partial frame");
                    return None;
                }
            }
        }
    }

    async fn collect(mut self) -> Vec<Decoded> {
        let mut out = Vec::new();
        while let Some(frame) = self.next().await {
            out.push(frame);
        }
        out
    }
}

fn header<'a>(response: &'a reqwest::Response, name: &str) -> Option<&'a str> {
    response.headers().get(name).and_then(|v| v.to_str().ok())
}

fn decoded(event: ag_ui::Event) -> Decoded {
    let arm = event.event.as_ref().expect("a populated oneof");
    let base = base_of(arm).expect("a base event");
    let declared = ag_ui::EventType::try_from(base.r#type).expect("a known type");
    let kind = match arm {
        Arm::Custom(custom) if custom.name == UNREPRESENTED => {
            json_of(custom.value.as_ref().expect("value"))["type"]
                .as_str()
                .expect("the carried event's type")
                .to_owned()
        }
        _ => declared.as_str_name().to_owned(),
    };
    let id = base
        .metadata
        .as_ref()
        .and_then(|m| match &m.fields.get(EVENT_ID_KEY)?.kind {
            Some(Kind::StringValue(id)) => Some(id.clone()),
            _ => None,
        });
    Decoded { event, kind, id }
}

fn base_of(arm: &Arm) -> Option<&ag_ui::BaseEvent> {
    match arm {
        Arm::TextMessageStart(e) => e.base_event.as_ref(),
        Arm::TextMessageContent(e) => e.base_event.as_ref(),
        Arm::TextMessageEnd(e) => e.base_event.as_ref(),
        Arm::ToolCallStart(e) => e.base_event.as_ref(),
        Arm::ToolCallArgs(e) => e.base_event.as_ref(),
        Arm::ToolCallEnd(e) => e.base_event.as_ref(),
        Arm::StateSnapshot(e) => e.base_event.as_ref(),
        Arm::StateDelta(e) => e.base_event.as_ref(),
        Arm::MessagesSnapshot(e) => e.base_event.as_ref(),
        Arm::Raw(e) => e.base_event.as_ref(),
        Arm::Custom(e) => e.base_event.as_ref(),
        Arm::RunStarted(e) => e.base_event.as_ref(),
        Arm::RunFinished(e) => e.base_event.as_ref(),
        Arm::RunError(e) => e.base_event.as_ref(),
        Arm::StepStarted(e) => e.base_event.as_ref(),
        Arm::StepFinished(e) => e.base_event.as_ref(),
        Arm::TextMessageChunk(e) => e.base_event.as_ref(),
        Arm::ToolCallChunk(e) => e.base_event.as_ref(),
        Arm::SubagentStarted(e) => e.base_event.as_ref(),
        Arm::SubagentFinished(e) => e.base_event.as_ref(),
        Arm::SubagentError(e) => e.base_event.as_ref(),
    }
}

fn json_of(value: &prost_types::Value) -> Value {
    match value.kind.as_ref().expect("a kind") {
        Kind::NullValue(_) => Value::Null,
        Kind::BoolValue(b) => json!(b),
        Kind::NumberValue(n) => json!(n),
        Kind::StringValue(s) => json!(s),
        Kind::ListValue(list) => Value::Array(list.values.iter().map(json_of).collect()),
        Kind::StructValue(s) => Value::Object(
            s.fields
                .iter()
                .map(|(k, v)| (k.clone(), json_of(v)))
                .collect(),
        ),
    }
}

fn proto_kinds(frames: &[Decoded]) -> Vec<String> {
    frames.iter().map(|f| f.kind.clone()).collect()
}

fn proto_text(frames: &[Decoded]) -> String {
    frames
        .iter()
        .filter_map(|f| match &f.event.event {
            Some(Arm::TextMessageContent(c)) => Some(c.delta.as_str()),
            _ => None,
        })
        .collect()
}

async fn post_proto(server: &TestServer, path: &str, body: &Value) -> reqwest::Response {
    server
        .post(path)
        .header("accept", MEDIA_TYPE)
        .json(body)
        .sent()
        .await
}

async fn sse_run(server: &TestServer, body: &Value) -> Vec<SseFrame> {
    SseReader::new(post_run(server, "demo", body).await)
        .collect()
        .await
}

#[tokio::test]
async fn a_run_over_protobuf_carries_the_events_of_its_sse_stream() {
    let server = TestServer::start().await;
    for (input, body) in [
        ("reply", run_body as fn(&str, &str, &str) -> Value),
        ("legacy reply", legacy_body),
    ] {
        let sse = sse_run(&server, &body(&format!("sse-{input}"), "r1", "hello there")).await;
        let response = post_proto(
            &server,
            "/demo",
            &body(&format!("pb-{input}"), "r1", "hello there"),
        )
        .await;
        assert_eq!(header(&response, "vary"), Some("accept"));
        assert_eq!(header(&response, "agui-resume"), Some("exact"));
        let frames = ProtoReader::new(response).collect().await;
        assert_eq!(proto_kinds(&frames), kinds(&sse), "{input}");
        assert_eq!(proto_text(&frames), text_of(&sse), "{input}");
        let Some(Arm::RunStarted(started)) = &frames[0].event.event else {
            panic!("{input}: first frame {:?}", frames[0]);
        };
        assert_eq!(
            (started.thread_id.as_str(), started.run_id.as_str()),
            (&*format!("pb-{input}"), "r1")
        );
        // Every frame names its position, as the SSE `id:` line does.
        assert!(
            frames.iter().all(|f| f.id.is_some()),
            "{input}: a frame without its id"
        );
    }
}

#[tokio::test]
async fn the_run_routes_answer_protobuf_only_when_asked_by_name() {
    let server = TestServer::start().await;
    // The CopilotKit run route is the run route.
    let frames =
        ProtoReader::new(post_proto(&server, "/agent/demo/run", &run_body("ck", "r1", "hi")).await)
            .collect()
            .await;
    assert_eq!(frames.last().map(|f| f.kind.as_str()), Some("RUN_FINISHED"));
    // Wildcards, ties and a preference for SSE get SSE.
    for accept in [
        "*/*",
        "application/vnd.ag-ui.event+proto, text/event-stream",
        "application/vnd.ag-ui.event+proto;q=0.5, */*",
    ] {
        let response = server
            .post("/demo")
            .header("accept", accept)
            .json(&run_body(&format!("sse-{accept}"), "r1", "hi"))
            .sent()
            .await;
        assert_eq!(
            header(&response, "content-type"),
            Some("text/event-stream"),
            "{accept}"
        );
        SseReader::new(response).collect().await;
    }
}

#[tokio::test]
async fn unacceptable_or_unoffered_protobuf_is_406_before_any_stream() {
    let server = TestServer::start().await;
    let not_acceptable = |response: reqwest::Response| async move {
        assert_eq!(response.status(), 406);
        assert_eq!(header(&response, "content-type"), Some("application/json"));
        let body: Value = response.json().await.expect("json");
        assert_eq!(body["code"], "NOT_ACCEPTABLE");
    };
    let refused = server
        .post("/demo")
        .header("accept", "application/vnd.ag-ui.event+proto;q=0")
        .json(&run_body("q0", "r1", "hi"))
        .sent()
        .await;
    not_acceptable(refused).await;
    // Routes that stream SSE only: CopilotKit's connect, the fleet stream.
    let connect = server
        .post("/agent/demo/connect")
        .header("accept", MEDIA_TYPE)
        .json(&json!({"threadId": "q0"}))
        .sent()
        .await;
    not_acceptable(connect).await;
    let fleet = server
        .get("/fleet/stream")
        .header("accept", MEDIA_TYPE)
        .sent()
        .await;
    not_acceptable(fleet).await;
    // A bad body is still a JSON 400, whatever the stream would have been.
    let bad = server
        .post("/demo")
        .header("accept", MEDIA_TYPE)
        .json(&json!({"threadId": "t"}))
        .sent()
        .await;
    assert_eq!(bad.status(), 400);
    assert_eq!(header(&bad, "content-type"), Some("application/json"));
}

#[tokio::test]
async fn a_failing_run_ends_with_run_error_inside_the_stream() {
    let server = TestServer::start().await;
    let frames = ProtoReader::new(
        post_proto(&server, "/demo", &run_body("fail", "r1", "/fail no luck")).await,
    )
    .collect()
    .await;
    let Some(Arm::RunError(error)) = &frames.last().expect("frames").event.event else {
        panic!("last frame {:?}", frames.last());
    };
    assert!(error.message.contains("no luck"), "{error:?}");
}

#[tokio::test]
async fn events_without_a_protobuf_message_arrive_as_custom_events_carrying_them() {
    let server = TestServer::start().await;
    let sse = sse_run(&server, &run_body("think-sse", "r1", "/think hmm")).await;
    let frames = ProtoReader::new(
        post_proto(&server, "/demo", &run_body("think-pb", "r1", "/think hmm")).await,
    )
    .collect()
    .await;
    assert_eq!(proto_kinds(&frames), kinds(&sse));
    let carried: Vec<Value> = frames
        .iter()
        .filter_map(|f| match &f.event.event {
            Some(Arm::Custom(c)) if c.name == UNREPRESENTED => Some(json_of(c.value.as_ref()?)),
            _ => None,
        })
        .collect();
    assert!(
        carried
            .iter()
            .any(|e| e["type"] == "REASONING_MESSAGE_CONTENT"),
        "{carried:?}"
    );
    // The carried events are the SSE events themselves.
    let reasoning: Vec<&Value> = sse
        .iter()
        .map(|f| &f.data)
        .filter(|d| {
            d["type"]
                .as_str()
                .is_some_and(|t| t.starts_with("REASONING"))
        })
        .collect();
    assert_eq!(carried.len(), reasoning.len());
    for (carried, sse) in carried.iter().zip(reasoning) {
        assert_eq!(carried["type"], sse["type"]);
        assert_eq!(carried.get("delta"), sse.get("delta"));
    }
}

#[tokio::test]
async fn a_protobuf_reader_resumes_exactly_after_the_id_its_events_carry() {
    let server = TestServer::start().await;
    let whole = text_of(&sse_run(&server, &run_body("slow-sse", "r1", "/slow 6 5")).await);
    let mut reader = ProtoReader::new(
        post_proto(&server, "/demo", &run_body("slow-pb", "r1", "/slow 6 5")).await,
    );
    let mut seen = Vec::new();
    while seen
        .iter()
        .filter(|f: &&Decoded| f.kind == "TEXT_MESSAGE_CONTENT")
        .count()
        < 2
    {
        seen.push(reader.next().await.expect("a frame"));
    }
    drop(reader);
    let last = seen.last().and_then(|f| f.id.clone()).expect("an id");
    let response = server
        .get(&format!("/threads/slow-pb/stream?lastEventId={last}"))
        .header("accept", MEDIA_TYPE)
        .sent()
        .await;
    assert_eq!(header(&response, "agui-resume"), Some("exact"));
    let rest = ProtoReader::new(response).collect().await;
    assert_eq!(format!("{}{}", proto_text(&seen), proto_text(&rest)), whole);
    assert_eq!(rest.last().map(|f| f.kind.as_str()), Some("RUN_FINISHED"));
}

#[tokio::test]
async fn a_thread_at_rest_hydrates_over_protobuf() {
    let server = TestServer::start().await;
    sse_run(&server, &run_body("rest", "r1", "hello")).await;
    let response = server
        .get("/threads/rest/stream")
        .header("accept", MEDIA_TYPE)
        .sent()
        .await;
    let frames = ProtoReader::new(response).collect().await;
    assert_eq!(proto_kinds(&frames), SNAPSHOT_RUN);
    let Some(Arm::MessagesSnapshot(snapshot)) = &frames[1].event.event else {
        panic!("{:?}", frames[1]);
    };
    let roles: Vec<&str> = snapshot.messages.iter().map(|m| m.role.as_str()).collect();
    assert_eq!(roles, ["user", "assistant"]);
    assert_eq!(
        snapshot.messages[1].content.as_deref(),
        Some("You said: hello")
    );
}

/// The body of a protobuf stream in paused time: what goes out in the first minute of a
/// run whose chunks are 40 s apart, by second; the SSE stream of the same input has a
/// keep-alive in each silence.
#[tokio::test(start_paused = true)]
async fn a_protobuf_stream_sends_nothing_in_a_silence_where_sse_sends_a_keep_alive() {
    use agui_serve::agent::demo::DemoAgent;
    use agui_serve::runtime::{Runtime, RuntimeOptions};
    use http_body_util::BodyExt;
    use std::collections::BTreeMap;
    use std::sync::Arc;

    let mut agents: BTreeMap<String, Arc<dyn agui_serve::agent::Agent>> = BTreeMap::new();
    agents.insert("demo".into(), Arc::new(DemoAgent));
    let store = agui_serve::store::Store::open(&temp_dir("pb-ka")).expect("store");
    let runtime = Runtime::new(agents, RuntimeOptions::new(2), store);
    let first_minute = |origin: tokio::time::Instant| move || origin.elapsed().as_secs() <= 60;

    let mut sse = runtime
        .start_run("demo", run_input("ka-sse", "r", "/slow 3 40000"))
        .await
        .expect("start");
    let in_time = first_minute(tokio::time::Instant::now());
    let mut keep_alives = 0;
    while let Some(bytes) = sse.next().await {
        if !in_time() {
            break;
        }
        keep_alives += usize::from(bytes.starts_with(b":"));
    }
    assert!(keep_alives > 0, "the SSE stream had no silence to fill");

    let attachment = runtime
        .start_run("demo", run_input("ka-pb", "r2", "/slow 3 40000"))
        .await
        .expect("start");
    let origin = tokio::time::Instant::now();
    let mut body = agui_serve::http::body::protobuf_stream(attachment);
    let mut sent_at = Vec::new();
    while let Some(frame) = body.frame().await {
        let at = origin.elapsed().as_secs();
        if at > 60 {
            break;
        }
        let data = frame.expect("frame").into_data().expect("data");
        // Whole frames only: each a length and a message.
        let mut rest = &data[..];
        while !rest.is_empty() {
            let len = u32::from_be_bytes(rest[..4].try_into().expect("prefix")) as usize;
            ag_ui::Event::decode(&rest[4..4 + len]).expect("an Event");
            rest = &rest[4 + len..];
        }
        sent_at.push(at);
    }
    sent_at.dedup();
    // The run's chunks at 0 and 40 s, and nothing in between.
    assert_eq!(sent_at, [0, 40]);
}

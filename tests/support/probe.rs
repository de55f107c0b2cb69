//! The scripted ACP agent as a probe: a confined agent per thread workspace, a daemon with
//! its data directory and token file, scoped tokens, and a probe's plan run as a turn.

use std::path::{Path, PathBuf};

use agui_serve::config::{AcpConfig, AgentConfig, AgentKind, Config, Hitl, Permissions};
use agui_serve::confine::Confinement;
use agui_serve::workspace::{Source, Unit, WorkspaceConfig};
use serde_json::{Value, json};

use super::*;

/// The scripted agent with a workspace per thread under the data directory.
pub fn probe_agent(
    name: &str,
    confinement: Confinement,
    data: &Path,
    quota: Option<u64>,
) -> AgentConfig {
    let mut config = AcpConfig::new(vec![scripted_agent().display().to_string()]);
    config.permissions = Permissions::Allow;
    config.confinement = Some(confinement);
    config.workspace = Some(WorkspaceConfig {
        source: Source::Empty,
        root: data.join("workspaces"),
        quota,
        unit: Unit::Thread,
        checkpoints: agui_serve::workspace::DEFAULT_CHECKPOINTS,
    });
    AgentConfig {
        name: name.to_owned(),
        description: "probe".to_owned(),
        hitl: Hitl::Tool,
        multitask: Default::default(),
        history: Default::default(),
        budget: None,
        kind: AgentKind::Acp(config),
    }
}

pub struct Setup {
    pub server: TestServer,
    /// The daemon's data directory.
    pub data: PathBuf,
    pub token_file: PathBuf,
}

pub async fn setup(tag: &str, adjust: impl FnOnce(&mut Config, &Path) + Send + 'static) -> Setup {
    let secrets = temp_dir(&format!("{tag}-secrets"));
    let token_file = secrets.join("token");
    std::fs::write(&token_file, TOKEN).expect("token file");
    let data = temp_dir(&format!("{tag}-data"));
    let (d, t) = (data.clone(), token_file.clone());
    let server = TestServer::with(move |c| {
        c.data_dir = d.clone();
        c.private_files = vec![t];
        adjust(c, &d);
    })
    .await;
    Setup {
        server,
        data,
        token_file,
    }
}

/// Mints a scoped token for `sub`.
pub async fn token_for(server: &TestServer, sub: &str) -> String {
    let response = server
        .post("/tokens")
        .json(&json!({"sub": sub}))
        .sent()
        .await;
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.expect("json");
    answer["token"].as_str().expect("token").to_owned()
}

/// One run of `text` on `thread` as `token`: its frames.
pub async fn turn(
    server: &TestServer,
    token: &str,
    agent: &str,
    thread: &str,
    text: &str,
) -> Vec<SseFrame> {
    let run = format!("r-{}", uuid::Uuid::new_v4());
    let response = client()
        .post(server.url(&format!("/{agent}")))
        .bearer_auth(token)
        .json(&run_body(thread, &run, text))
        .sent()
        .await;
    assert_eq!(response.status(), 200, "{text}");
    SseReader::new(response).collect().await
}

/// The agent's reply to `text`.
pub async fn say(
    server: &TestServer,
    token: &str,
    agent: &str,
    thread: &str,
    text: &str,
) -> String {
    let frames = turn(server, token, agent, thread, text).await;
    assert_eq!(
        frames.last().map(SseFrame::kind),
        Some("RUN_FINISHED"),
        "{text}: {:?}",
        kinds(&frames)
    );
    text_of(&frames)
}

/// The probe's outcomes for `plan`.
pub async fn probe(
    server: &TestServer,
    token: &str,
    agent: &str,
    thread: &str,
    plan: Value,
) -> Value {
    let reply = say(server, token, agent, thread, &format!("probe {plan}")).await;
    let json = reply.strip_prefix("Probe: ").expect("a probe report");
    serde_json::from_str(json).expect("probe json")
}

/// The operator's key, in a file the daemon reads.
pub fn key_file(tag: &str, key: &str) -> PathBuf {
    let dir = temp_dir(&format!("{tag}-key"));
    let path = dir.join("model.key");
    std::fs::write(&path, format!("{key}\n")).expect("key");
    path
}

/// Python that asks the model through the relay as Claude Code does (the base URL and key
/// from the environment), for a streamed answer or a whole one (its length given). Prints
/// the status, then whether the stream began as a Messages stream, or the whole answer's
/// output tokens.
pub fn ask_model(stream: bool) -> String {
    let python_bool = if stream { "True" } else { "False" };
    format!(
        r#"
import os, json, urllib.request
request = urllib.request.Request(
    os.environ['ANTHROPIC_BASE_URL'] + '/v1/messages',
    data=json.dumps({{'model': 'm', 'max_tokens': 10, 'stream': {python_bool},
                     'messages': [{{'role': 'user', 'content': 'hi'}}]}}).encode(),
    headers={{'x-api-key': os.environ['ANTHROPIC_API_KEY'], 'content-type': 'application/json'}})
with urllib.request.urlopen(request, timeout=10) as answer:
    body = answer.read().decode()
if {python_bool}:
    print(answer.status, 'message_start' in body)
else:
    print(answer.status, json.loads(body)['usage']['output_tokens'])
"#
    )
}

//! The built binary as an operator runs it: defaults, exit codes, check-config, secrets in
//! logs, and SIGTERM with open streams.

mod support;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_agui-serve");

struct Daemon {
    child: Child,
    base: String,
    token: Option<String>,
    stderr: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Daemon {
    /// Starts the binary and waits for its "listening on" line.
    fn start(args: &[&str], envs: &[(&str, &str)]) -> Daemon {
        Daemon::start_program(BIN, args, envs)
    }

    /// Starts `program` (the binary, or a shell that execs it) and waits for the
    /// binary's "listening on" line.
    fn start_program(program: &str, args: &[&str], envs: &[(&str, &str)]) -> Daemon {
        let home = temp_dir("home");
        let mut command = Command::new(program);
        command
            .args(args)
            .env_remove("AGUI_TOKEN")
            .env_remove("AGUI_CONFIG")
            .env_remove("STATE_DIRECTORY")
            .env("HOME", &home)
            .env("XDG_STATE_HOME", home.join("state"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        for (k, v) in envs {
            command.env(k, v);
        }
        let mut child = command.spawn().expect("spawn agui-serve");
        let stderr = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let sink = stderr.clone();
        let mut err = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            let mut buf = [0u8; 8192];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .expect("lock")
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        let mut base = None;
        let mut token = None;
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let mut line = String::new();
            if out.read_line(&mut line).expect("stdout") == 0 {
                break;
            }
            if let Some(url) = line.trim().strip_prefix("agui-serve listening on ") {
                base = Some(url.to_owned());
            }
            if let Some(t) = line.trim().strip_prefix("token: ") {
                token = Some(t.to_owned());
            }
            // The token line, when there is one, follows the listening line at once.
            if base.is_some() && (token.is_some() || !args.is_empty()) {
                break;
            }
        }
        std::thread::spawn(move || {
            let mut rest = String::new();
            let _ = out.read_to_string(&mut rest);
        });
        Daemon {
            child,
            base: base.expect("daemon printed its URL"),
            token,
            stderr,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    fn post(&self, path: &str) -> reqwest::RequestBuilder {
        client().post(self.url(path)).bearer_auth(TOKEN)
    }

    async fn get_json(&self, path: &str) -> serde_json::Value {
        let response = client().get(self.url(path)).bearer_auth(TOKEN).sent().await;
        response.json().await.expect("json")
    }

    /// Runs `text` on the demo agent's thread `t` to its end; the stream's frames.
    async fn run_to_end(&self, text: &str) -> Vec<SseFrame> {
        let r = self
            .post("/demo")
            .json(&run_body("t", "r", text))
            .sent()
            .await;
        assert_eq!(r.status(), 200);
        SseReader::new(r).collect().await
    }

    fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    fn wait(&mut self, bound: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + bound;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn logs(&self) -> String {
        self.stderr.lock().expect("lock").clone()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Cleartext on any port, with the test token, on the data directory `data`.
fn cleartext_args_on(data: &std::path::Path) -> Vec<String> {
    let data = data.to_str().expect("utf8");
    quiet_port_args(&["--no-tls", "--token", TOKEN, "--data-dir", data])
}

fn quiet_port_args(extra: &[&str]) -> Vec<String> {
    let mut args = vec!["--port".to_owned(), "0".to_owned()];
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_arguments_serves_tls_on_8443_with_a_printed_token() {
    let mut daemon = Daemon::start(&[], &[]);
    assert_eq!(daemon.base, "https://127.0.0.1:8443/agui");
    let token = daemon.token.clone().expect("generated token printed");
    assert_eq!(token.len(), 64);
    let response = client()
        .post(daemon.url("/demo"))
        .bearer_auth(&token)
        .json(&run_body("t", "r", "hi"))
        .sent()
        .await;
    assert_eq!(response.status(), 200);
    let frames = SseReader::new(response).collect().await;
    assert_valid_segment(&frames);
    daemon.signal("TERM");
    let status = daemon.wait(Duration::from_secs(15)).expect("exits");
    assert!(status.success());
    assert!(!daemon.logs().contains(&token), "generated token logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_never_appears_in_logs_even_at_trace() {
    let secret = "s3cret-token-for-log-test";
    let args = quiet_port_args(&["--token", secret, "--data-dir"]);
    let data = temp_dir("logs");
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args.push(data.to_str().expect("utf8"));
    let mut daemon = Daemon::start(&args, &[("RUST_LOG", "trace")]);
    assert!(daemon.base.starts_with("https://"));
    let h1 = reqwest::Client::builder()
        .danger_accept_invalid_certs(true)
        .http1_only()
        .build()
        .expect("client");
    let h2 = client();
    for http in [&h1, &h2] {
        // As a header.
        let r = http
            .post(daemon.url("/demo"))
            .bearer_auth(secret)
            .json(&run_body(&uuid::Uuid::new_v4().to_string(), "r", "hi"))
            .sent()
            .await;
        assert_eq!(r.status(), 200);
        SseReader::new(r).collect().await;
        // As the query fallback.
        let r = http
            .get(daemon.url(&format!("/info?token={secret}&x=1")))
            .sent()
            .await;
        assert_eq!(r.status(), 200);
        // Under other query names, after other separators, in the path: the value is
        // what is scrubbed, wherever it is.
        for path in [
            format!("/info?access_token={secret}"),
            format!("/info?a=1;token={secret}"),
            format!("/threads/{secret}"),
            format!("/{secret}"),
        ] {
            let r = http.get(daemon.url(&path)).bearer_auth(secret).sent().await;
            assert!(r.status().is_success() || r.status().is_client_error());
        }
        // A wrong token, echoed nowhere either.
        let r = http
            .get(daemon.url("/info?token=wrong-s3cret-guess"))
            .sent()
            .await;
        assert_eq!(r.status(), 401);
        // An agent error that mentions the token is sanitized.
        let r = http
            .post(daemon.url("/demo"))
            .bearer_auth(secret)
            .json(&run_body(
                &uuid::Uuid::new_v4().to_string(),
                "r",
                &format!("/fail leaked {secret} and password=hunter2"),
            ))
            .sent()
            .await;
        let frames = SseReader::new(r).collect().await;
        let last = frames.last().expect("frame");
        assert_eq!(last.kind(), "RUN_ERROR");
        let message = last.data["message"].as_str().expect("message");
        assert!(
            !message.contains(secret) && !message.contains("hunter2"),
            "{message}"
        );
    }
    daemon.signal("TERM");
    daemon.wait(Duration::from_secs(15)).expect("exits");
    let logs = daemon.logs();
    assert!(
        logs.contains("TRACE") || logs.contains("trace"),
        "trace logging was on"
    );
    assert!(logs.contains("token=[redacted]"), "query logged, scrubbed");
    assert!(
        logs.contains("access_token=[redacted]") && logs.contains("/threads/[redacted]"),
        "the value is scrubbed under any name"
    );
    assert!(!logs.contains(secret), "token found in logs");
    assert!(
        !logs.contains("wrong-s3cret-guess"),
        "presented token found in logs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_lines_name_the_principal_and_never_the_token() {
    let data = temp_dir("audit");
    let args = quiet_port_args(&["--token", TOKEN, "--log-format", "json", "--data-dir"]);
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args.push(data.to_str().expect("utf8"));
    let mut daemon = Daemon::start(&args, &[("RUST_LOG", "info")]);
    let minted: serde_json::Value = daemon
        .post("/tokens")
        .json(&serde_json::json!({"sub": "alice", "ttlSeconds": 60}))
        .sent()
        .await
        .json()
        .await
        .expect("json");
    let scoped = minted["token"].as_str().expect("token").to_owned();
    let r = client()
        .post(daemon.url("/demo"))
        .bearer_auth(&scoped)
        .json(&run_body("audited", "audited-r", "hi"))
        .sent()
        .await;
    assert_eq!(r.status(), 200);
    SseReader::new(r).collect().await;
    let r = client()
        .get(daemon.url(&format!("/threads/elsewhere?token={scoped}")))
        .sent()
        .await;
    assert_eq!(r.status(), 404);
    let r = client()
        .get(daemon.url("/threads"))
        .bearer_auth(format!("{scoped}x"))
        .sent()
        .await;
    assert_eq!(r.status(), 401);
    // No principal may take a name the audit line gives the operator.
    for sub in ["operator", "OPERATOR", "(unauthenticated)", "-"] {
        let r = daemon
            .post("/tokens")
            .json(&serde_json::json!({"sub": sub, "ttlSeconds": 60}))
            .sent()
            .await;
        assert_eq!(r.status(), 400, "{sub}");
    }
    // An origin refused is logged with the origin and the rule.
    let r = client()
        .get(daemon.url("/threads"))
        .bearer_auth(TOKEN)
        .header("origin", "https://page.example")
        .sent()
        .await;
    assert_eq!(r.status(), 403);
    daemon.signal("TERM");
    daemon.wait(Duration::from_secs(15)).expect("exits");
    let logs = daemon.logs();
    let refused = logs
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|line| line["fields"]["message"] == "origin refused")
        .expect("the refusal's log line");
    assert_eq!(refused["level"], "INFO");
    assert_eq!(refused["fields"]["origin"], "https://page.example");
    assert!(
        refused["fields"]["rule"]
            .as_str()
            .is_some_and(|r| r.contains("--allowed-origin")),
        "{refused}"
    );
    let audit: Vec<serde_json::Value> = logs
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["target"] == "audit")
        .collect();
    let find = |action: &str, outcome: &str| {
        audit
            .iter()
            .find(|line| line["fields"]["action"] == action && line["fields"]["outcome"] == outcome)
    };
    let run = find("run", "allowed").expect("the run's audit line");
    assert_eq!(run["fields"]["principal"], "alice");
    assert_eq!(run["fields"]["auth"], "scoped-token");
    let minted = find("tokens", "allowed").expect("the mint's audit line");
    assert_eq!(minted["fields"]["principal"], "operator");
    assert_eq!(minted["fields"]["auth"], "master-token");
    assert_eq!(run["fields"]["thread"], "audited");
    assert_eq!(run["fields"]["run"], "audited-r");
    let missing = find("thread", "not_found").expect("the 404's audit line");
    assert_eq!(missing["fields"]["principal"], "alice");
    assert_eq!(missing["fields"]["thread"], "elsewhere");
    assert!(find("threads", "denied").is_some(), "the 401 is audited");
    assert!(find("tokens", "allowed").is_some(), "minting is audited");
    assert!(!logs.contains(&scoped), "a scoped token found in the logs");
    assert!(!logs.contains(TOKEN), "the master token found in the logs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_secrets_never_appear_in_logs_even_at_trace() {
    let state = temp_dir("mcp-logs");
    let data = temp_dir("mcp-logs-data");
    // The agent records the MCP servers it was given in `state` (its env and sandbox).
    let config = temp_dir("mcp-logs-config").join("agui.toml");
    let toml = format!(
        "[[agents]]\nname = \"scripted\"\nkind = \"acp\"\ncommand = [{}]\n\
         env = {{ SCRIPTED_AGENT_STATE = {} }}\nsandbox = {{ write = [{}] }}\n",
        serde_json::json!(scripted_agent()),
        serde_json::json!(state),
        serde_json::json!(state),
    );
    std::fs::write(&config, toml).expect("config");
    let args = quiet_port_args(&[
        "--no-tls",
        "--token",
        TOKEN,
        "--data-dir",
        data.to_str().expect("utf8"),
        "--config",
        config.to_str().expect("utf8"),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut daemon = Daemon::start(&args, &[("RUST_LOG", "trace")]);
    let tools = serde_json::json!([{"name": "chart", "description": "draws", "parameters": {"type": "object"}}]);
    let body = serde_json::json!({"threadId": "t", "runId": "r", "protocolVersion": "1.0",
        "tools": tools,
        "messages": [{"id": "u", "role": "user", "content": "mcp chart {\"kind\":\"bar\"}"}]});
    let r = daemon.post("/scripted").json(&body).sent().await;
    assert_eq!(r.status(), 200);
    let frames = SseReader::new(r).collect().await;
    assert!(
        frames.iter().any(|f| f.kind() == "TOOL_CALL_START"),
        "the agent called the frontend tool over MCP: {:?}",
        kinds(&frames)
    );
    daemon.signal("TERM");
    daemon.wait(Duration::from_secs(15)).expect("exits");
    let recorded = std::fs::read_dir(&state)
        .expect("state dir")
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().ends_with(".mcp.json"))
        .expect("the agent recorded its MCP servers");
    let servers: serde_json::Value =
        serde_json::from_slice(&std::fs::read(recorded.path()).expect("read")).expect("json");
    let auth = servers[0]["headers"][0]["value"].as_str().expect("header");
    let secret = auth.strip_prefix("Bearer ").expect("bearer");
    assert!(secret.len() >= 32, "{secret}");
    let logs = daemon.logs();
    assert!(
        logs.contains("TRACE") && logs.contains("mcpServers"),
        "the ACP crate's trace output, with the session/new request, was on"
    );
    assert!(!logs.contains(secret), "MCP secret found in logs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_text_never_forges_log_lines() {
    let data = temp_dir("forged");
    let args = quiet_port_args(&[
        "--no-tls",
        "--token",
        TOKEN,
        "--data-dir",
        data.to_str().expect("utf8"),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut daemon = Daemon::start(&args, &[("RUST_LOG", "trace")]);
    for (thread, run) in [("t\r\nFORGED line", "r"), ("t", "r\nFORGED\u{1b}[2J")] {
        let r = daemon
            .post("/demo")
            .json(&run_body(thread, run, "hi"))
            .sent()
            .await;
        assert_eq!(r.status(), 400);
    }
    daemon.run_to_end("hi\nFORGED").await;
    daemon.signal("TERM");
    daemon.wait(Duration::from_secs(15)).expect("exits");
    let logs = daemon.logs();
    assert!(logs.contains("TRACE"), "trace logging was on");
    assert!(
        !logs.lines().any(|line| line.starts_with("FORGED")),
        "a forged line: {logs}"
    );
    assert!(
        !logs.contains('\u{1b}') && !logs.contains('\r'),
        "raw control characters"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_directory_and_database_are_private_under_umask_022() {
    use std::os::unix::fs::PermissionsExt;
    let parent = temp_dir("umask");
    let data = parent.join("state").join("agui-serve");
    let data_arg = data.to_str().expect("utf8").to_owned();
    // The daemon runs under `umask 022`, as from a login shell.
    let wrapper = format!("umask 022 && exec {BIN} \"$@\"");
    let mut args = vec!["-c", &wrapper, "agui-serve"];
    let daemon_args = quiet_port_args(&["--token", TOKEN, "--data-dir", &data_arg]);
    args.extend(daemon_args.iter().map(String::as_str));
    let mut daemon = Daemon::start_program("sh", &args, &[]);
    daemon.run_to_end("hi").await;
    let mode = |path: &std::path::Path| {
        std::fs::metadata(path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode(&data), 0o700, "data directory");
    assert_eq!(mode(&data.join("tls")), 0o700, "certificate directory");
    assert_eq!(mode(&data.join("tls/key.pem")), 0o600, "private key");
    for file in ["agui-serve.db", "agui-serve.db-wal", "agui-serve.db-shm"] {
        assert_eq!(mode(&data.join(file)), 0o600, "{file}");
    }
    daemon.signal("TERM");
    daemon.wait(Duration::from_secs(15)).expect("exits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_ends_open_streams_with_a_terminal_event_and_exits_within_grace() {
    let args = quiet_port_args(&["--no-tls", "--token", TOKEN, "--shutdown-grace", "2s"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut daemon = Daemon::start(&args, &[]);
    let mut readers = Vec::new();
    for i in 0..3 {
        let body = if i == 2 {
            legacy_body(&format!("t{i}"), &format!("r{i}"), "/slow 1000 50")
        } else {
            run_body(&format!("t{i}"), &format!("r{i}"), "/slow 1000 50")
        };
        let r = daemon.post("/demo").json(&body).sent().await;
        let mut reader = SseReader::new(r);
        assert_eq!(reader.next().await.expect("frame").kind(), "RUN_STARTED");
        readers.push(reader);
    }
    let sent = Instant::now();
    daemon.signal("TERM");
    for reader in readers {
        let frames = reader.collect().await;
        let last = frames.last().expect("terminal event");
        assert_eq!(last.kind(), "RUN_ERROR", "{:?}", kinds(&frames));
        assert_eq!(last.data["code"], "SHUTDOWN");
        let open_text = frames
            .iter()
            .filter(|f| f.kind() == "TEXT_MESSAGE_START")
            .count();
        let closed_text = frames
            .iter()
            .filter(|f| f.kind() == "TEXT_MESSAGE_END")
            .count();
        assert_eq!(open_text, closed_text, "message closed before the terminal");
    }
    let status = daemon.wait(Duration::from_secs(4)).expect("exited");
    assert!(status.success(), "{status:?}");
    assert!(
        sent.elapsed() < Duration::from_millis(2500),
        "{:?}",
        sent.elapsed()
    );
}

/// A second daemon on a data directory another one serves refuses to start, saying why,
/// and the first serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_daemon_on_the_same_data_directory_refuses_to_start() {
    let data = temp_dir("one-daemon");
    let args = cleartext_args_on(&data);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut first = Daemon::start(&args, &[]);
    let second = Command::new(BIN)
        .args(&args)
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert!(!second.status.success(), "the second daemon started");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(stderr.contains("held by another agui-serve"), "{stderr}");
    first.run_to_end("hi").await;
    first.signal("TERM");
    first.wait(Duration::from_secs(15)).expect("exits");
}

#[test]
fn bad_configuration_exits_2_with_one_line() {
    for args in [
        vec!["--token", ""],
        vec!["--port", "notaport"],
        vec!["--disconnect-grace", "soon"],
        vec!["--tls-cert", "only-cert.pem"],
        vec!["--token-file", "/nonexistent/token"],
        vec!["--config", "/nonexistent/config.toml"],
        // Agent names that are route words under {path}.
        vec!["--acp", "agent=/bin/true"],
        vec!["--acp", "metrics=/bin/true"],
    ] {
        let output = Command::new(BIN)
            .args(&args)
            .env_remove("AGUI_TOKEN")
            .stdin(Stdio::null())
            .output()
            .expect("run");
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!stderr.trim().is_empty(), "{args:?}: reason on stderr");
    }
    let output = Command::new(BIN)
        .env("AGUI_TOKEN", "")
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(2), "empty AGUI_TOKEN");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

/// A token shorter than 16 bytes is refused at start, from every source, with the reason;
/// 16 bytes start.
#[test]
fn a_short_token_is_refused_at_start() {
    let dir = temp_dir("short-token");
    let file = dir.join("t");
    std::fs::write(&file, "T\n").expect("write");
    let file = file.to_str().expect("utf8");
    for (args, env) in [
        (vec!["--token", "T"], None),
        (vec!["--token", "fifteen-bytes-x"], None),
        (vec!["--token-file", file], None),
        (vec![], Some("short")),
    ] {
        let mut command = Command::new(BIN);
        command.args(["check-config"]).args(&args);
        match env {
            Some(value) => command.env("AGUI_TOKEN", value),
            None => command.env_remove("AGUI_TOKEN"),
        };
        let output = command.stdin(Stdio::null()).output().expect("run");
        assert_eq!(output.status.code(), Some(2), "{args:?} {env:?}");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("at least 16"), "{args:?}: {stderr}");
    }
    let output = Command::new(BIN)
        .args(["check-config", "--token", "sixteen-bytes-xy"])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert!(output.status.success(), "{output:?}");
}

#[test]
fn check_config_prints_the_resolved_configuration_redacted() {
    let dir = temp_dir("check");
    let config = dir.join("c.toml");
    std::fs::write(
        &config,
        "[server]\nport = 9999\nkeep_alive = \"20s\"\n[[agents]]\nname = \"demo2\"\nkind = \"demo\"\n",
    )
    .expect("write");
    let output = Command::new(BIN)
        .args(["check-config", "--config", config.to_str().expect("utf8")])
        .args(["--token", "very-secret-value"])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert!(output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!stdout.contains("very-secret-value"));
    let value: serde_json::Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(value["server"]["port"], 9999);
    assert_eq!(value["server"]["keep_alive"], "20s");
    assert_eq!(value["server"]["token"], "<redacted>");
    assert_eq!(value["agents"][0]["name"], "demo2");

    // No token configured: one will be generated, and check-config says so.
    let output = Command::new(BIN)
        .args(["check-config", "--config", config.to_str().expect("utf8")])
        .env_remove("AGUI_TOKEN")
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert!(output.status.success());
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    let token = value["server"]["token"].as_str().expect("token entry");
    assert!(token.contains("generated"), "{token}");

    // An ACP agent whose command cannot be found gets a warning.
    let output = Command::new(BIN)
        .args([
            "check-config",
            "--token",
            "sixteen-bytes-xy",
            "--acp",
            "x=/no/such/bin --flag",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert!(output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("warning") && stderr.contains("/no/such/bin"),
        "{stderr}"
    );
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(
        value["warnings"].as_array().map(Vec::len),
        Some(1),
        "{value}"
    );

    // The confinement in force is shown per agent; "none" is warned about.
    // (the default: bwrap where it works here, else Landlock).
    let default = if agui_serve::confine::bwrap_works() {
        "bwrap"
    } else {
        "landlock"
    };
    assert_eq!(value["agents"][0]["confinement"], default, "{value}");
    std::fs::write(
        &config,
        "[[agents]]\nname = \"open\"\nkind = \"acp\"\ncommand = [\"/bin/cat\"]\nconfinement = \"none\"\n",
    )
    .expect("write");
    let output = Command::new(BIN)
        .args([
            "check-config",
            "--token",
            "sixteen-bytes-xy",
            "--config",
            config.to_str().expect("utf8"),
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert!(output.status.success());
    let value: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    assert_eq!(value["agents"][0]["confinement"], "none");
    let warnings = value["warnings"].to_string();
    assert!(
        warnings.contains("confinement = \\\"none\\\""),
        "{warnings}"
    );

    std::fs::write(&config, "[server]\nbogus = 1\n").expect("write");
    let output = Command::new(BIN)
        .args(["check-config", "--config", config.to_str().expect("utf8")])
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_run_then_restart_keeps_the_thread_and_reports_the_cut_run() {
    let data = temp_dir("kill9");
    let args = cleartext_args_on(&data);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut daemon = Daemon::start(&args, &[]);
    // A completed exchange, then a long run that gets cut.
    let first = daemon
        .post("/demo")
        .json(&run_body("k", "r1", "hello"))
        .sent()
        .await;
    SseReader::new(first).collect().await;
    let mut body = run_body("k", "r2", "/slow 1000 20");
    body["messages"] = serde_json::json!([
        {"id": "r1-u", "role": "user", "content": "hello"},
        {"id": "r2-u", "role": "user", "content": "/slow 1000 20"}
    ]);
    let second = daemon.post("/demo").json(&body).sent().await;
    let mut reader = SseReader::new(second);
    for _ in 0..10 {
        reader.next().await.expect("frame");
    }
    daemon.signal("KILL");
    daemon.wait(Duration::from_secs(5)).expect("killed");
    drop(reader);

    {
        let conn = rusqlite::Connection::open(data.join("agui-serve.db")).expect("open db");
        let check: String = conn
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .expect("integrity_check");
        assert_eq!(check, "ok");
    }

    let mut daemon = Daemon::start(&args, &[]);
    let thread: serde_json::Value = daemon.get_json("/threads/k").await;
    assert_eq!(thread["lastRun"]["runId"], "r2");
    assert_eq!(thread["lastRun"]["outcome"], "interrupted");
    assert_eq!(thread["status"], "idle");
    let messages: serde_json::Value = daemon.get_json("/threads/k/messages").await;
    let contents: Vec<&str> = messages["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .map(|m| m["content"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(contents, ["hello", "You said: hello", "/slow 1000 20"]);
    let listing: serde_json::Value = daemon.get_json("/threads").await;
    assert_eq!(listing["threads"][0]["threadId"], "k");

    // The next POST on the thread works and starts with the thread's history.
    body["runId"] = serde_json::json!("r3");
    body["messages"]
        .as_array_mut()
        .expect("messages")
        .push(serde_json::json!({"id": "r3-u", "role": "user", "content": "again"}));
    let r = daemon.post("/demo").json(&body).sent().await;
    assert_eq!(r.status(), 200);
    let frames = SseReader::new(r).collect().await;
    assert_eq!(frames[1].kind(), "MESSAGES_SNAPSHOT");
    let snapshot = frames[1].data["messages"].as_array().expect("messages");
    assert_eq!(snapshot.len(), 4, "history plus the new message");
    assert_eq!(frames.last().expect("frame").kind(), "RUN_FINISHED");
    daemon.signal("TERM");
    assert!(
        daemon
            .wait(Duration::from_secs(10))
            .expect("exits")
            .success()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_capped_to_fit_the_open_file_limit() {
    let data = temp_dir("nofile");
    let data_arg = data.to_str().expect("utf8").to_owned();
    // A hard limit of 300 descriptors: the default 4096 connections cannot fit.
    let wrapper = format!("ulimit -n 300 && exec {BIN} \"$@\"");
    let mut args = vec!["-c", &wrapper, "agui-serve"];
    let daemon_args = quiet_port_args(&["--token", TOKEN, "--data-dir", &data_arg]);
    args.extend(daemon_args.iter().map(String::as_str));
    let mut daemon = Daemon::start_program("sh", &args, &[]);
    // stderr is read by a thread: give the warning a moment to arrive.
    let lowered =
        |logs: &str| logs.contains("max_connections lowered") && logs.contains("fitted=44");
    for _ in 0..100 {
        if lowered(&daemon.logs()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(lowered(&daemon.logs()), "{}", daemon.logs());
    // 44 connections that send nothing hold every slot...
    let url = daemon.url("");
    let addr = url
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .expect("host:port")
        .to_owned();
    let mut idle = Vec::new();
    for _ in 0..44 {
        idle.push(
            tokio::net::TcpStream::connect(&addr)
                .await
                .expect("connect"),
        );
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // ...so the next one is refused with our JSON 503, not left to exhaust descriptors.
    let r = daemon
        .post("/demo")
        .json(&run_body("t", "r", "hi"))
        .send()
        .await;
    let r = r.expect("answered");
    assert_eq!(r.status(), 503);
    let body: serde_json::Value = r.json().await.expect("json");
    assert_eq!(body["code"], "OVER_CAPACITY", "{body}");
    drop(idle);
    daemon.signal("TERM");
    daemon.wait(Duration::from_secs(15)).expect("exits");
}

/// The resident size of process `pid`, in bytes.
fn resident(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|kb| kb.trim().parse::<usize>().ok())
        .expect("VmRSS")
        * 1024
}

/// 400 fleet streams from read-only principals that see none of 250 live runs hold no
/// copy of the fleet document each: the daemon stays within its memory budget.
/// (`AGUI_SERVE_UNDER_TEST` runs the same measure against another build.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_hundred_fleet_streams_stay_within_the_memory_budget() {
    const MIB: usize = 1024 * 1024;
    let data = temp_dir("fleet-rss");
    let program = std::env::var("AGUI_SERVE_UNDER_TEST").unwrap_or_else(|_| BIN.to_owned());
    let args = quiet_port_args(&[
        "--no-tls",
        "--token",
        TOKEN,
        "--memory-budget",
        "64MiB",
        "--max-concurrent-runs",
        "400",
        "--disconnect-grace",
        "10m",
        "--data-dir",
    ]);
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args.push(data.to_str().expect("utf8"));
    let mut daemon = Daemon::start_program(&program, &args, &[]);
    let pid = daemon.child.id();
    let long = |prefix: &str, i: usize| format!("{prefix}-{i}-{}", "x".repeat(230));
    let start = |i: usize| {
        let request = daemon.post("/demo").json(&run_body(
            &long("fleet-thread", i),
            &long("fleet-run", i),
            "/slow 600 100",
        ));
        async move {
            let r = request.sent().await;
            assert_eq!(r.status(), 200);
            // The run goes on detached once its stream is let go.
        }
    };
    for i in 0..250 {
        start(i).await;
    }
    let mut tokens = Vec::new();
    for p in 0..8 {
        let minted = daemon
            .post("/tokens")
            .json(
                &serde_json::json!({"sub": format!("reader-{p}"), "ttlSeconds": 600,
                "capabilities": ["read"]}),
            )
            .sent()
            .await
            .json::<serde_json::Value>()
            .await
            .expect("json");
        tokens.push(minted["token"].as_str().expect("token").to_owned());
    }
    let before = resident(pid);
    let mut streams = Vec::new();
    for i in 0..400 {
        let mut r = client()
            .get(daemon.url("/fleet/stream"))
            .bearer_auth(&tokens[i % tokens.len()])
            .header("accept", "text/event-stream")
            .sent()
            .await;
        assert_eq!(r.status(), 200, "stream {i}");
        let first = r.chunk().await.expect("read").expect("the snapshot");
        assert!(!String::from_utf8_lossy(&first).contains("fleet-thread"));
        streams.push(r);
    }
    // Changes the readers do not see: more runs start, and the document with them.
    for i in 250..270 {
        start(i).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = resident(pid);
    eprintln!(
        "resident: {} MiB before the streams, {} MiB with them",
        before / MIB,
        after / MIB
    );
    assert!(
        after <= 64 * MIB,
        "{} MiB with 400 fleet streams",
        after / MIB
    );
    drop(streams);
    daemon.signal("KILL");
    daemon.wait(Duration::from_secs(15)).expect("exits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_key_never_appears_in_logs_the_fleet_info_or_check_config() {
    const KEY: &str = "sk-relay-secret-9f8e7d6c5b4a";
    let model = support::scripted_model::ScriptedModel::start().await;
    let key = support::probe::key_file("binary-relay", KEY);
    let dir = temp_dir("relay-config");
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            r#"[[agents]]
name = "probe"
kind = "acp"
command = [{agent:?}]
permissions = "allow"

[[agents.relay]]
upstream = {upstream:?}
header = "authorization"
secret_file = {key:?}
base_url_env = "ANTHROPIC_BASE_URL"
placeholder_env = "ANTHROPIC_API_KEY"

[agents.egress]
allow = ["registry.npmjs.org"]
"#,
            agent = scripted_agent().display().to_string(),
            upstream = model.url,
            key = key.display().to_string(),
        ),
    )
    .expect("config");
    let config = config.to_str().expect("utf8");
    let checked = Command::new(BIN)
        .args(["check-config", "--config", config, "--token", TOKEN])
        .stdin(Stdio::null())
        .output()
        .expect("check-config");
    let shown = String::from_utf8_lossy(&checked.stdout).into_owned()
        + &String::from_utf8_lossy(&checked.stderr);
    assert!(checked.status.success(), "{shown}");
    assert!(
        shown.contains("ANTHROPIC_BASE_URL") && shown.contains("registry.npmjs.org"),
        "{shown}"
    );
    assert!(!shown.contains(KEY), "check-config shows the key: {shown}");

    let data = temp_dir("relay-data");
    let args = quiet_port_args(&[
        "--token",
        TOKEN,
        "--no-tls",
        "--config",
        config,
        "--data-dir",
    ]);
    let mut args: Vec<&str> = args.iter().map(String::as_str).collect();
    args.push(data.to_str().expect("utf8"));
    let mut daemon = Daemon::start(&args, &[("RUST_LOG", "trace")]);
    let mut fleet = client()
        .get(daemon.url("/fleet/stream"))
        .bearer_auth(TOKEN)
        .header("accept", "text/event-stream")
        .sent()
        .await;
    assert_eq!(fleet.status(), 200);
    let plan = serde_json::json!({"run": [
        ["ask", support::probe::ask_model(true)],
        ["proxy", "import urllib.request\ntry:\n    urllib.request.urlopen('https://example.com/', timeout=5)\n    print('ok')\nexcept Exception as e:\n    print('refused: %s' % e)"],
    ]});
    let r = daemon
        .post("/probe")
        .json(&run_body("t", "r", &format!("probe {plan}")))
        .sent()
        .await;
    assert_eq!(r.status(), 200);
    let frames = SseReader::new(r).collect().await;
    let reply = text_of(&frames);
    assert!(reply.contains("\"run:ask\":\"200 True\""), "{reply}");
    assert!(
        reply.contains("refused: ") && reply.contains("403"),
        "{reply}"
    );
    assert_eq!(
        model.requests().last().and_then(|r| r.credential.clone()),
        Some(format!("Bearer {KEY}"))
    );
    let info = client()
        .get(daemon.url("/info"))
        .bearer_auth(TOKEN)
        .sent()
        .await;
    let info = info.text().await.expect("info");
    assert!(
        info.contains("\"reach\"") && info.contains("registry.npmjs.org"),
        "{info}"
    );
    let agents = daemon.get_json("/agents").await;
    // The fleet carries the refusal (rebuilt within a second).
    let mut seen = String::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !seen.contains("example.com") && Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(2), fleet.chunk()).await {
            Ok(Ok(Some(chunk))) => seen.push_str(&String::from_utf8_lossy(&chunk)),
            Ok(_) => break,
            Err(_) => {}
        }
    }
    assert!(
        seen.contains("example.com"),
        "the fleet shows the refusal: {seen}"
    );
    daemon.signal("TERM");
    daemon.wait(Duration::from_secs(15)).expect("exits");
    let logs = daemon.logs();
    assert!(
        logs.contains("TRACE") || logs.contains("trace"),
        "trace logging was on"
    );
    assert!(logs.contains("egress denied"), "the refusal is logged");
    for (what, text) in [
        ("logs", &logs),
        ("the fleet", &seen),
        ("/info", &info),
        ("/agents", &agents.to_string()),
        ("the stream", &reply),
    ] {
        assert!(!text.contains(KEY), "the key is in {what}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfined_agent_gets_its_own_env_and_never_the_daemons_token() {
    const SECRET: &str = "daemon-token-never-for-agents-7d1f";
    let dir = temp_dir("unconfined-config");
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            r#"[[agents]]
name = "probe"
kind = "acp"
command = [{agent:?}]
permissions = "allow"
confinement = "none"
env = {{ PROBE_OWN = "from-the-config" }}
"#,
            agent = scripted_agent().display().to_string(),
        ),
    )
    .expect("config");
    let data = temp_dir("unconfined-data");
    let args = quiet_port_args(&[
        "--no-tls",
        "--config",
        config.to_str().expect("utf8"),
        "--data-dir",
        data.to_str().expect("utf8"),
    ]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut daemon = Daemon::start(&args, &[("AGUI_TOKEN", SECRET)]);
    let plan = serde_json::json!({"run": [["env", "import os; print(repr(dict(os.environ)))"]]});
    let r = client()
        .post(daemon.url("/probe"))
        .bearer_auth(SECRET)
        .json(&run_body("t", "r", &format!("probe {plan}")))
        .sent()
        .await;
    assert_eq!(r.status(), 200);
    let reply = text_of(&SseReader::new(r).collect().await);
    assert!(
        reply.contains("PROBE_OWN") && reply.contains("from-the-config"),
        "{reply}"
    );
    assert!(
        !reply.contains(SECRET),
        "the daemon's token reached the agent: {reply}"
    );
    assert!(!reply.contains("AGUI_"), "{reply}");
    daemon.signal("TERM");
    daemon.wait(Duration::from_secs(15)).expect("exits");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_refuses_the_certificate_is_explained_in_the_log() {
    let data = temp_dir("tls-refused");
    let args = quiet_port_args(&["--token", TOKEN, "--data-dir", data.to_str().expect("utf8")]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut daemon = Daemon::start(&args, &[("RUST_LOG", "info")]);
    assert!(daemon.base.starts_with("https://"));
    // A client that trusts only the system's roots, as a browser does a self-signed
    // certificate it was never shown: the handshake fails on its side.
    let strict = reqwest::Client::builder().build().expect("client");
    let error = strict
        .get(daemon.url("/healthz"))
        .send()
        .await
        .expect_err("the certificate is not trusted");
    assert!(error.is_connect() || error.is_request(), "{error}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    daemon.signal("TERM");
    daemon.wait(Duration::from_secs(15)).expect("exits");
    let logs = daemon.logs();
    assert!(
        logs.contains("refused this daemon's TLS certificate") && logs.contains("--tls-cert"),
        "{logs}"
    );
}

//! The ways out of a confined agent's network, tried by the probe agent as a prompt-injected
//! agent would: the egress proxy lets out only the names its rules allow (a local server
//! stands in for them through `egress.resolve`), refuses the rest with a 403 naming the
//! rule, and never reaches a loopback, private or link-local address a name resolves to;
//! nothing reaches anything past the proxy (a direct connect, raw, UDP, IPv6, MPTCP). A
//! model relay adds the operator's key outside the sandbox, which holds only a placeholder,
//! and what the model bills through it counts against the run as it streams.

mod support;

use std::io::{Read, Write};
use std::sync::Arc;

use agui_serve::config::{AgentKind, Hitl};
use agui_serve::confine::Confinement;
use agui_serve::egress::{Egress, EgressConfig, Relay, RelayConfig};
use serde_json::{Value, json};
use support::probe::*;
use support::scripted_model::ScriptedModel;
use support::*;

/// A plain HTTP server on the host's loopback standing in for the hosts the rules allow:
/// every request gets `hello from origin`. Its port.
fn origin() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("origin");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let mut conn = conn;
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                    head.push(byte[0]);
                }
                let _ = conn.write_all(
                    b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nhello from origin",
                );
            });
        }
    });
    port
}

/// Python the probe runs before each attempt: the proxy from the agent's environment, a
/// response read by its length, a `CONNECT` followed by a request through the tunnel, a
/// plain-HTTP request in absolute form, and an attempt reported as `ok` or its error.
const PRELUDE: &str = r#"
import os, socket
def proxy():
    host, port = os.environ['HTTPS_PROXY'].split('//')[1].rsplit(':', 1)
    return host, int(port)
def response(s):
    data = b''
    while b'\r\n\r\n' not in data:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b'\r\n\r\n')
    lines = head.decode(errors='replace').split('\r\n')
    status = lines[0].split(' ')[1] if ' ' in lines[0] else lines[0]
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(':')
        if name.strip().lower() == 'content-length':
            length = int(value.strip())
    while len(body) < length:
        chunk = s.recv(4096)
        if not chunk:
            break
        body += chunk
    return status, body.decode(errors='replace').strip()
def tunnel(target):
    s = socket.create_connection(proxy(), 5)
    s.sendall(('CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n' % (target, target)).encode())
    status, body = response(s)
    if status != '200':
        return status + ' ' + body
    s.sendall(b'GET / HTTP/1.0\r\nHost: x\r\n\r\n')
    data = b''
    while True:
        chunk = s.recv(4096)
        if not chunk:
            break
        data += chunk
    return '200 ' + data.decode(errors='replace').split('\r\n\r\n', 1)[-1]
def plain(url):
    host = url.split('/')[2]
    s = socket.create_connection(proxy(), 5)
    s.sendall(('GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n' % (url, host)).encode())
    status, body = response(s)
    return status + ' ' + body
def attempt(f):
    try:
        f()
        return 'ok'
    except OSError as e:
        return 'error: %s' % e
"#;

fn run(label: &str, code: &str) -> Value {
    json!([label, format!("{PRELUDE}\n{code}")])
}

/// A probe agent with egress `rules` and `relays`.
fn agent_with(
    name: &str,
    confinement: Confinement,
    data: &std::path::Path,
    rules: EgressConfig,
    relays: Vec<RelayConfig>,
) -> agui_serve::config::AgentConfig {
    let mut agent = probe_agent(name, confinement, data, None);
    if let AgentKind::Acp(acp) = &mut agent.kind {
        acp.egress = Arc::new(Egress::new(&rules).expect("rules"));
        acp.relays = relays
            .iter()
            .map(|r| Arc::new(Relay::new(r).expect("relay")))
            .collect();
    }
    agent
}

fn strings(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test]
async fn the_proxy_lets_out_only_what_the_rules_name() {
    egress_by_name("egress", Confinement::Landlock).await;
}

#[tokio::test]
#[ignore = "needs bwrap (Debian: bubblewrap): scripts/test.sh runs it"]
async fn under_bwrap_the_proxy_lets_out_only_what_the_rules_name() {
    egress_by_name("egress-bwrap", Confinement::Bwrap).await;
}

async fn egress_by_name(tag: &str, confinement: Confinement) {
    let port = origin();
    let here = format!("127.0.0.1:{port}");
    let rules = EgressConfig {
        allow: strings(&["allowed.test", "*.wild.test", "localhost"]),
        deny: strings(&["bad.wild.test"]),
        resolve: [
            ("allowed.test", here.as_str()),
            ("sub.wild.test", here.as_str()),
            ("bad.wild.test", here.as_str()),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect(),
    };
    let open = EgressConfig {
        allow: strings(&["*"]),
        ..EgressConfig::default()
    };
    let s = setup(tag, move |c, d| {
        c.agents = vec![
            agent_with("probe", confinement, d, rules, Vec::new()),
            agent_with("open", confinement, d, open, Vec::new()),
            // No rules: the proxy is there, and lets nothing out.
            agent_with(
                "closed",
                confinement,
                d,
                EgressConfig::default(),
                Vec::new(),
            ),
        ];
    })
    .await;
    let bob = token_for(&s.server, "bob").await;
    let daemon = s.server.addr.port();
    let plan = json!({"run": [
        run("tunnel-allowed", "print(tunnel('allowed.test:443'))"),
        run("tunnel-wild", "print(tunnel('sub.wild.test:443'))"),
        run("plain-allowed", "print(plain('http://allowed.test/x'))"),
        run("unlisted", "print(tunnel('example.com:443'))"),
        run("denied", "print(tunnel('bad.wild.test:443'))"),
        run("loopback-name", &format!("print(tunnel('localhost:{port}'))")),
        run("direct-origin", &format!("print(attempt(lambda: socket.create_connection(('127.0.0.1', {port}), 3)))")),
        run("direct-daemon", &format!("print(attempt(lambda: socket.create_connection(('127.0.0.1', {daemon}), 3)))")),
        run("direct-ip-443", "print(attempt(lambda: socket.create_connection(('1.1.1.1', 443), 3)))"),
        run("direct-ipv6", "print(attempt(lambda: socket.create_connection(('2606:4700::1111', 443), 3)))"),
        run("direct-ipv6-loopback", &format!("print(attempt(lambda: socket.create_connection(('::1', {port}), 3)))")),
        run("udp", "print(attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b'x', ('8.8.8.8', 53))))"),
        run("mptcp", &format!("print(attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 262).connect(('127.0.0.1', {port}))))")),
        run("raw", "print(attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)))"),
        run("env", "print(os.environ.get('HTTPS_PROXY', '') + ' ' + os.environ.get('NO_PROXY', ''))"),
        // Another spelling of a denied host, and numeric forms the resolver reads as
        // addresses: refused.
        run("denied-dot", "print(tunnel('bad.wild.test.:443'))"),
        run("numeric", "print(tunnel('2130706433:443'))"),
        run("hex", "print(tunnel('0x7f000001:443'))"),
    ]});
    let out = probe(&s.server, &bob, "probe", "t", plan).await;
    let at = |label: &str| {
        out[format!("run:{label}")]
            .as_str()
            .unwrap_or("")
            .to_owned()
    };
    assert_eq!(at("tunnel-allowed"), "200 hello from origin", "{out}");
    assert_eq!(at("tunnel-wild"), "200 hello from origin", "{out}");
    assert_eq!(at("plain-allowed"), "200 hello from origin", "{out}");
    assert!(
        at("unlisted").starts_with("403 ") && at("unlisted").contains("not in egress.allow"),
        "{out}"
    );
    assert!(
        at("denied").starts_with("403 ") && at("denied").contains("egress.deny \"bad.wild.test\""),
        "{out}"
    );
    assert!(
        at("loopback-name").starts_with("403 ")
            && at("loopback-name").contains("not a public address"),
        "{out}"
    );
    for direct in [
        "direct-origin",
        "direct-daemon",
        "direct-ip-443",
        "direct-ipv6",
        "direct-ipv6-loopback",
        "udp",
        "mptcp",
        "raw",
    ] {
        assert!(at(direct).starts_with("error: "), "{direct}: {out}");
    }
    assert!(
        at("env").starts_with("http://127.0.0.1:") && at("env").contains("127.0.0.1,localhost"),
        "{out}"
    );
    assert!(
        at("denied-dot").starts_with("403 ") && at("denied-dot").contains("egress.deny"),
        "{out}"
    );
    for numeric in ["numeric", "hex"] {
        assert!(at(numeric).starts_with("403 "), "{numeric}: {out}");
    }
    // Anything allowed by name, but no address that is not public, however it is named.
    let plan = json!({"run": [
        run("loopback", &format!("print(tunnel('127.0.0.1:{port}'))")),
        run("metadata", "print(tunnel('169.254.169.254:80'))"),
        run("metadata-plain", "print(plain('http://169.254.169.254/latest/meta-data/'))"),
        run("private", "print(tunnel('10.0.0.1:443'))"),
        run("ipv6-loopback", &format!("print(tunnel('[::1]:{port}'))")),
        run("mapped", &format!("print(tunnel('[::ffff:127.0.0.1]:{port}'))")),
        run("localhost", &format!("print(tunnel('localhost:{port}'))")),
    ]});
    let out = probe(&s.server, &bob, "open", "u", plan).await;
    for label in [
        "loopback",
        "metadata",
        "metadata-plain",
        "private",
        "ipv6-loopback",
        "mapped",
        "localhost",
    ] {
        let outcome = out[format!("run:{label}")].as_str().unwrap_or("");
        assert!(
            outcome.starts_with("403 ") && outcome.contains("not a public address"),
            "{label}: {out}"
        );
    }

    // The same names with no rules: refused, so what passed above is the rules' doing.
    let plan = json!({"run": [
        run("tunnel-allowed", "print(tunnel('allowed.test:443'))"),
        run("plain-allowed", "print(plain('http://allowed.test/x'))"),
    ]});
    let out = probe(&s.server, &bob, "closed", "v", plan).await;
    for label in ["tunnel-allowed", "plain-allowed"] {
        let outcome = out[format!("run:{label}")].as_str().unwrap_or("");
        assert!(
            outcome.starts_with("403 ") && outcome.contains("not in egress.allow"),
            "{label}: {out}"
        );
    }

    // Each decision is counted: the agent's status names its last refusal, the metrics
    // count both kinds.
    let agents: Value = s
        .server
        .get("/agents")
        .sent()
        .await
        .json()
        .await
        .expect("agents");
    let shown = agents["agents"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["name"] == "probe"))
        .cloned()
        .unwrap_or(Value::Null);
    let egress = &shown["egress"];
    assert_eq!(egress["allowed"], 3, "{shown}");
    assert_eq!(egress["denied"], 6, "{shown}");
    assert!(egress["lastDenied"]["rule"].is_string(), "{shown}");
    let scrape = s
        .server
        .get("/metrics")
        .sent()
        .await
        .text()
        .await
        .expect("scrape");
    assert!(
        scrape.contains("agui_egress_decisions_total{agent=\"probe\",decision=\"denied\"} 6"),
        "{scrape}"
    );
    assert!(
        scrape.contains("agui_egress_decisions_total{agent=\"probe\",decision=\"allowed\"} 3"),
        "{scrape}"
    );
}

/// Python that tries paths out of the relay's upstream prefix: each refused with a 400.
const CLIMB: &str = r#"
import os, urllib.request, urllib.error
codes = []
for path in ['/v1/../admin', '/v1/%2e%2e/admin', '/v1/%2E%2e%2fadmin']:
    try:
        urllib.request.urlopen(os.environ['ANTHROPIC_BASE_URL'] + path, timeout=10)
        codes.append('200')
    except urllib.error.HTTPError as e:
        codes.append(str(e.code))
print(' '.join(codes))
"#;

#[tokio::test]
async fn a_relay_adds_the_key_outside_the_sandbox_and_counts_what_the_model_bills() {
    let model = ScriptedModel::start().await;
    const KEY: &str = "sk-operator-key-0123456789";
    let relay = RelayConfig {
        upstream: model.url.clone(),
        header: "x-api-key".to_owned(),
        secret_file: key_file("relay", KEY),
        base_url_env: "ANTHROPIC_BASE_URL".to_owned(),
        placeholder_env: Some("ANTHROPIC_API_KEY".to_owned()),
    };
    let budgeted = relay.clone();
    let s = setup("relay", move |c, d| {
        let mut tight = agent_with(
            "tight",
            Confinement::Landlock,
            d,
            EgressConfig::default(),
            vec![budgeted],
        );
        tight.hitl = Hitl::Interrupt;
        tight.budget = Some(agui_serve::budget::Limits {
            tokens: Some(50),
            ..Default::default()
        });
        c.agents = vec![
            agent_with(
                "probe",
                Confinement::Landlock,
                d,
                EgressConfig::default(),
                vec![relay],
            ),
            tight,
        ];
    })
    .await;
    let bob = token_for(&s.server, "bob").await;
    let plan = json!({"run": [
        ["ask", ask_model(true)],
        ["env", "import os; print(repr(dict(os.environ)))"],
        ["climb", CLIMB],
        ["whole", ask_model(false)],
    ]});
    let frames = turn(&s.server, &bob, "probe", "t", &format!("probe {plan}")).await;
    let last = frames.last().expect("a frame");
    assert_eq!(last.kind(), "RUN_FINISHED", "{:?}", kinds(&frames));
    let reply = text_of(&frames);
    let out: Value =
        serde_json::from_str(reply.strip_prefix("Probe: ").expect("report")).expect("json");
    assert_eq!(out["run:ask"], "200 True", "{out}");
    assert_eq!(out["run:climb"], "400 400 400", "{out}");
    assert_eq!(out["run:whole"], "200 20", "{out}");
    let env = out["run:env"].as_str().expect("env");
    assert!(
        !env.contains(KEY),
        "the key is in the agent's environment: {env}"
    );
    assert!(env.contains(agui_serve::egress::PLACEHOLDER), "{env}");
    // The model got the operator's key, never the placeholder.
    let asked = model.requests();
    assert_eq!(asked.len(), 2, "{asked:?}");
    for request in &asked {
        assert_eq!(request.credential.as_deref(), Some(KEY));
    }
    // What the model billed (100 in, 20 out, twice: streamed and whole) is the turn's usage.
    let usage = &last.data["usage"][0];
    assert_eq!(usage["inputTokens"], 200, "{}", last.data);
    assert_eq!(usage["totalTokens"], 240, "{}", last.data);

    // A budget of 50 tokens: the run pauses inside the turn that spent them.
    let frames = turn(&s.server, &bob, "tight", "u", &format!("probe {plan}")).await;
    let last = frames.last().expect("a frame");
    assert_eq!(last.kind(), "RUN_FINISHED", "{:?}", kinds(&frames));
    assert_eq!(last.data["outcome"]["type"], "interrupt", "{}", last.data);
    assert_eq!(
        last.data["outcome"]["interrupts"][0]["reason"],
        "budget_reached"
    );
}

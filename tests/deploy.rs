//! Deployment: the systemd unit verifies, and the daemon speaks sd_notify (READY=1 when it
//! listens, STOPPING=1 when a shutdown begins).

mod support;

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::*;

const BIN: &str = env!("CARGO_BIN_EXE_agui-serve");

#[test]
#[ignore = "needs systemd-analyze (Debian: systemd): scripts/test.sh runs it"]
fn the_systemd_unit_verifies() {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/agui-serve.service"
    ))
    .expect("deploy/agui-serve.service");
    assert!(unit.contains("Type=notify"));
    assert!(unit.contains("LoadCredential=token:"));
    assert!(unit.contains("${CREDENTIALS_DIRECTORY}/token"));
    // Point ExecStart at the binary just built, so verify can check it exists.
    verifies(&unit.replace("/usr/local/bin/agui-serve", BIN));
}

/// `systemd-analyze verify` passes on `unit`, with nothing to say.
fn verifies(unit: &str) {
    let dir = temp_dir("unit");
    let path = dir.join("agui-serve.service");
    std::fs::write(&path, unit).expect("write unit");
    let output = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .expect("systemd-analyze (Debian package systemd) is needed for this test");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "systemd-analyze verify failed: {stderr}"
    );
    assert!(
        stderr.trim().is_empty(),
        "systemd-analyze verify warned: {stderr}"
    );
}

/// The Debian package's unit: the same hardening as deploy/agui-serve.service, line for
/// line, and it verifies.
#[test]
#[ignore = "needs systemd-analyze (Debian: systemd): scripts/test.sh runs it"]
fn the_packaged_unit_verifies_and_is_hardened_as_the_plain_one() {
    let read = |path: &str| {
        std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR"))).expect(path)
    };
    let plain = read("deploy/agui-serve.service");
    let packaged = read("deploy/debian/agui-serve.service");
    let hardening = |unit: &str| -> String {
        let at = unit.find("# Hardening").expect("a hardening section");
        unit[at..].to_owned()
    };
    assert_eq!(hardening(&packaged), hardening(&plain));
    assert!(packaged.contains("User=agui-serve") && !packaged.contains("DynamicUser"));
    assert!(packaged.contains("--config /etc/agui-serve/config.toml"));
    verifies(&packaged.replace("/usr/bin/agui-serve", BIN));
}

/// The packaged configuration passes `check-config` with no warning.
#[test]
fn the_packaged_configuration_checks_clean() {
    let config = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/debian/config.toml");
    let output = Command::new(BIN)
        .args(["check-config", "--config", config])
        .output()
        .expect("agui-serve runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).expect("a JSON report");
    assert_eq!(report["warnings"], serde_json::json!([]), "{stdout}");
}

#[test]
fn notify_socket_gets_ready_then_stopping() {
    let dir = temp_dir("notify");
    let socket_path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).expect("bind notify socket");
    socket
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    let mut child = Command::new(BIN)
        .args(["--no-tls", "--port", "0", "--token", TOKEN, "--data-dir"])
        .arg(dir.join("data"))
        .env("NOTIFY_SOCKET", &socket_path)
        .env_remove("AGUI_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut buf = [0u8; 1024];
    let n = socket.recv(&mut buf).expect("READY=1 within 20 s");
    let ready = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    assert!(
        ready.contains("STATUS=listening on http://127.0.0.1:"),
        "{ready:?}"
    );
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let n = socket.recv(&mut buf).expect("STOPPING=1 after SIGTERM");
    let stopping = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    let exit = child.wait().expect("wait");
    assert!(exit.success(), "{exit:?}");
}

/// `deploy/prometheus.yml` is a valid Prometheus configuration (its token and CA files
/// pointed at files that exist, as promtool requires).
#[test]
#[ignore = "needs promtool (Debian: prometheus): scripts/test.sh runs it"]
fn the_prometheus_example_checks() {
    let config = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/prometheus.yml"
    ))
    .expect("deploy/prometheus.yml");
    assert!(
        config.contains("127.0.0.1:9464"),
        "the metrics listener job"
    );
    assert!(config.contains("credentials_file:"), "the bearer token job");
    let dir = temp_dir("prometheus");
    std::fs::write(dir.join("token"), "token\n").expect("token");
    std::fs::write(dir.join("cert.pem"), "").expect("cert");
    let config = config
        .replace(
            "/etc/prometheus/agui-serve.token",
            dir.join("token").to_str().expect("utf8"),
        )
        .replace(
            "/var/lib/agui-serve/tls/cert.pem",
            dir.join("cert.pem").to_str().expect("utf8"),
        );
    let path = dir.join("prometheus.yml");
    std::fs::write(&path, config).expect("write config");
    let output = Command::new("promtool")
        .args(["check", "config"])
        .arg(&path)
        .output()
        .expect("promtool (Debian package prometheus) is needed for this test");
    assert!(
        output.status.success(),
        "promtool check config failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Every TOML example of the README and docs/ is a whole configuration that `check-config`
/// takes without a warning, the files it names made first (each absolute path under
/// `/etc`, `/srv`, `/opt` or `/var/lib` is moved into a scratch directory and made there:
/// a JSON schema, a git repository for a `git:` source, a directory, else a secret file).
#[test]
fn every_configuration_example_in_the_docs_checks_clean() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut sources = vec![root.join("README.md")];
    let mut docs: Vec<_> = std::fs::read_dir(root.join("docs"))
        .expect("docs")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    sources.extend(docs);
    let mut checked = 0;
    let mut failures = Vec::new();
    for source in &sources {
        let text = std::fs::read_to_string(source).expect("doc");
        for (n, block) in text.split("```toml\n").skip(1).enumerate() {
            let example = block.split("```").next().expect("a block");
            let scratch = temp_dir("doc-example");
            let config = scratch.join("config.toml");
            std::fs::write(&config, moved(example, &scratch)).expect("write");
            let output = Command::new(BIN)
                .args(["check-config", "--config"])
                .arg(&config)
                .env_remove("AGUI_TOKEN")
                .env_remove("AGUI_CONFIG")
                .env("STATE_DIRECTORY", scratch.join("state"))
                .output()
                .expect("agui-serve runs");
            let stderr = String::from_utf8_lossy(&output.stderr);
            if !output.status.success() || !stderr.trim().is_empty() {
                failures.push(format!("{} example {}: {stderr}", source.display(), n + 1));
            }
            checked += 1;
        }
    }
    assert!(checked >= 8, "only {checked} examples found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// `example` with each absolute path under a system folder moved into `scratch`, and what
/// it names made there.
fn moved(example: &str, scratch: &std::path::Path) -> String {
    let mut out = String::with_capacity(example.len());
    let mut rest = example;
    while let Some(at) = ["/etc/", "/srv/", "/opt/", "/var/lib/"]
        .iter()
        .filter_map(|prefix| rest.find(prefix))
        .min()
    {
        let (before, from) = rest.split_at(at);
        let len = from
            .find(|c: char| !(c.is_ascii_alphanumeric() || "/._-".contains(c)))
            .unwrap_or(from.len());
        let path = &from[..len];
        let place = scratch.join(path.trim_start_matches('/'));
        if !place.exists() {
            let name = place.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.ends_with(".json") {
                std::fs::create_dir_all(place.parent().expect("parent")).expect("dir");
                std::fs::write(&place, r#"{"type":"object"}"#).expect("schema");
            } else if before.ends_with("git:") {
                std::fs::create_dir_all(&place).expect("repo");
                let git = |args: &[&str]| {
                    let done = Command::new("git")
                        .args(args)
                        .current_dir(&place)
                        .output()
                        .expect("git");
                    assert!(done.status.success(), "git {args:?}");
                };
                git(&["init", "-q", "-b", "main"]);
                git(&[
                    "-c",
                    "user.name=t",
                    "-c",
                    "user.email=t@t",
                    "commit",
                    "-q",
                    "--allow-empty",
                    "-m",
                    "base",
                ]);
            } else if name.contains('.') || name == "token" {
                std::fs::create_dir_all(place.parent().expect("parent")).expect("dir");
                std::fs::write(&place, "secret-0123456789abcdef-0123456789abcdef\n")
                    .expect("secret");
            } else {
                std::fs::create_dir_all(&place).expect("dir");
            }
        }
        out.push_str(before);
        out.push_str(&place.to_string_lossy());
        rest = &from[len..];
    }
    out.push_str(rest);
    out
}

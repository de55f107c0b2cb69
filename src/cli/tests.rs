use std::path::Path;

use clap::Parser;

use super::*;
use crate::config::{AgentKind, Auth, Hitl, TlsMode, TokenSource};

fn no_env(_: &str) -> Option<String> {
    None
}

fn parse(args: &[&str]) -> Cli {
    Cli::try_parse_from(std::iter::once("agui-serve").chain(args.iter().copied())).expect("parses")
}

#[test]
fn defaults_match_the_contract() {
    let resolved = parse(&[]).args.resolve(&no_env).expect("valid");
    let config = resolved.config;
    assert_eq!(config.socket_addr().to_string(), "127.0.0.1:8443");
    assert_eq!(config.path, "/agui");
    assert_eq!(config.tls, TlsMode::SelfSigned);
    assert_eq!(config.max_concurrent_runs, 64);
    assert_eq!(resolved.token_source, TokenSource::Generated);
    assert_eq!(config.agents.len(), 1);
    assert_eq!(config.agents[0].name, "demo");
}

#[test]
fn help_shows_the_defaults_that_apply() {
    use clap::CommandFactory;
    let help = Cli::command().render_help().to_string();
    // A flag's entry: its line, and the help under it when clap puts it there.
    let line = |flag: &str| {
        let lines: Vec<&str> = help.lines().collect();
        let start = lines
            .iter()
            .position(|l| l.split_whitespace().next() == Some(flag))
            .unwrap_or_else(|| panic!("{flag} in {help}"));
        let end = lines[start + 1..]
            .iter()
            .position(|l| l.trim_start().starts_with('-') || l.trim().is_empty())
            .map_or(lines.len(), |n| start + 1 + n);
        lines[start..end].join(" ")
    };
    let config = parse(&[]).args.resolve(&no_env).expect("valid").config;
    let duration = crate::config::format_duration;
    for (flag, default) in [
        ("--host", config.host.to_string()),
        ("--port", config.port.to_string()),
        ("--path", config.path.clone()),
        (
            "--max-concurrent-runs",
            config.max_concurrent_runs.to_string(),
        ),
        ("--disconnect-grace", duration(config.disconnect_grace)),
        ("--shutdown-grace", duration(config.shutdown_grace)),
        ("--keep-alive", duration(config.keep_alive)),
        ("--suspend-timeout", duration(config.suspend_timeout)),
        ("--log-format", "text".to_owned()),
    ] {
        let line = line(flag);
        assert!(line.contains(&format!("[default: {default}]")), "{line}");
    }
    for flag in [
        "--config",
        "--token",
        "--data-dir",
        "--no-tls",
        "--acp",
        "--allowed-origin",
    ] {
        let line = line(flag);
        assert!(line.contains("[default:"), "{line}");
    }
}

#[test]
fn token_precedence() {
    let dir = std::env::temp_dir().join(format!("agui-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("t");
    std::fs::write(&file, "from-file-0123456789\n").expect("write");
    let env = |k: &str| (k == "AGUI_TOKEN").then(|| "from-env-0123456789".to_owned());
    let file_arg = file.to_str().expect("utf8");

    let r = parse(&["--token", "from-flag-0123456789", "--token-file", file_arg])
        .args
        .resolve(&env)
        .expect("valid");
    assert_eq!(r.token_source, TokenSource::Flag);
    let r = parse(&["--token-file", file_arg])
        .args
        .resolve(&env)
        .expect("valid");
    assert_eq!(r.token_source, TokenSource::File);
    match r.config.auth {
        Auth::Token(t) => assert_eq!(t.expose(), "from-file-0123456789"),
        Auth::Misconfigured => panic!("token expected"),
    }
    let r = parse(&[]).args.resolve(&env).expect("valid");
    assert_eq!(r.token_source, TokenSource::Environment);
}

#[test]
fn empty_token_sources_are_errors_not_fall_through() {
    let dir = std::env::temp_dir().join(format!("agui-cli-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("empty");
    std::fs::write(&file, "\n").expect("write");
    let env_empty = |k: &str| (k == "AGUI_TOKEN").then(String::new);
    assert!(parse(&["--token", ""]).args.resolve(&no_env).is_err());
    assert!(
        parse(&["--token-file", file.to_str().expect("utf8")])
            .args
            .resolve(&no_env)
            .is_err()
    );
    assert!(parse(&[]).args.resolve(&env_empty).is_err());
}

#[test]
fn tls_flags_must_pair() {
    assert!(parse(&["--tls-cert", "c"]).args.resolve(&no_env).is_err());
    assert!(
        parse(&["--no-tls", "--tls-cert", "c", "--tls-key", "k"])
            .args
            .resolve(&no_env)
            .is_err()
    );
}

#[test]
fn config_file_unknown_keys_are_errors() {
    let dir = std::env::temp_dir().join(format!("agui-cli-toml-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("c.toml");
    std::fs::write(&file, "[server]\nprot = 1\n").expect("write");
    let err = parse(&["--config", file.to_str().expect("utf8")])
        .args
        .resolve(&no_env)
        .expect_err("unknown key");
    assert!(err.to_string().contains("prot"), "{err}");
}

#[test]
fn config_file_errors_name_the_key_and_its_line() {
    let dir = std::env::temp_dir().join(format!("agui-cli-types-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("c.toml");
    for (text, says) in [
        (
            "[server]\nhost = \"127.0.0.1\"\nport = \"eighty\"\n",
            "`server.port` (line 3): expected u16, found string \"eighty\"",
        ),
        (
            "[server]\nport = 1\n\n[[agents]]\nname = \"a\"\nkind = \"acp\"\npool_size = -1\n",
            "`agents[0].pool_size` (line 7):",
        ),
        (
            "[server]\nprot = 1\n",
            "`server.prot` (line 2): unknown field `prot`",
        ),
        ("[[agents]]\nkind = \"demo\"\n", "`agents[0].name`"),
        ("[server\nport = 1\n", "line 1:"),
    ] {
        std::fs::write(&file, text).expect("write");
        let err = parse(&["--config", file.to_str().expect("utf8")])
            .args
            .resolve(&no_env)
            .expect_err("invalid");
        assert!(err.to_string().contains(says), "{text}: {err}");
        assert!(!err.to_string().contains('\n'), "one line: {err}");
    }
}

#[test]
fn agents_take_workspaces_by_default_and_never_the_daemons_ports() {
    let dir = std::env::temp_dir().join(format!("agui-cli-ws-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let resolve = |text: &str| {
        let file = dir.join("c.toml");
        std::fs::write(&file, text).expect("write");
        parse(&[
            "--config",
            file.to_str().expect("utf8"),
            "--data-dir",
            "/var/lib/a",
        ])
        .args
        .resolve(&no_env)
    };
    let agent = "[[agents]]\nname = \"a\"\nkind = \"acp\"\ncommand = [\"x\"]\n";
    let config = resolve(agent).expect("valid").config;
    let AgentKind::Acp(acp) = &config.agents[0].kind else {
        panic!("an ACP agent");
    };
    let workspace = acp.workspace.as_ref().expect("a workspace by default");
    assert_eq!(workspace.root, Path::new("/var/lib/a/workspaces"));
    assert!(
        acp.sandbox.connect.is_empty(),
        "no loopback port by default"
    );
    let own = format!("[server]\nport = 8443\n\n{agent}sandbox = {{ connect = [8443] }}\n");
    let err = resolve(&own).expect_err("the daemon's port");
    assert!(err.to_string().contains("port 8443"), "{err}");
    let both = format!("{agent}cwd = \"/srv\"\n[agents.workspace]\nsource = \"empty\"\n");
    let err = resolve(&both).expect_err("cwd and a workspace");
    assert!(err.to_string().contains("not both"), "{err}");
    let relative = format!("{agent}[agents.workspace]\nroot = \"rel\"\n");
    assert!(resolve(&relative).is_err());
    assert_eq!(workspace.checkpoints, crate::workspace::DEFAULT_CHECKPOINTS);
    let none = format!("{agent}[agents.workspace]\ncheckpoints = 0\n");
    let config = resolve(&none).expect("valid").config;
    let AgentKind::Acp(acp) = &config.agents[0].kind else {
        panic!("an ACP agent");
    };
    let workspace = acp.workspace.as_ref().expect("a workspace");
    assert_eq!(workspace.checkpoints, 0);
    let owned = format!("{agent}history = \"client\"\n");
    let config = resolve(&owned).expect("valid").config;
    assert_eq!(config.agents[0].history, crate::agent::History::Client);
    assert!(resolve(&format!("{agent}history = \"both\"\n")).is_err());
    let workspaces = crate::workspace::Workspaces::new("a", workspace.clone())
        .with_checkpoints(Path::new("/var/lib/a/checkpoints/a"));
    assert!(workspaces.checkpoints().is_none(), "no checkpoints taken");
}

/// A relative data directory is taken from the daemon's working directory, once: the
/// agents' workspaces under it are absolute, as ACP wants an agent's `cwd`.
#[test]
fn a_relative_data_directory_is_made_absolute() {
    let dir = std::env::temp_dir().join(format!("agui-cli-rel-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("c.toml");
    std::fs::write(
        &file,
        "[[agents]]\nname = \"a\"\nkind = \"acp\"\ncommand = [\"x\"]\n",
    )
    .expect("write");
    let config = parse(&[
        "--config",
        file.to_str().expect("utf8"),
        "--data-dir",
        "state/agui",
    ])
    .args
    .resolve(&no_env)
    .expect("valid")
    .config;
    let cwd = std::env::current_dir().expect("cwd");
    assert_eq!(config.data_dir, cwd.join("state/agui"));
    let AgentKind::Acp(acp) = &config.agents[0].kind else {
        panic!("an ACP agent");
    };
    let workspace = acp.workspace.as_ref().expect("a workspace by default");
    assert_eq!(workspace.root, cwd.join("state/agui/workspaces"));
    assert!(workspace.root.is_absolute());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn config_file_and_flags_merge() {
    let dir = std::env::temp_dir().join(format!("agui-cli-merge-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("c.toml");
    std::fs::write(
        &file,
        r#"
[server]
port = 9000
path = "/x/"
disconnect_grace = "5s"
allowed_origins = ["https://a.example"]

[[agents]]
name = "echo"
kind = "demo"
hitl = "interrupt"

[[agents]]
name = "claude"
kind = "acp"
command = ["npx", "-y", "pkg"]
env = { KEY = "secret" }
pool_size = 2
idle_ttl = "10m"
permissions = "allow"
"#,
    )
    .expect("write");
    let r = parse(&["--config", file.to_str().expect("utf8"), "--port", "9001"])
        .args
        .resolve(&no_env)
        .expect("valid");
    let c = r.config;
    assert_eq!(c.port, 9001);
    assert_eq!(c.path, "/x");
    assert_eq!(c.disconnect_grace.as_secs(), 5);
    assert_eq!(c.agents.len(), 2);
    assert_eq!(c.agents[0].hitl, Hitl::Interrupt);
    assert!(!format!("{c:?}").contains("secret"));
    assert!(!c.redacted_json().to_string().contains("secret"));
}

#[test]
fn acp_flag_splits_shell_words() {
    let r = parse(&["--acp", "claude=npx -y '@scope/pkg' --flag"])
        .args
        .resolve(&no_env)
        .expect("valid");
    match &r.config.agents[0].kind {
        AgentKind::Acp(acp) => assert_eq!(acp.command, ["npx", "-y", "@scope/pkg", "--flag"]),
        AgentKind::Demo => panic!("acp expected"),
    }
    assert!(parse(&["--acp", "noequals"]).args.resolve(&no_env).is_err());
}

#[test]
fn the_uploads_table_sets_the_limits_and_refuses_a_bad_type() {
    let dir = std::env::temp_dir().join(format!("agui-cli-uploads-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("c.toml");
    std::fs::write(
        &file,
        "[uploads]\nmax_size = \"1MiB\"\nquota = \"10MiB\"\ntypes = [\"image/*\", \"Text/Plain\"]\nunused_ttl = \"1h\"\npreview_ttl = \"5m\"\n",
    )
    .expect("write");
    let config = parse(&["--config", file.to_str().expect("utf8")])
        .args
        .resolve(&no_env)
        .expect("config")
        .config;
    assert_eq!(config.uploads.max_bytes, 1024 * 1024);
    assert_eq!(config.uploads.quota, 10 * 1024 * 1024);
    assert_eq!(config.uploads.types, ["image/*", "text/plain"]);
    assert_eq!(
        config.uploads.unused_ttl,
        std::time::Duration::from_secs(3600)
    );
    assert_eq!(
        config.uploads.preview_ttl,
        std::time::Duration::from_secs(300)
    );
    std::fs::write(&file, "[uploads]\npreview_ttl = \"2s\"\n").expect("write");
    let err = parse(&["--config", file.to_str().expect("utf8")])
        .args
        .resolve(&no_env)
        .expect_err("a link shorter than a minute");
    assert!(err.to_string().contains("uploads.preview_ttl"), "{err}");

    std::fs::write(&file, "[uploads]\ntypes = [\"html\"]\n").expect("write");
    let err = parse(&["--config", file.to_str().expect("utf8")])
        .args
        .resolve(&no_env)
        .expect_err("a bad type");
    assert!(err.to_string().contains("uploads.types"), "{err}");
}

#[test]
fn an_agent_s_warm_starts_are_read_with_their_defaults_and_a_zero_ttl_refused() {
    let dir = std::env::temp_dir().join(format!("agui-cli-warm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("c.toml");
    let agent =
        |keys: &str| format!("[[agents]]\nname = \"a\"\nkind = \"acp\"\ncommand = [\"x\"]\n{keys}");
    let warm = |keys: &str| {
        std::fs::write(&file, agent(keys)).expect("write");
        parse(&["--config", file.to_str().expect("utf8")])
            .args
            .resolve(&no_env)
            .map(|r| match &r.config.agents[0].kind {
                AgentKind::Acp(acp) => acp.warm.clone(),
                AgentKind::Demo => panic!("acp expected"),
            })
    };
    let defaults = warm("").expect("defaults");
    assert_eq!(defaults, crate::config::Warm::default());
    assert_eq!(defaults.spares, 0, "nothing made ahead unless asked");
    let set = warm("spares = 2\nspare_ttl = \"5m\"\nspare_session = false\nspare_principals = 4\npreload_sessions = 3\n")
        .expect("set");
    assert_eq!(
        set,
        crate::config::Warm {
            spares: 2,
            spare_ttl: std::time::Duration::from_secs(300),
            spare_session: false,
            spare_principals: 4,
            preload_sessions: 3,
        }
    );
    let err = warm("spares = 1\nspare_ttl = \"0s\"\n").expect_err("a zero TTL");
    assert!(err.to_string().contains("spare_ttl"), "{err}");
}

#[test]
fn an_agent_s_multitask_strategy_is_read_and_an_unknown_one_refused() {
    let dir = std::env::temp_dir().join(format!("agui-cli-multitask-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("c.toml");
    std::fs::write(
        &file,
        "[[agents]]\nname = \"demo\"\nkind = \"demo\"\nmultitask = \"interrupt\"\n",
    )
    .expect("write");
    let config = parse(&["--config", file.to_str().expect("utf8")])
        .args
        .resolve(&no_env)
        .expect("config")
        .config;
    assert_eq!(
        config.agents[0].multitask,
        crate::agent::Multitask::Interrupt
    );

    std::fs::write(
        &file,
        "[[agents]]\nname = \"demo\"\nkind = \"demo\"\nmultitask = \"enqueue\"\n",
    )
    .expect("write");
    let config = parse(&["--config", file.to_str().expect("utf8")])
        .args
        .resolve(&no_env)
        .expect("config")
        .config;
    assert_eq!(config.agents[0].multitask, crate::agent::Multitask::Enqueue);

    std::fs::write(
        &file,
        "[[agents]]\nname = \"demo\"\nkind = \"demo\"\nmultitask = \"later\"\n",
    )
    .expect("write");
    let err = parse(&["--config", file.to_str().expect("utf8")])
        .args
        .resolve(&no_env)
        .expect_err("unknown");
    assert!(err.to_string().contains("agents[0].multitask"), "{err}");
}

#[test]
fn webhooks_are_read_checked_and_shown_without_their_secrets() {
    let dir = std::env::temp_dir().join(format!("agui-cli-webhooks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let secret = dir.join("hook.secret");
    std::fs::write(&secret, "whsec-not-to-be-shown-0123456789abcdef\n").expect("write");
    let file = dir.join("c.toml");
    let resolve = |toml: String| {
        std::fs::write(&file, toml).expect("write");
        parse(&["--config", file.to_str().expect("utf8")])
            .args
            .resolve(&no_env)
    };
    let secret_line = format!("secret_file = {:?}\n", secret.display().to_string());
    let resolved = resolve(format!(
        "[[webhooks]]\nurl = \"https://hooks.example.com/T0/B0/path-secret\"\n{secret_line}\
         events = [\"run.finished\", \"run.waiting\"]\nmax_backoff = \"30s\"\n\n\
         [[webhooks]]\nname = \"audit\"\nurl = \"http://127.0.0.1:9000\"\n{secret_line}"
    ))
    .expect("valid");
    let hooks = &resolved.config.webhooks;
    assert_eq!(hooks.len(), 2);
    assert!(hooks[0].name.starts_with("webhook-"), "{}", hooks[0].name);
    assert_eq!(hooks[0].events.names(), ["run.finished", "run.waiting"]);
    assert_eq!(hooks[0].max_backoff, std::time::Duration::from_secs(30));
    assert_eq!(
        hooks[0].secret.expose(),
        b"whsec-not-to-be-shown-0123456789abcdef"
    );
    assert_eq!(hooks[1].name, "audit");
    assert_eq!(hooks[1].events, crate::webhooks::Events::all());
    assert!(resolved.config.private_files.contains(&secret));
    let (report, _) = resolved.report();
    let shown = report.to_string();
    assert!(shown.contains("https://hooks.example.com/…"), "{shown}");
    let debug = format!("{:?}", resolved.config);
    for text in [&shown, &debug] {
        assert!(!text.contains("whsec-not-to-be-shown"), "{text}");
        assert!(!text.contains("path-secret"), "{text}");
    }

    let refused = |toml: String, names: &str| {
        let err = resolve(toml).expect_err(names);
        assert!(err.to_string().contains(names), "{err}");
    };
    refused(
        format!("[[webhooks]]\nurl = \"http://h/\"\n{secret_line}events = [\"run.done\"]\n"),
        "webhooks[0].events: unknown event \"run.done\"",
    );
    refused(
        format!("[[webhooks]]\nurl = \"http://h/\"\n{secret_line}secret = \"inline\"\n"),
        "secret",
    );
    refused(
        format!("[[webhooks]]\nurl = \"ftp://h/\"\n{secret_line}"),
        "webhooks[0].url",
    );
    refused(
        "[[webhooks]]\nurl = \"http://h/\"\nsecret_file = \"/nonexistent/hook.secret\"\n"
            .to_owned(),
        "webhooks[0].secret_file",
    );
    refused(
        format!(
            "[[webhooks]]\nname = \"a\"\nurl = \"http://h/\"\n{secret_line}\n[[webhooks]]\nname = \"a\"\nurl = \"http://i/\"\n{secret_line}"
        ),
        "webhooks[1].name",
    );
}

#[test]
fn budgets_are_read_and_bad_ones_refused_by_name() {
    let dir = std::env::temp_dir().join(format!("agui-cli-budgets-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let file = dir.join("c.toml");
    std::fs::write(
        &file,
        "[budgets]\ntokens = 100\nwall_time = \"2m\"\nthread = { tool_calls = 5 }\n\
         principal = { tokens = 1000 }\nhard = { wall_time = \"1h\" }\n\
         [[agents]]\nname = \"demo\"\nkind = \"demo\"\nbudget = { tokens = 7 }\n",
    )
    .expect("write");
    let config = parse(&["--config", file.to_str().expect("utf8")])
        .args
        .resolve(&no_env)
        .expect("config")
        .config;
    let budgets = &config.budgets;
    assert_eq!(
        (budgets.run.tokens, budgets.run.wall_time),
        (Some(100), Some(120))
    );
    assert_eq!(budgets.thread.tool_calls, Some(5));
    assert_eq!(budgets.principal.tokens, Some(1000));
    assert_eq!(budgets.hard.wall_time, Some(3600));
    assert_eq!(config.agents[0].budget.and_then(|b| b.tokens), Some(7));

    for (text, key) in [
        ("[budgets]\ntokens = 0\n", "budgets.tokens"),
        (
            "[budgets]\nthread = { wall_time = \"soon\" }\n",
            "budgets.thread.wall_time",
        ),
        ("[budgets]\nprincipal = { coins = 3 }\n", "coins"),
    ] {
        std::fs::write(&file, text).expect("write");
        let err = parse(&["--config", file.to_str().expect("utf8")])
            .args
            .resolve(&no_env)
            .expect_err(text);
        assert!(err.to_string().contains(key), "{err}");
    }
}

#[test]
fn a_relay_s_key_file_is_kept_from_every_agent() {
    let dir = std::env::temp_dir().join(format!("agui-relay-key-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    let key = dir.join("anthropic.key");
    std::fs::write(&key, "sk-ant-0123456789\n").expect("key");
    let file = dir.join("c.toml");
    std::fs::write(
        &file,
        format!(
            "[[agents]]\nname = \"claude\"\nkind = \"acp\"\ncommand = [\"sh\"]\nmode = \"default\"\n\n\
             [[agents.relay]]\nupstream = \"https://api.anthropic.com\"\nheader = \"x-api-key\"\n\
             secret_file = {:?}\nbase_url_env = \"ANTHROPIC_BASE_URL\"\n",
            key.display().to_string()
        ),
    )
    .expect("config");
    let resolved = parse(&["--config", file.to_str().expect("utf8")])
        .args
        .resolve(&no_env)
        .expect("valid");
    assert!(
        resolved.config.secret_paths().contains(&key),
        "{:?}",
        resolved.config.secret_paths()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

//! `agui-serve init`: a configuration for the agents asked for, from nothing to a daemon a
//! CopilotKit app can use. It installs each agent's ACP adapter with npm into a tools
//! directory (at the version the tests run), writes the agent's recipe (docs/agents.md's:
//! its mode, the sandbox reading the tools, its model reached through a relay holding the
//! key, a warm start), makes the token, checks the result as `check-config` does, and
//! prints the URL and the token. It asks which agents when it runs on a terminal and was
//! given none; with flags (and `--yes`) it asks nothing, for scripts.

use std::io::{BufRead as _, IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::flags::{InitAgent, InitArgs, ServeArgs};

/// The adapters, at the versions `tests/agents/real/package.json` pins.
const CLAUDE_ADAPTER: (&str, &str, &str) = (
    "@agentclientprotocol/claude-agent-acp",
    "0.101.0",
    "claude-agent-acp",
);
const CODEX_ADAPTER: (&str, &str, &str) = ("@agentclientprotocol/codex-acp", "2.6.0", "codex-acp");
/// Gemini CLI speaks ACP itself (at a version of its own: not tested here).
const GEMINI_CLI: (&str, &str, &str) = ("@google/gemini-cli", "0.61.0", "gemini");

/// Why `init` stopped.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InitError(String);

fn fail<T>(message: impl Into<String>) -> Result<T, InitError> {
    Err(InitError(message.into()))
}

/// What `init` made, for the closing lines.
#[derive(Debug)]
pub struct Initialized {
    pub config: PathBuf,
    pub url: String,
    pub token: String,
    pub warnings: Vec<String>,
}

/// Runs `init` with the global flags `serve` (config, data dir, host, port, TLS, token
/// file) and its own `args`.
pub fn run(
    serve: &ServeArgs,
    args: &InitArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Initialized, InitError> {
    let data_dir = serve
        .data_dir
        .clone()
        .unwrap_or_else(|| crate::config::default_data_dir(env));
    let config = serve
        .config
        .clone()
        .unwrap_or_else(|| data_dir.join("config.toml"));
    if config.exists() && !args.force {
        return fail(format!(
            "{} exists; --force writes over it (or --config another file)",
            config.display()
        ));
    }
    for path in [Some(&data_dir), Some(&config), args.tools_dir.as_ref()]
        .into_iter()
        .flatten()
    {
        if path.to_string_lossy().contains(['\n', '\r']) {
            return fail(format!("{path:?} holds a line break"));
        }
    }
    let agents = chosen(args)?;
    let here = config
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_owned();
    for dir in [&data_dir, &here] {
        private_dir(dir)?;
    }
    let data_dir = std::fs::canonicalize(&data_dir).unwrap_or(data_dir);
    let here = std::fs::canonicalize(&here).unwrap_or(here);
    let config = here.join(config.file_name().unwrap_or("config.toml".as_ref()));
    let tools = tools_dir(args, &data_dir, &agents, env)?;
    let token_file = serve
        .token_file
        .clone()
        .unwrap_or_else(|| here.join("token"));
    let token = token(&token_file)?;
    let port = serve.port.unwrap_or(8443);
    let host = serve
        .host
        .map_or_else(|| "127.0.0.1".to_owned(), |h| h.to_string());
    let mut text = format!(
        "# Written by `agui-serve init`; every key: docs/configuration.md. Check a change with\n\
         #   agui-serve check-config --config {config}\n\n\
         [server]\nhost = {host_q}\nport = {port}\ndata_dir = {data_q}\ntoken_file = {token_q}\n{tls}\n\
         # The built-in deterministic agent: say /help to it.\n[[agents]]\nname = \"demo\"\nkind = \"demo\"\n",
        config = config.display(),
        host_q = quoted(&host),
        data_q = quoted_path(&data_dir),
        token_q = quoted_path(&token_file),
        tls = if serve.no_tls { "no_tls = true\n" } else { "" },
    );
    for agent in &agents {
        text.push_str(&recipe(*agent, args, &tools, &here, env)?);
    }
    write_private(&config, text.as_bytes())?;
    let warnings = checked(&config, env)?;
    let scheme = if serve.no_tls { "http" } else { "https" };
    let last = agents
        .iter()
        .rev()
        .find(|a| **a != InitAgent::Demo)
        .map_or("demo", |a| agent_name(*a));
    Ok(Initialized {
        config,
        url: format!("{scheme}://{host}:{port}/agui/{last}"),
        token,
        warnings,
    })
}

/// `agent`'s part of the configuration (none for demo): its adapter installed, its model
/// key's file found or written, its recipe.
fn recipe(
    agent: InitAgent,
    args: &InitArgs,
    tools: &Path,
    here: &Path,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, InitError> {
    let (adapter, given, variable, file, flag) = match agent {
        InitAgent::Demo => return Ok(String::new()),
        InitAgent::ClaudeCode => (
            CLAUDE_ADAPTER,
            &args.anthropic_key_file,
            "ANTHROPIC_API_KEY",
            "anthropic.key",
            "--anthropic-key-file",
        ),
        InitAgent::Codex => (
            CODEX_ADAPTER,
            &args.openai_key_file,
            "OPENAI_API_KEY",
            "openai.key",
            "--openai-key-file",
        ),
        InitAgent::Gemini => (
            GEMINI_CLI,
            &args.gemini_key_file,
            "GEMINI_API_KEY",
            "gemini.key",
            "--gemini-key-file",
        ),
    };
    let command = install(tools, adapter)?;
    let key = key_file(given.as_deref(), variable, &here.join(file), flag, env)?;
    Ok(match agent {
        InitAgent::Codex => {
            let home = tools.join("codex-home");
            codex_home(&home, &args.codex_model)?;
            codex_recipe(&command, tools, &home, &args.openai_url, &key)
        }
        InitAgent::Gemini => gemini_recipe(&command, tools, &args.gemini_url, &key),
        _ => claude_recipe(&command, tools, &args.anthropic_url, &key),
    })
}

/// The configuration at `config` read as the daemon will read it: its warnings, or why it
/// does not check.
fn checked(config: &Path, env: &dyn Fn(&str) -> Option<String>) -> Result<Vec<String>, InitError> {
    let check = ServeArgs {
        config: Some(config.to_owned()),
        ..ServeArgs::default()
    };
    let resolved = check.resolve(env).map_err(|e| {
        InitError(format!(
            "the configuration written to {} does not check: {e}",
            config.display()
        ))
    })?;
    Ok(resolved.report().1)
}

/// Where the adapters go: `--tools-dir`, else (as root) `/opt/agui-serve/tools`. Never in
/// the data directory or `$HOME`: the sandbox keeps those from every agent, which could
/// then not start its own program.
fn tools_dir(
    args: &InitArgs,
    data_dir: &Path,
    agents: &[InitAgent],
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<PathBuf, InitError> {
    let tools = match &args.tools_dir {
        Some(dir) => std::path::absolute(dir)
            .map_err(|e| InitError(format!("--tools-dir {}: {e}", dir.display())))?,
        None if as_root() => PathBuf::from("/opt/agui-serve/tools"),
        None if agents.iter().all(|a| *a == InitAgent::Demo) => return Ok(PathBuf::new()),
        None => {
            return fail(
                "give --tools-dir DIR for the adapters: a directory outside your home and the \
                 data directory, which the sandbox keeps from every agent (as root the default \
                 is /opt/agui-serve/tools)",
            );
        }
    };
    let home = env("HOME").map(PathBuf::from);
    for (hidden, what) in [
        (Some(data_dir.to_owned()), "the data directory"),
        (home, "$HOME"),
    ] {
        if let Some(hidden) = hidden.filter(|h| tools.starts_with(h)) {
            return fail(format!(
                "{} is in {what} ({}), which the sandbox keeps from every agent: give \
                 --tools-dir a directory outside it",
                tools.display(),
                hidden.display()
            ));
        }
    }
    Ok(tools)
}

/// The agents to set up: the flags', else asked on a terminal, else only demo; demo always.
fn chosen(args: &InitArgs) -> Result<Vec<InitAgent>, InitError> {
    let mut agents = vec![InitAgent::Demo];
    let asked = if args.agents.is_empty() && !args.yes && std::io::stdin().is_terminal() {
        ask()?
    } else {
        args.agents.clone()
    };
    for agent in asked {
        if !agents.contains(&agent) {
            agents.push(agent);
        }
    }
    Ok(agents)
}

fn ask() -> Result<Vec<InitAgent>, InitError> {
    print!(
        "Agents to set up besides demo (claude-code, codex, gemini; comma-separated, empty for none): "
    );
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut line)
        .map_err(|e| InitError(format!("cannot read the answer: {e}")))?;
    line.split(',')
        .map(str::trim)
        .filter(|w| !w.is_empty())
        .map(|word| {
            <InitAgent as clap::ValueEnum>::from_str(word, true)
                .map_err(|_| InitError(format!("{word:?} is not claude-code, codex or gemini")))
        })
        .collect()
}

fn agent_name(agent: InitAgent) -> &'static str {
    match agent {
        InitAgent::Demo => "demo",
        InitAgent::ClaudeCode => "claude",
        InitAgent::Codex => "codex",
        InitAgent::Gemini => "gemini",
    }
}

/// Installs `package@version` into `tools` with npm unless that version is there; the path
/// of its `bin`.
fn install(
    tools: &Path,
    (package, version, bin): (&str, &str, &str),
) -> Result<PathBuf, InitError> {
    let manifest = tools
        .join("node_modules")
        .join(package)
        .join("package.json");
    let installed = std::fs::read(&manifest)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
        .is_some_and(|m| m["version"] == version);
    if !installed {
        std::fs::create_dir_all(tools)
            .map_err(|e| InitError(format!("cannot make {}: {e}", tools.display())))?;
        eprintln!(
            "agui-serve init: installing {package}@{version} into {}",
            tools.display()
        );
        let status = Command::new("npm")
            .args([
                "install",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
                "--prefix",
            ])
            .arg(tools)
            .arg(format!("{package}@{version}"))
            .status()
            .map_err(|e| InitError(format!("cannot run npm (install Node.js and npm): {e}")))?;
        if !status.success() {
            return fail(format!("npm install {package}@{version} failed ({status})"));
        }
    }
    let bin = tools.join("node_modules/.bin").join(bin);
    if !bin.exists() {
        return fail(format!("{} is missing after the install", bin.display()));
    }
    Ok(bin)
}

/// The file holding a model key: the one given, else `variable`'s value written to
/// `default` (0600), else an error naming `flag`.
fn key_file(
    given: Option<&Path>,
    variable: &str,
    default: &Path,
    flag: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<PathBuf, InitError> {
    if let Some(file) = given {
        let file = std::fs::canonicalize(file)
            .map_err(|e| InitError(format!("{}: {e}", file.display())))?;
        return Ok(file);
    }
    match env(variable).filter(|k| !k.trim().is_empty()) {
        // The key given now wins over one written by an earlier init.
        Some(key) => {
            let _ = std::fs::remove_file(default);
            write_new(default, key.trim().as_bytes())?;
            Ok(default.to_owned())
        }
        None if default.exists() => Ok(default.to_owned()),
        None => fail(format!(
            "the model's key: give {flag} FILE, or set {variable} (it is written to {}, which \
             the relay reads; the agent never sees it)",
            default.display()
        )),
    }
}

/// The token in `file`, made (32 random bytes in hex, 0600) when it does not exist.
fn token(file: &Path) -> Result<String, InitError> {
    match std::fs::read_to_string(file) {
        Ok(text) => {
            let token = text.trim().to_owned();
            if token.is_empty() {
                return fail(format!("{} is empty", file.display()));
            }
            return Ok(token);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return fail(format!("{}: {e}", file.display())),
    }
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(|e| InitError(format!("no random source: {e}")))?;
    let token = crate::hex::encode(&bytes);
    write_new(file, format!("{token}\n").as_bytes())?;
    Ok(token)
}

fn private_dir(dir: &Path) -> Result<(), InitError> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| InitError(format!("cannot make {}: {e}", dir.display())))
}

/// Writes `bytes` to `path`, readable by its owner only; never through a symbolic link.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), InitError> {
    write_file(path, bytes, false)
}

/// Writes `bytes` to a file that must not exist yet (a secret: nobody else's file, or a
/// link planted in its place, is ever taken for it).
fn write_new(path: &Path, bytes: &[u8]) -> Result<(), InitError> {
    write_file(path, bytes, true)
}

fn write_file(path: &Path, bytes: &[u8], new: bool) -> Result<(), InitError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut options = std::fs::OpenOptions::new();
    options
        .write(true)
        .mode(0o600)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits());
    if new {
        options.create_new(true);
    } else {
        options.create(true).truncate(true);
    }
    let written = options.open(path).and_then(|mut f| f.write_all(bytes));
    written.map_err(|e| InitError(format!("cannot write {}: {e}", path.display())))
}

/// A TOML basic string (JSON's escapes are TOML's).
fn quoted(text: &str) -> String {
    serde_json::Value::from(text).to_string()
}

fn quoted_path(path: &Path) -> String {
    quoted(&path.to_string_lossy())
}

/// Whether the daemon will run as root, as `init` does (Claude Code refuses root unless
/// told it is sandboxed).
fn as_root() -> bool {
    nix::unistd::geteuid().is_root()
}

fn claude_recipe(command: &Path, tools: &Path, upstream: &str, key: &Path) -> String {
    let root = if as_root() {
        "IS_SANDBOX = \"1\", "
    } else {
        ""
    };
    format!(
        "\n# Claude Code in a confined workspace per thread; its model reached through a relay\n\
         # that adds the key outside the sandbox (the agent holds a placeholder). `mode =\n\
         # \"default\"` makes it ask before it acts; one warm start is kept ready.\n\
         [[agents]]\nname = \"claude\"\nkind = \"acp\"\ndescription = \"Claude Code\"\n\
         command = [{command}]\n\
         env = {{ {root}DISABLE_AUTOUPDATER = \"1\", DISABLE_TELEMETRY = \"1\", CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC = \"1\" }}\n\
         permissions = \"ask\"\nmode = \"default\"\nspares = 1\n\
         sandbox = {{ read = [{tools}] }}\n\n\
         [[agents.relay]]\nupstream = {upstream}\nheader = \"x-api-key\"\nsecret_file = {key}\n\
         base_url_env = \"ANTHROPIC_BASE_URL\"\nplaceholder_env = \"ANTHROPIC_API_KEY\"\n",
        command = quoted_path(command),
        tools = quoted_path(tools),
        upstream = quoted(upstream),
        key = quoted_path(key),
    )
}

fn codex_recipe(command: &Path, tools: &Path, home: &Path, upstream: &str, key: &Path) -> String {
    format!(
        "\n# Codex, its commands run in this daemon's sandbox (its own cannot nest in it), its\n\
         # model reached through a relay: the provider in {home}/config.toml names the relay's\n\
         # address, http://127.0.0.1:4180.\n\
         [[agents]]\nname = \"codex\"\nkind = \"acp\"\ndescription = \"Codex\"\n\
         command = [{command}]\n\
         env = {{ INITIAL_AGENT_MODE = \"agent-full-access\", CODEX_HOME = {home_q}, NO_BROWSER = \"1\" }}\n\
         sandbox = {{ read = [{tools}], write = [{home_q}] }}\n\n\
         [[agents.relay]]\nupstream = {upstream}\nheader = \"authorization\"\nsecret_file = {key}\n\
         base_url_env = \"OPENAI_BASE_URL\"\nplaceholder_env = \"OPENAI_API_KEY\"\n",
        home = home.display(),
        home_q = quoted_path(home),
        command = quoted_path(command),
        tools = quoted_path(tools),
        upstream = quoted(upstream),
        key = quoted_path(key),
    )
}

fn gemini_recipe(command: &Path, tools: &Path, upstream: &str, key: &Path) -> String {
    format!(
        "\n# Gemini CLI (it speaks ACP itself), its model reached through a relay: it reads the\n\
         # base URL from GOOGLE_GEMINI_BASE_URL and holds a placeholder key.\n\
         [[agents]]\nname = \"gemini\"\nkind = \"acp\"\ndescription = \"Gemini CLI\"\n\
         command = [{command}, \"--acp\"]\n\
         sandbox = {{ read = [{tools}] }}\n\n\
         [[agents.relay]]\nupstream = {upstream}\nheader = \"x-goog-api-key\"\nsecret_file = {key}\n\
         base_url_env = \"GOOGLE_GEMINI_BASE_URL\"\nplaceholder_env = \"GEMINI_API_KEY\"\n",
        command = quoted_path(command),
        tools = quoted_path(tools),
        upstream = quoted(upstream),
        key = quoted_path(key),
    )
}

/// Codex's own configuration in `home`, naming the relay as its model provider (kept when
/// one is there).
fn codex_home(home: &Path, model: &str) -> Result<(), InitError> {
    private_dir(home)?;
    let file = home.join("config.toml");
    if file.exists() {
        return Ok(());
    }
    let text = format!(
        "model = {model}\nmodel_provider = \"relayed\"\ncheck_for_update_on_startup = false\n\n\
         [model_providers.relayed]\nname = \"OpenAI through agui-serve\"\n\
         base_url = \"http://127.0.0.1:4180\"\nwire_api = \"responses\"\nenv_key = \"OPENAI_API_KEY\"\n\n\
         [analytics]\nenabled = false\n",
        model = quoted(model),
    );
    write_private(&file, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn demo_alone_makes_a_configuration_that_checks_and_a_private_token() {
        let dir = std::env::temp_dir().join(format!("agui-init-{}", uuid::Uuid::new_v4()));
        let serve = ServeArgs {
            data_dir: Some(dir.join("data")),
            port: Some(9555),
            ..ServeArgs::default()
        };
        let quiet = InitArgs {
            yes: true,
            ..InitArgs::default()
        };
        let done = run(&serve, &quiet, &no_env).expect("init");
        assert_eq!(done.url, "https://127.0.0.1:9555/agui/demo");
        assert!(done.warnings.is_empty(), "{:?}", done.warnings);
        assert_eq!(done.token.len(), 64);
        let token_file = dir.join("data/token");
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&token_file)
            .expect("token")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        let text = std::fs::read_to_string(&done.config).expect("config");
        assert!(text.contains("kind = \"demo\""), "{text}");
        // Run again: refused without --force, the token kept with it.
        let again = run(&serve, &quiet, &no_env).expect_err("exists");
        assert!(again.to_string().contains("--force"), "{again}");
        let forced = InitArgs {
            force: true,
            yes: true,
            ..InitArgs::default()
        };
        assert_eq!(
            run(&serve, &forced, &no_env).expect("forced").token,
            done.token
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_model_key_is_asked_for_by_flag_or_variable_and_never_put_in_the_configuration() {
        let dir = std::env::temp_dir().join(format!("agui-init-key-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("dir");
        let missing = key_file(
            None,
            "ANTHROPIC_API_KEY",
            &dir.join("a.key"),
            "--anthropic-key-file",
            &no_env,
        )
        .expect_err("no key");
        assert!(
            missing.to_string().contains("--anthropic-key-file"),
            "{missing}"
        );
        let env = |name: &str| (name == "ANTHROPIC_API_KEY").then(|| "sk-test-123".to_owned());
        let file = key_file(
            None,
            "ANTHROPIC_API_KEY",
            &dir.join("a.key"),
            "--anthropic-key-file",
            &env,
        )
        .expect("from the variable");
        assert_eq!(std::fs::read_to_string(&file).expect("key"), "sk-test-123");
        let recipe = claude_recipe(
            Path::new("/t/bin/claude"),
            Path::new("/t"),
            "https://api.anthropic.com",
            &file,
        );
        assert!(!recipe.contains("sk-test-123"));
        assert!(recipe.contains("mode = \"default\""));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_adapters_never_go_where_the_sandbox_keeps_agents_out() {
        let home = |name: &str| (name == "HOME").then(|| "/home/op".to_owned());
        let data = Path::new("/var/lib/agui");
        let with = |dir: &str| InitArgs {
            tools_dir: Some(PathBuf::from(dir)),
            ..InitArgs::default()
        };
        let agents = [InitAgent::Demo, InitAgent::ClaudeCode];
        for hidden in ["/var/lib/agui/tools", "/home/op/tools"] {
            let refused = tools_dir(&with(hidden), data, &agents, &home).expect_err(hidden);
            assert!(
                refused.to_string().contains("keeps from every agent"),
                "{refused}"
            );
        }
        assert_eq!(
            tools_dir(&with("/opt/tools"), data, &agents, &home).expect("outside"),
            PathBuf::from("/opt/tools")
        );
    }
}

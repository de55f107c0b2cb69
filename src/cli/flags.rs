//! The command line as clap reads it: what the flags say, before any default or check.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Serve agent runtimes over the AG-UI protocol.
#[derive(Debug, Parser)]
#[command(name = "agui-serve", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub args: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate the configuration and print it resolved, secrets redacted.
    CheckConfig,
    /// Write a configuration for the agents asked for: install their adapters with npm,
    /// make the token, check the result, print the URL and token a CopilotKit app needs.
    Init(Box<InitArgs>),
}

#[derive(Debug, Default, clap::Args)]
pub struct ServeArgs {
    /// TOML configuration file; flags override it [default: none]
    #[arg(long, env = "AGUI_CONFIG", global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Bind address [default: 127.0.0.1]
    #[arg(long, global = true)]
    pub host: Option<IpAddr>,
    /// Port; 0 picks a free one [default: 8443]
    #[arg(long, global = true)]
    pub port: Option<u16>,
    /// Route namespace [default: /agui]
    #[arg(long, global = true)]
    pub path: Option<String>,
    /// Bearer token (prefer --token-file: flags are visible in the process list) [default:
    /// --token-file, else AGUI_TOKEN, else one is generated and printed]
    #[arg(long, global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// File holding the bearer token (trailing newline trimmed).
    #[arg(long, global = true, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Allowed browser origin; repeatable; exact, case-insensitive, or `*` [default: none]
    #[arg(long = "allowed-origin", global = true, value_name = "ORIGIN")]
    pub allowed_origins: Vec<String>,
    /// Serve plain HTTP [default: TLS with a self-signed certificate]
    #[arg(long, global = true)]
    pub no_tls: bool,
    /// PEM certificate chain (with --tls-key).
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key (with --tls-cert).
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// SQLite database and generated certificate [default: $STATE_DIRECTORY, else
    /// $XDG_STATE_HOME/agui-serve, else ~/.local/state/agui-serve]
    #[arg(long, global = true, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Admission cap; a suspended run still holds its slot [default: 64]
    #[arg(long, global = true, value_name = "N")]
    pub max_concurrent_runs: Option<usize>,
    /// How long a run with no attached stream lives on [default: 30s]
    #[arg(long, global = true, value_name = "DUR")]
    pub disconnect_grace: Option<String>,
    /// How long shutdown waits for running runs [default: 10s]
    #[arg(long, global = true, value_name = "DUR")]
    pub shutdown_grace: Option<String>,
    /// SSE keep-alive comment after this much silence [default: 15s]
    #[arg(long, global = true, value_name = "DUR")]
    pub keep_alive: Option<String>,
    /// How long a run waits on the client before failing closed [default: 15m]
    #[arg(long, global = true, value_name = "DUR")]
    pub suspend_timeout: Option<String>,
    /// Bytes of finished runs' frames and idle threads kept in memory [default: 256MiB]
    #[arg(long, global = true, value_name = "SIZE")]
    pub memory_budget: Option<String>,
    /// Connections served at once (each open event stream holds one) [default: 4096,
    /// lowered to fit the process's open-file limit]
    #[arg(long, global = true, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Also serve `GET /metrics` without a token, over plain HTTP, on this address (keep it
    /// on loopback) [default: none; `{path}/metrics` with the token is always there]
    #[arg(long, global = true, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// Export traces (spans per request, run, turn and tool call) over OTLP/HTTP to this
    /// collector, e.g. http://127.0.0.1:4318 or https://... [default: none, no traces]
    #[arg(long, global = true, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// An ACP agent: NAME=COMMAND (shell-style words); repeatable [default: the built-in
    /// `demo` agent when no agent is configured]
    #[arg(long = "acp", global = true, value_name = "NAME=COMMAND")]
    pub acp: Vec<String>,
    /// Log format (levels from RUST_LOG) [default: text]
    #[arg(long, global = true, value_enum)]
    pub log_format: Option<LogFormatArg>,
    /// HMAC (HS256) secret file that verifies scoped tokens, and signs minted ones;
    /// repeatable (rotation) [default: only the daemon's own key in the data directory]
    #[arg(long, global = true, value_name = "FILE")]
    pub jwt_secret_file: Vec<PathBuf>,
    /// JWKS file whose keys verify scoped tokens (each key's `alg` pinned); repeatable
    #[arg(long, global = true, value_name = "FILE")]
    pub jwt_jwks_file: Vec<PathBuf>,
    /// Scoped tokens must carry this `aud` [default: none checked]
    #[arg(long, global = true, value_name = "AUD")]
    pub jwt_audience: Option<String>,
    /// With the master token, this header names the principal to act for (a signing-in
    /// proxy) [default: none]
    #[arg(long, global = true, value_name = "NAME")]
    pub trusted_principal_header: Option<String>,
    /// Concurrent runs one principal may hold; the operator is not capped [default: 8]
    #[arg(long, global = true, value_name = "N")]
    pub max_runs_per_principal: Option<usize>,
    /// Fleet streams open at once, in all [default: 1024]
    #[arg(long, global = true, value_name = "N")]
    pub max_fleet_streams: Option<usize>,
    /// Fleet streams one principal may hold open (the operator's namespace counts as one)
    /// [default: 64]
    #[arg(long, global = true, value_name = "N")]
    pub max_fleet_streams_per_principal: Option<usize>,
    /// Where threads, transcripts and runs live: `sqlite` (in the data directory), or a
    /// PostgreSQL connection string (`postgres://...` or `host=... dbname=...`) shared by
    /// the nodes of a cluster [default: sqlite]
    #[arg(
        long,
        global = true,
        value_name = "STORE",
        env = "AGUI_STORE",
        hide_env_values = true
    )]
    pub store: Option<String>,
    /// This node's name in a cluster [default: node]
    #[arg(long, global = true, value_name = "NAME")]
    pub node_id: Option<String>,
    /// How the other nodes of a cluster reach this one, e.g. http://10.0.0.5:8443
    /// [default: this listener's scheme, host and port, when the host is not a wildcard]
    #[arg(long, global = true, value_name = "URL")]
    pub advertise_url: Option<String>,
    /// How long a node's hold on a thread lasts without renewal; a dead node's threads
    /// move to another node after it [default: 10s]
    #[arg(long, global = true, value_name = "DUR")]
    pub lease_ttl: Option<String>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LogFormatArg {
    Text,
    Json,
}

/// The agents `init` sets up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum InitAgent {
    /// The built-in deterministic agent (always set up).
    Demo,
    /// Claude Code, through `@agentclientprotocol/claude-agent-acp`.
    ClaudeCode,
    /// Codex, through `@agentclientprotocol/codex-acp`.
    Codex,
    /// Gemini CLI (`@google/gemini-cli --acp`; its recipe is not tested here).
    Gemini,
}

#[derive(Debug, Default, clap::Args)]
pub struct InitArgs {
    /// Agents to set up besides `demo`; repeatable [default: asked on a terminal, else
    /// only demo]
    #[arg(long = "agent", value_enum, value_name = "AGENT")]
    pub agents: Vec<InitAgent>,
    /// Ask nothing: the flags and the defaults
    #[arg(long)]
    pub yes: bool,
    /// Write over an existing configuration file
    #[arg(long)]
    pub force: bool,
    /// Where the adapters are installed with npm, outside $HOME and the data directory
    /// [default: /opt/agui-serve/tools as root]
    #[arg(long, value_name = "DIR")]
    pub tools_dir: Option<PathBuf>,
    /// Claude Code's model API
    #[arg(long, value_name = "URL", default_value = "https://api.anthropic.com")]
    pub anthropic_url: String,
    /// File holding the Anthropic API key [default: $ANTHROPIC_API_KEY, written to
    /// anthropic.key beside the configuration]
    #[arg(long, value_name = "FILE")]
    pub anthropic_key_file: Option<PathBuf>,
    /// Codex's model API (the Responses API's base)
    #[arg(long, value_name = "URL", default_value = "https://api.openai.com/v1")]
    pub openai_url: String,
    /// File holding the OpenAI API key [default: $OPENAI_API_KEY, written to openai.key
    /// beside the configuration]
    #[arg(long, value_name = "FILE")]
    pub openai_key_file: Option<PathBuf>,
    /// Codex's model
    #[arg(long, value_name = "MODEL", default_value = "gpt-5.5")]
    pub codex_model: String,
    /// Gemini CLI's model API
    #[arg(
        long,
        value_name = "URL",
        default_value = "https://generativelanguage.googleapis.com"
    )]
    pub gemini_url: String,
    /// File holding the Gemini API key [default: $GEMINI_API_KEY, written to gemini.key
    /// beside the configuration]
    #[arg(long, value_name = "FILE")]
    pub gemini_key_file: Option<PathBuf>,
}

//! The `agui-serve` binary: parse the command line, set up logging, run. Exit codes: 0 clean
//! shutdown, 2 bad configuration or arguments, 1 anything else.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use agui_serve::cli::{Cli, Command};
use agui_serve::config::{Auth, TokenSource};
use agui_serve::logging;
use agui_serve::{Server, config::Config};
use clap::Parser;
use sd_notify::NotifyState;

/// jemalloc: less resident memory per open stream and less CPU per event than the system
/// allocator (see docs/benchmark.md). Its options are built in from
/// `.cargo/config.toml`.
#[cfg(not(feature = "system-alloc"))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    // The launcher of a confined agent (see `confine`): before anything else, so the agent
    // starts from a process that has done nothing.
    // Likewise its port forwarder, inside the agent's network namespace.
    let mut args = std::env::args_os().skip(1);
    let first = args.next();
    if first
        .as_ref()
        .is_some_and(|a| a == agui_serve::confine::LAUNCH)
    {
        let why = agui_serve::confine::launch(args.collect());
        eprintln!("agui-serve: {why}");
        return ExitCode::from(126);
    }
    if first
        .as_ref()
        .is_some_and(|a| a == agui_serve::confine::forward::FORWARD)
    {
        let why = agui_serve::confine::forward::serve(args.collect());
        eprintln!("agui-serve: {why}");
        return ExitCode::from(126);
    }
    let cli = Cli::parse();
    let env = |name: &str| std::env::var(name).ok();
    if let Some(Command::Init(init)) = &cli.command {
        return match agui_serve::cli::init::run(&cli.args, init, &env) {
            Ok(done) => {
                for warning in &done.warnings {
                    eprintln!("agui-serve: warning: {warning}");
                }
                println!("wrote {}", done.config.display());
                println!("start: agui-serve --config {}", done.config.display());
                println!("url: {}", done.url);
                println!("token: {}", done.token);
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("agui-serve init: {error}");
                ExitCode::from(2)
            }
        };
    }
    let resolved = match cli.args.resolve(&env) {
        Ok(resolved) => resolved,
        Err(error) => {
            eprintln!("agui-serve: {error}");
            return ExitCode::from(2);
        }
    };
    if let Some(Command::CheckConfig) = cli.command {
        let (report, warnings) = resolved.report();
        for warning in &warnings {
            eprintln!("agui-serve: warning: {warning}");
        }
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(error) => {
                eprintln!("agui-serve: cannot print the configuration: {error}");
                return ExitCode::from(1);
            }
        }
        return ExitCode::SUCCESS;
    }
    // The token is scrubbed from every log line, whichever crate writes it.
    let _token = match &resolved.config.auth {
        Auth::Token(token) => Some(logging::register(token.expose())),
        Auth::Misconfigured => None,
    };
    logging::init(resolved.config.log_format, std::io::stderr().is_terminal());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("agui-serve: cannot start the async runtime: {error}");
            return ExitCode::from(1);
        }
    };
    runtime.block_on(run(resolved.config, resolved.token_source))
}

async fn run(config: Config, token_source: TokenSource) -> ExitCode {
    let generated = match (&config.auth, token_source) {
        (Auth::Token(token), TokenSource::Generated) => Some(token.expose().to_owned()),
        _ => None,
    };
    let server = match Server::bind(config).await {
        Ok(server) => server,
        Err(error) => {
            eprintln!("agui-serve: {error}");
            tracing::error!(%error, "startup failed");
            return ExitCode::from(1);
        }
    };
    // Signal handlers are installed before readiness is announced: a SIGTERM that follows
    // READY=1 at once must start the graceful shutdown, not kill the process.
    let signals = ShutdownSignals::install();
    let url = server.url();
    tracing::info!(url = %url, "listening");
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "agui-serve listening on {url}");
    if let Some(token) = generated {
        // The only place a token is ever printed: one the operator could not know.
        let _ = writeln!(stdout, "token: {token}");
    }
    let _ = stdout.flush();
    drop(stdout);
    // Under systemd (Type=notify) say when we are listening and when we start stopping;
    // without NOTIFY_SOCKET these do nothing.
    let status = format!("listening on {url}");
    if let Err(error) = sd_notify::notify(&[NotifyState::Ready, NotifyState::Status(&status)]) {
        tracing::warn!(%error, "systemd notification failed");
    }
    server
        .run(async {
            signals.recv().await;
            if let Err(error) = sd_notify::notify(&[NotifyState::Stopping]) {
                tracing::warn!(%error, "systemd notification failed");
            }
        })
        .await;
    ExitCode::SUCCESS
}

/// SIGTERM and SIGINT, listened for from the moment they are installed.
struct ShutdownSignals {
    term: Option<tokio::signal::unix::Signal>,
    int: Option<tokio::signal::unix::Signal>,
}

impl ShutdownSignals {
    fn install() -> ShutdownSignals {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate())
            .map_err(|error| tracing::error!(%error, "cannot listen for SIGTERM"))
            .ok();
        let int = signal(SignalKind::interrupt())
            .map_err(|error| tracing::error!(%error, "cannot listen for SIGINT"))
            .ok();
        ShutdownSignals { term, int }
    }

    /// Resolves at the first SIGTERM or SIGINT.
    async fn recv(mut self) {
        async fn next(signal: &mut Option<tokio::signal::unix::Signal>) {
            match signal {
                Some(signal) => {
                    signal.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            () = next(&mut self.term) => tracing::info!("SIGTERM received"),
            () = next(&mut self.int) => tracing::info!("SIGINT received"),
        }
    }
}

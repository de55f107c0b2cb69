//! Command line and config file: clap and TOML types stop here and become a validated
//! [`Config`](crate::config::Config).
//!
//! Precedence for every setting: flag > config file > environment > default. For the token:
//! `--token` > `--token-file` > `server.token_file` in the file > `AGUI_TOKEN` > generated. An
//! explicitly given but empty source is an error, never a fall-through.
//!
//! In reading order: `flags` (what the command line says) and `file` (what the file
//! says); then `resolve` (the `[server]` settings and the whole `Config`), with `token`,
//! `agents`, `access`, `cluster`, `ui` and `webhooks` for their parts; `report` is `check-config`'s
//! output. `init` writes a configuration (the `init` command).

mod access;
mod agents;
mod cluster;
mod file;
mod flags;
pub mod init;
mod report;
mod resolve;
mod token;
mod ui;
mod webhooks;

pub use flags::{Cli, Command, LogFormatArg, ServeArgs};
pub use resolve::Resolved;

#[cfg(test)]
mod tests;

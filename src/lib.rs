//! agui-serve: puts agent runtimes behind the AG-UI protocol.
//!
//! # Layout
//!
//! Modules in reading order:
//! - [`protocol`]: AG-UI wire types, request decoding, SSE framing, negotiation. No I/O.
//! - [`config`] / [`cli`]: typed configuration; clap and TOML stop at `cli`.
//! - [`budget`]: what a run, a thread and a principal's day may spend, and what was spent.
//! - [`access`]: principals, capabilities, scoped tokens (JWT), thread namespaces.
//! - [`confine`]: what an agent process may read, write and connect to (Landlock, `bwrap`),
//!   and the launcher that confines it.
//! - [`workspace`]: each thread's working directory on disk (an empty, template or git
//!   source), its files as the workspace routes serve them, what a turn changed.
//! - [`agent`]: the backend seam ([`agent::Agent`]) and the built-in demo agent.
//! - [`runtime`]: runs, threads, the replay journal, admission and shutdown.
//! - [`store`]: durable threads, transcripts and runs: embedded SQLite on its own thread,
//!   or PostgreSQL shared by a cluster's nodes (writes fenced by thread leases).
//! - [`cluster`]: several nodes on one PostgreSQL database: node registry, thread leases.
//! - [`webhooks`]: signed events about runs and threads, POSTed to the configured endpoints
//!   from a durable outbox in the store.
//! - [`http`]: the only code that knows hyper: listener, TLS, routes, policy, errors.
//! - [`logging`]: the subscriber, and the writer that scrubs registered secrets.
//! - [`metrics`]: the Prometheus registry and the typed handles the other layers update.
//! - [`traces`]: OpenTelemetry spans per request, run, turn and tool call, exported over
//!   OTLP/HTTP when an endpoint is configured.
//!
//! [`serve`] ties them together: bind, serve until a shutdown future resolves, drain.

#![forbid(unsafe_code)]

pub mod access;
pub mod agent;
pub mod budget;
pub mod cli;
mod clock;
pub mod cluster;
pub mod config;
pub mod confine;
pub mod egress;
mod hex;
pub mod http;
pub mod logging;
pub mod metrics;
pub mod protocol;
pub mod runtime;
mod server;
pub mod store;
mod sync;
pub mod traces;
pub mod uploads;
pub mod webhooks;
pub mod workspace;

pub use server::{Server, serve};

//! What the backend last learned about its agent: whether it starts, whether it wants
//! credentials, whether it keeps dying. `/readyz` reads it as a yes or no, `GET
//! {path}/agents` as an [`AgentStatus`].
//!
//! Learned from real runs, and from a probe (spawn, `session/new`, `session/close`) that
//! `/readyz` starts at most every [`PROBE_EVERY`] while the agent is not ready, so a
//! daemon taken out of rotation finds out by itself when the credentials arrive. Details
//! are plain words of our own, never the agent's error text (which may quote secrets).
//! An `AUTH_REQUIRED` answer is noted here and becomes the run's error, with advice. When
//! it was `session/prompt` that was refused (agents that take sessions without
//! credentials and refuse only the prompt), a session that works proves nothing: the
//! agent stays not ready until a prompt succeeds, and the probe (which never prompts: a
//! prompt costs the operator a model call) does not clear it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::ErrorCode;
use agent_client_protocol::v1::schema::{CloseSessionRequest, NewSessionRequest};
use tokio::time::Instant;

use super::Inner;
use super::launch::PoolKey;
use super::process::AcpProcess;
use crate::agent::{AgentError, AgentState, AgentStatus, AuthMethod, Breaches};
use crate::sync::lock;

/// Exits within [`CRASH_WINDOW`] that make a crash loop.
const CRASH_LIMIT: usize = 3;
const CRASH_WINDOW: Duration = Duration::from_secs(60);
/// How often `/readyz` may probe an agent that is not ready.
pub(super) const PROBE_EVERY: Duration = Duration::from_secs(2);

#[derive(Default)]
pub(super) struct Health {
    known: Mutex<Known>,
}

#[derive(Default)]
struct Known {
    last: Last,
    /// The limits its processes hit.
    breaches: Breaches,
    /// When the agent's processes exited in the middle of a turn (the recent ones).
    exits: VecDeque<Instant>,
    probed: Option<Instant>,
}

#[derive(Default)]
enum Last {
    /// Nothing wrong known (never started yet, or the last attempt worked).
    #[default]
    Fine,
    SpawnFailed,
    /// Refused for credentials (`at_prompt`: at `session/prompt`, after its session was
    /// made).
    AuthRequired {
        methods: Vec<AuthMethod>,
        at_prompt: bool,
    },
}

impl Health {
    /// The process did not start or did not initialize.
    pub(super) fn spawn_failed(&self) {
        lock(&self.known).last = Last::SpawnFailed;
    }

    /// The agent answered `AUTH_REQUIRED` (`at_prompt`: to `session/prompt`); `methods`
    /// are those it advertised.
    pub(super) fn auth_required(&self, methods: Vec<AuthMethod>, at_prompt: bool) {
        lock(&self.known).last = Last::AuthRequired { methods, at_prompt };
    }

    /// A session was created or restored: the agent is fine unless it was its prompts
    /// that were refused.
    pub(super) fn session_ok(&self) {
        let mut known = lock(&self.known);
        if !matches!(
            known.last,
            Last::AuthRequired {
                at_prompt: true,
                ..
            }
        ) {
            known.last = Last::Fine;
        }
    }

    /// A turn ended normally: the agent works, whatever it did before.
    pub(super) fn turn_ok(&self) {
        let mut known = lock(&self.known);
        known.last = Last::Fine;
        known.exits.clear();
    }

    /// A process hit a limit: `count` picks which.
    pub(super) fn breached(&self, count: fn(&mut Breaches) -> &mut u64) {
        *count(&mut lock(&self.known).breaches) += 1;
    }

    /// A process exited in the middle of a turn (killed at its memory limit, maybe).
    pub(super) fn exited(&self, process: &AcpProcess) {
        if process.killed_at_memory_limit() {
            self.breached(|b| &mut b.memory);
        }
        let mut known = lock(&self.known);
        known.exits.push_back(Instant::now());
        while known.exits.len() > CRASH_LIMIT {
            known.exits.pop_front();
        }
    }

    pub(super) fn status(&self, command_found: bool) -> AgentStatus {
        let mut status = self.state(command_found);
        status.breaches = lock(&self.known).breaches;
        status
    }

    fn state(&self, command_found: bool) -> AgentStatus {
        let known = lock(&self.known);
        if !command_found {
            return AgentStatus::new(
                AgentState::Unavailable,
                "the agent's command was not found; check its `command`",
            );
        }
        match &known.last {
            Last::SpawnFailed => AgentStatus::new(
                AgentState::Unavailable,
                "the agent process did not start or did not initialize; the daemon's log says why",
            ),
            Last::AuthRequired { methods, .. } => {
                let mut status = AgentStatus::new(AgentState::AuthRequired, &auth_advice(methods));
                status.auth_methods = methods.clone();
                status
            }
            Last::Fine if crash_loop(&known.exits) => AgentStatus::new(
                AgentState::CrashLoop,
                &format!(
                    "the agent process exited {CRASH_LIMIT} times within {} s; the daemon's log \
                     and the RUN_ERROR messages carry its last words",
                    CRASH_WINDOW.as_secs()
                ),
            ),
            Last::Fine => AgentStatus::ready(),
        }
    }

    /// Whether a probe should start now (the agent is not ready, a probe can tell when it
    /// is again, and the last probe is at least [`PROBE_EVERY`] old); if so, counts it as
    /// started.
    pub(super) fn probe_due(&self, command_found: bool) -> bool {
        let mut known = lock(&self.known);
        let unready = !matches!(known.last, Last::Fine) || crash_loop(&known.exits);
        let provable = !matches!(
            known.last,
            Last::AuthRequired {
                at_prompt: true,
                ..
            }
        );
        if !command_found || !unready || !provable {
            return false;
        }
        let now = Instant::now();
        if known.probed.is_some_and(|at| now - at < PROBE_EVERY) {
            return false;
        }
        known.probed = Some(now);
        true
    }
}

impl Inner {
    /// Notes `AUTH_REQUIRED` from `process` (`at_prompt`: to `session/prompt`) and says
    /// what to do about it.
    pub(super) fn auth_required(
        &self,
        process: &AcpProcess,
        agent_message: &str,
        at_prompt: bool,
    ) -> AgentError {
        let methods = auth_methods(process);
        let advice = auth_advice(&methods);
        self.health.auth_required(methods, at_prompt);
        AgentError::Failed {
            code: "AUTH_REQUIRED".to_owned(),
            message: format!(
                "agent {} needs authentication ({agent_message}): {advice}",
                self.name
            ),
        }
    }

    /// Finds out whether the agent works now: a process, a session, closed again. Started
    /// by `/readyz` while the agent is not ready; what it learns updates `health`.
    pub(super) async fn probe(self: Arc<Self>) {
        let operator = PoolKey {
            principal: String::new(),
            thread: None,
        };
        let Ok(busy) = self.acquire(&operator).await else {
            return;
        };
        let process = busy.0.clone();
        let new = NewSessionRequest::new(self.shared_dir());
        match process.connection.send_request(new).block_task().await {
            Ok(created) => {
                self.health.session_ok();
                tracing::info!(agent = %self.name, "readiness probe: the agent takes sessions again");
                if process.capabilities().session_capabilities.close.is_some() {
                    let close = CloseSessionRequest::new(created.session_id);
                    let _ = process.connection.send_request(close).block_task().await;
                }
            }
            Err(error) if error.code == ErrorCode::AUTH_REQUIRED => {
                self.health.auth_required(auth_methods(&process), false);
            }
            Err(error) => {
                tracing::debug!(agent = %self.name, error = %error.message, "readiness probe: session/new failed");
            }
        }
    }
}

/// The auth methods the agent advertised in its `initialize` answer.
fn auth_methods(process: &AcpProcess) -> Vec<AuthMethod> {
    process
        .auth_methods()
        .iter()
        .map(|m| AuthMethod {
            id: m.id().to_string(),
            name: m.name().to_owned(),
            description: m.description().map(str::to_owned),
        })
        .collect()
}

/// What to do about `AUTH_REQUIRED`, naming the agent's methods.
fn auth_advice(methods: &[AuthMethod]) -> String {
    let named: Vec<String> = methods
        .iter()
        .map(|m| match &m.description {
            Some(description) => format!("{} ({}: {description})", m.id, m.name),
            None => format!("{} ({})", m.id, m.name),
        })
        .collect();
    if named.is_empty() {
        "the agent needs credentials: give them to it (its environment, or a login on the \
         daemon's machine), then retry"
            .to_owned()
    } else {
        format!(
            "the agent needs credentials; it offers: {}. Set one up for the daemon's user \
             (the agent's `env` in the configuration, or its own login), then retry",
            named.join("; ")
        )
    }
}

fn crash_loop(exits: &VecDeque<Instant>) -> bool {
    let now = Instant::now();
    exits.len() >= CRASH_LIMIT && exits.iter().all(|at| now - *at < CRASH_WINDOW)
}

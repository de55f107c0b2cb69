//! Why a request about a run was refused, and why a run was cancelled.

use crate::access::Capability;
use crate::cluster::Owner;
use crate::protocol::InputError;

/// Why a run request was refused before any stream started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    /// No agent of this name, or not one the principal may use (either way the same
    /// answer: a name it may not use is not shown to exist).
    #[error("no agent named {0:?}")]
    UnknownAgent(String),
    #[error("the server is draining")]
    Draining,
    #[error("too many concurrent runs")]
    OverCapacity,
    /// New input while a run produces (its run id), refused.
    #[error("a run is in progress on this thread")]
    RunInProgress(String),
    /// The thread belongs to another agent (named, unless the principal may not use it).
    #[error("thread belongs to another agent")]
    AgentMismatch(Option<String>),
    #[error("run id is already live on another thread")]
    RunIdInUse,
    #[error("store unavailable")]
    Store,
    #[error("the principal holds its most concurrent runs")]
    PrincipalBusy,
    #[error("the token lacks the `{}` capability", .0.name())]
    Forbidden(Capability),
    /// Another node owns the thread (cluster): the request belongs there.
    #[error("another node owns the thread")]
    Elsewhere(Owner),
    /// A new message holds what the agent cannot take (see
    /// [`crate::agent::Agent::check_new_messages`]).
    #[error("{}", .0.message)]
    Input(InputError),
    /// The thread's queue holds its most items.
    #[error("the thread's queue is full")]
    QueueFull,
    /// The memory budget has no room for a queued input of this many bytes.
    #[error("the memory budget has no room for {0} more bytes of queued input")]
    QueueMemory(usize),
    /// The principal's daily budget is spent (why).
    #[error("{0}")]
    BudgetExceeded(String),
    /// The rewind a client-owned history asked for failed (why); nothing ran.
    #[error("{0}")]
    Rewind(String),
}

impl StartError {
    /// Every [`StartError::reason`].
    pub const REASONS: [&'static str; 15] = [
        "unknown_agent",
        "draining",
        "over_capacity",
        "run_in_progress",
        "agent_mismatch",
        "run_id_in_use",
        "store_unavailable",
        "principal_busy",
        "forbidden",
        "elsewhere",
        "invalid_input",
        "queue_full",
        "queue_memory",
        "budget_exceeded",
        "rewind_failed",
    ];

    /// A stable snake_case word for the metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            StartError::UnknownAgent(_) => "unknown_agent",
            StartError::Draining => "draining",
            StartError::OverCapacity => "over_capacity",
            StartError::RunInProgress(_) => "run_in_progress",
            StartError::AgentMismatch(_) => "agent_mismatch",
            StartError::RunIdInUse => "run_id_in_use",
            StartError::Store => "store_unavailable",
            StartError::PrincipalBusy => "principal_busy",
            StartError::Forbidden(_) => "forbidden",
            StartError::Elsewhere(_) => "elsewhere",
            StartError::Input(_) => "invalid_input",
            StartError::QueueFull => "queue_full",
            StartError::QueueMemory(_) => "queue_memory",
            StartError::BudgetExceeded(_) => "budget_exceeded",
            StartError::Rewind(_) => "rewind_failed",
        }
    }
}

/// Why a reattach was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReattachError {
    #[error("no such thread")]
    UnknownThread,
    #[error("store unavailable")]
    Store,
    /// Another node owns the thread (cluster).
    #[error("another node owns the thread")]
    Elsewhere(Owner),
}

/// Why a run was cancelled; decides its terminal event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelReason {
    /// `POST {path}/runs/{id}/cancel` or a thread delete.
    Requested,
    /// Nobody was attached for the disconnect grace.
    Abandoned,
    /// The server is shutting down.
    Shutdown,
    /// Another node took the thread's lease (cluster).
    LeaseLost,
    /// A budget was spent and not extended.
    Budget,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::Capability;
    use crate::cluster::Owner;

    /// One error of each kind. The match below has no wildcard: a kind added to
    /// `StartError` does not compile here until it is named in it, beside this list, and
    /// the test then checks its reason against `REASONS`.
    fn one_of_each() -> Vec<StartError> {
        let owner = Owner {
            node: "n".to_owned(),
            address: "http://127.0.0.1:1".to_owned(),
            cert: None,
            expires_in: std::time::Duration::ZERO,
        };
        let all = vec![
            StartError::UnknownAgent("a".to_owned()),
            StartError::Draining,
            StartError::OverCapacity,
            StartError::RunInProgress("r".to_owned()),
            StartError::AgentMismatch(None),
            StartError::RunIdInUse,
            StartError::Store,
            StartError::PrincipalBusy,
            StartError::Forbidden(Capability::Run),
            StartError::Elsewhere(owner),
            StartError::Input(InputError {
                field: None,
                message: "m".to_owned(),
            }),
            StartError::QueueFull,
            StartError::QueueMemory(1),
            StartError::BudgetExceeded("b".to_owned()),
            StartError::Rewind("w".to_owned()),
        ];
        for error in &all {
            match error {
                StartError::UnknownAgent(_)
                | StartError::Draining
                | StartError::OverCapacity
                | StartError::RunInProgress(_)
                | StartError::AgentMismatch(_)
                | StartError::RunIdInUse
                | StartError::Store
                | StartError::PrincipalBusy
                | StartError::Forbidden(_)
                | StartError::Elsewhere(_)
                | StartError::Input(_)
                | StartError::QueueFull
                | StartError::QueueMemory(_)
                | StartError::BudgetExceeded(_)
                | StartError::Rewind(_) => {}
            }
        }
        all
    }

    #[test]
    fn reasons_are_exactly_the_reasons_of_every_kind() {
        let mut given: Vec<&str> = one_of_each().iter().map(StartError::reason).collect();
        let mut listed = StartError::REASONS.to_vec();
        given.sort_unstable();
        listed.sort_unstable();
        assert_eq!(given, listed);
    }
}

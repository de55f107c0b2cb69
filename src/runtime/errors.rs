//! Why a request about a run was refused, and why a run was cancelled.

use crate::access::Capability;
use crate::cluster::Owner;

/// Why a run request was refused before any stream started.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StartError {
    #[error("unknown agent")]
    UnknownAgent,
    #[error("the server is draining")]
    Draining,
    #[error("too many concurrent runs")]
    OverCapacity,
    #[error("a run is in progress on this thread")]
    RunInProgress,
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
}

impl StartError {
    /// Every [`StartError::reason`].
    pub const REASONS: [&'static str; 10] = [
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
    ];

    /// A stable snake_case word for the metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            StartError::UnknownAgent => "unknown_agent",
            StartError::Draining => "draining",
            StartError::OverCapacity => "over_capacity",
            StartError::RunInProgress => "run_in_progress",
            StartError::AgentMismatch(_) => "agent_mismatch",
            StartError::RunIdInUse => "run_id_in_use",
            StartError::Store => "store_unavailable",
            StartError::PrincipalBusy => "principal_busy",
            StartError::Forbidden(_) => "forbidden",
            StartError::Elsewhere(_) => "elsewhere",
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
}

//! Routes what an ACP agent process sends about its sessions (`session/update`,
//! `session/request_permission`, `elicitation/create`, and the calls its MCP endpoint gets)
//! into per-session channels, read by each session's turn; a subagent's session to its
//! parent's. Updates that come between turns are held for the next one.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use agent_client_protocol::UntypedMessage;
use agent_client_protocol::v1::schema::{
    CreateElicitationRequest, CreateElicitationResponse, ElicitationAction, ElicitationScope,
    RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse,
};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::sync::lock;

/// A permission request's answer slot.
pub(super) type PermissionResponder =
    agent_client_protocol::v1::Responder<RequestPermissionResponse>;
/// An elicitation request's answer slot.
pub(super) type ElicitationResponder =
    agent_client_protocol::v1::Responder<CreateElicitationResponse>;

/// Something the agent sent about one session.
pub(super) enum SessionEvent {
    /// The `update` of a `session/update` notification, as JSON (see the module doc), and
    /// the subagent session it is about (`None`: the session itself).
    Update {
        subagent: Option<String>,
        update: Value,
    },
    /// A `session/request_permission` request and where to answer it.
    Permission(Box<RequestPermissionRequest>, Box<PermissionResponder>),
    /// An `elicitation/create` request (form or URL) and where to answer it.
    Elicitation(Box<CreateElicitationRequest>, Box<ElicitationResponder>),
    /// A `tools/call` on the session's MCP endpoint for a frontend tool.
    FrontendCall {
        name: String,
        arguments: String,
        reply: oneshot::Sender<crate::agent::ToolAnswer>,
    },
    /// An `emit_ui` call on the session's MCP endpoint: a component to show.
    ShowUi {
        component: String,
        props: serde_json::Value,
        reply: oneshot::Sender<Result<(), String>>,
    },
}

/// Routes agent messages to sessions.
#[derive(Default)]
pub(super) struct Router {
    sessions: Mutex<HashMap<String, mpsc::UnboundedSender<SessionEvent>>>,
    /// subagent session id -> the session that announced it.
    parents: Mutex<HashMap<String, String>>,
    /// Updates that came between turns (a session title the agent makes after the turn,
    /// its commands, usage), by session: the session's next turn shows them first.
    held: Mutex<HashMap<String, VecDeque<Value>>>,
}

/// Updates kept per session between turns; older ones beyond it are let go.
const HELD_UPDATES: usize = 64;

impl Router {
    /// Listens to `session` (a `session/load` replay, an import).
    pub(super) fn register(&self, session: &str) -> mpsc::UnboundedReceiver<SessionEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        lock(&self.sessions).insert(session.to_owned(), tx);
        rx
    }

    /// Listens to `session` for a turn: the updates held since its last turn come first.
    pub(super) fn register_turn(&self, session: &str) -> mpsc::UnboundedReceiver<SessionEvent> {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut sessions = lock(&self.sessions);
        for update in lock(&self.held).remove(session).unwrap_or_default() {
            let _ = tx.send(SessionEvent::Update {
                subagent: None,
                update,
            });
        }
        sessions.insert(session.to_owned(), tx);
        rx
    }

    /// Lets go of what is held for `session` (it was closed).
    pub(super) fn forget(&self, session: &str) {
        lock(&self.held).remove(session);
    }

    /// Hands an event to the session's turn; `false` when no turn is listening.
    pub(super) fn deliver(&self, session: &str, event: SessionEvent) -> bool {
        let target = lock(&self.sessions).get(session).cloned();
        target.is_some_and(|tx| tx.send(event).is_ok())
    }

    /// Whether a turn is listening to `session` now.
    pub(super) fn is_listening(&self, session: &str) -> bool {
        lock(&self.sessions).contains_key(session)
    }

    /// Drops every turn's channel (the process is gone): each turn sees its channel end.
    pub(super) fn close_all(&self) {
        lock(&self.sessions).clear();
    }

    pub(super) fn unregister(&self, session: &str) {
        // A subagent's link to its parent stays: the parent may use it again next turn.
        lock(&self.sessions).remove(session);
    }

    /// The channel of `session`'s turn, or of its parent's when it is a subagent session
    /// (then also the subagent's id).
    fn route(
        &self,
        session: &str,
    ) -> Option<(mpsc::UnboundedSender<SessionEvent>, Option<String>)> {
        if let Some(tx) = lock(&self.sessions).get(session).cloned() {
            return Some((tx, None));
        }
        let parent = lock(&self.parents).get(session).cloned()?;
        let tx = lock(&self.sessions).get(&parent).cloned()?;
        Some((tx, Some(session.to_owned())))
    }

    fn is_known_subagent(&self, session: &str) -> bool {
        lock(&self.parents).contains_key(session)
    }

    pub(super) fn notify(&self, message: UntypedMessage) {
        if message.method != "session/update" {
            tracing::debug!(method = %message.method, "agent notification ignored");
            return;
        }
        let session = message.params["sessionId"].as_str().unwrap_or_default();
        let update = message.params.get("update").cloned().unwrap_or(Value::Null);
        // A subagent is announced on its parent before any of its own traffic.
        if update["sessionUpdate"] == "subagent_update"
            && let Some(child) = update["sessionId"].as_str()
            && lock(&self.sessions).contains_key(session)
        {
            lock(&self.parents).insert(child.to_owned(), session.to_owned());
        }
        match self.route(session) {
            Some((tx, subagent)) => {
                let _ = tx.send(SessionEvent::Update { subagent, update });
            }
            None if self.is_known_subagent(session) => {
                tracing::debug!(session, "update for a subagent with no turn dropped");
            }
            None => {
                let mut held = lock(&self.held);
                let queue = held.entry(session.to_owned()).or_default();
                if queue.len() == HELD_UPDATES {
                    queue.pop_front();
                }
                queue.push_back(update);
            }
        }
    }

    pub(super) fn permission(
        &self,
        request: RequestPermissionRequest,
        responder: PermissionResponder,
    ) {
        let session = request.session_id.to_string();
        let event = SessionEvent::Permission(Box::new(request), Box::new(responder));
        let undelivered = match self.route(&session) {
            Some((tx, _)) => tx.send(event).err().map(|e| e.0),
            None => Some(event),
        };
        if let Some(SessionEvent::Permission(_, responder)) = undelivered {
            let _ = responder.respond(cancelled());
        }
    }

    pub(super) fn elicitation(
        &self,
        request: CreateElicitationRequest,
        responder: ElicitationResponder,
    ) {
        // A request-scoped elicitation belongs to a JSON-RPC request of ours, none of which
        // waits on a person: only session-scoped ones can be asked.
        let session = match request.scope() {
            ElicitationScope::Session(scope) => Some(scope.session_id.to_string()),
            _ => None,
        };
        let event = SessionEvent::Elicitation(Box::new(request), Box::new(responder));
        let undelivered = match session.and_then(|s| self.route(&s)) {
            Some((tx, _)) => tx.send(event).err().map(|e| e.0),
            None => Some(event),
        };
        if let Some(SessionEvent::Elicitation(_, responder)) = undelivered {
            let _ = responder.respond(CreateElicitationResponse::new(ElicitationAction::Cancel));
        }
    }
}

/// The "cancelled" permission outcome.
pub(super) fn cancelled() -> RequestPermissionResponse {
    RequestPermissionResponse::new(RequestPermissionOutcome::Cancelled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cancelled_outcome_is_the_protocol_s() {
        let value = serde_json::to_value(cancelled()).expect("serializes");
        assert_eq!(
            value,
            serde_json::json!({"outcome": {"outcome": "cancelled"}})
        );
    }
}

//! The route table: what a path under the namespace names, which methods it answers,
//! what it asks of the principal, whether a cluster may forward it, and its names for the
//! audit line, the metrics and spans.

use http::Method;
use percent_encoding::percent_decode_str;

use super::common::Audit;
use super::workspace::WorkspaceRoute;
use crate::access::Capability;
use crate::protocol::InputError;
use crate::protocol::input::check_id;

/// A matched route (method not yet checked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Route {
    Run(String),
    Info,
    Agents,
    Healthz,
    Readyz,
    Threads,
    Thread(String),
    ThreadMessages(String),
    ThreadStream(String),
    Cancel(String),
    /// CopilotKit's runtime protocol (see `copilotkit`).
    Envelope,
    AgentRun(String),
    AgentConnect(String),
    AgentStop(String, String),
    Metrics,
    Tokens,
    /// An agent's own sessions (`session/list`).
    AgentSessions(String),
    /// Import one of them as a thread: agent, session id.
    ImportSession(String, String),
    /// Fork a thread into a new one.
    ForkThread(String),
    /// Take a thread back to one of its messages.
    RewindThread(String),
    /// Archive a thread (CopilotKit's thread mutation).
    ArchiveThread(String),
    /// Start a run on a thread with no stream attached.
    ThreadRuns(String),
    /// A thread's queue of input waiting for runs of its own.
    ThreadQueue(String),
    /// One item of it: thread id, item id.
    QueueItem(String, String),
    /// A thread's workspace: a listing, a file, or what changed.
    Workspace(String, WorkspaceRoute),
    /// The ambient plane: the fleet document and its changes.
    FleetStream,
    /// The operator console's page (`None`) or one of its files.
    Console(Option<String>),
    /// A new upload.
    Uploads,
    /// One upload.
    Upload(String),
    /// The webhook outbox by endpoint.
    Webhooks,
    /// The webhook outbox's rows.
    WebhookDeliveries,
    /// The principal's schedules: list, create.
    Schedules,
    /// One schedule: read, delete.
    Schedule(String),
}

/// What a route asks of the principal beyond a valid token.
pub(super) enum Need {
    /// Nothing more (the runtime decides what a run request needs).
    Nothing,
    /// The master token.
    Operator,
    Capability(Capability),
}

impl Route {
    pub(super) fn parse(namespace: &str, path: &str) -> Option<Route> {
        let rest = path.strip_prefix(namespace)?;
        if rest.is_empty() || rest == "/" {
            return Some(Route::Envelope);
        }
        let rest = rest.strip_prefix('/')?;
        let segments: Vec<String> = rest
            .split('/')
            .map(|s| percent_decode_str(s).decode_utf8_lossy().into_owned())
            .collect();
        let segs: Vec<&str> = segments.iter().map(String::as_str).collect();
        let route = match segs.as_slice() {
            ["info"] => Route::Info,
            ["agents"] => Route::Agents,
            ["healthz"] => Route::Healthz,
            ["readyz"] => Route::Readyz,
            ["metrics"] => Route::Metrics,
            ["tokens"] => Route::Tokens,
            ["fleet", "stream"] => Route::FleetStream,
            ["console"] => Route::Console(None),
            ["console", file] if !file.is_empty() => Route::Console(Some((*file).to_owned())),
            ["uploads"] => Route::Uploads,
            ["uploads", id] if !id.is_empty() => Route::Upload((*id).to_owned()),
            ["webhooks"] => Route::Webhooks,
            ["webhooks", "deliveries"] => Route::WebhookDeliveries,
            ["schedules"] => Route::Schedules,
            ["schedules", id] if !id.is_empty() => Route::Schedule((*id).to_owned()),
            ["threads"] => Route::Threads,
            ["threads", id] if !id.is_empty() => Route::Thread((*id).to_owned()),
            ["threads", id, "messages"] if !id.is_empty() => {
                Route::ThreadMessages((*id).to_owned())
            }
            ["threads", id, "stream"] if !id.is_empty() => Route::ThreadStream((*id).to_owned()),
            ["threads", id, "fork"] if !id.is_empty() => Route::ForkThread((*id).to_owned()),
            ["threads", id, "rewind"] if !id.is_empty() => Route::RewindThread((*id).to_owned()),
            ["threads", id, "runs"] if !id.is_empty() => Route::ThreadRuns((*id).to_owned()),
            ["threads", id, "archive"] if !id.is_empty() => Route::ArchiveThread((*id).to_owned()),
            ["threads", id, "queue"] if !id.is_empty() => Route::ThreadQueue((*id).to_owned()),
            ["threads", id, "queue", item] if !id.is_empty() && !item.is_empty() => {
                Route::QueueItem((*id).to_owned(), (*item).to_owned())
            }
            ["threads", id, "workspace"] if !id.is_empty() => {
                Route::Workspace((*id).to_owned(), WorkspaceRoute::List)
            }
            ["threads", id, "workspace", "file"] if !id.is_empty() => {
                Route::Workspace((*id).to_owned(), WorkspaceRoute::File)
            }
            ["threads", id, "workspace", "changes"] if !id.is_empty() => {
                Route::Workspace((*id).to_owned(), WorkspaceRoute::Changes)
            }
            ["threads", id, "checkpoints"] if !id.is_empty() => {
                Route::Workspace((*id).to_owned(), WorkspaceRoute::Checkpoints)
            }
            ["agents", agent, "sessions"] if !agent.is_empty() => {
                Route::AgentSessions((*agent).to_owned())
            }
            ["agents", agent, "sessions", session, "import"]
                if !agent.is_empty() && !session.is_empty() =>
            {
                Route::ImportSession((*agent).to_owned(), (*session).to_owned())
            }
            ["runs", id, "cancel"] if !id.is_empty() => Route::Cancel((*id).to_owned()),
            ["agent", agent, "run"] if !agent.is_empty() => Route::AgentRun((*agent).to_owned()),
            ["agent", agent, "connect"] if !agent.is_empty() => {
                Route::AgentConnect((*agent).to_owned())
            }
            ["agent", agent, "stop", thread] if !agent.is_empty() && !thread.is_empty() => {
                Route::AgentStop((*agent).to_owned(), (*thread).to_owned())
            }
            [agent] if !agent.is_empty() => Route::Run((*agent).to_owned()),
            _ => return None,
        };
        Some(route)
    }

    /// Whether the route may concern a thread another cluster node owns (its request is
    /// then read whole first, so it can be sent there).
    pub(super) fn forwardable(&self) -> bool {
        matches!(
            self,
            Route::Run(_)
                | Route::AgentRun(_)
                | Route::AgentConnect(_)
                | Route::AgentStop(..)
                | Route::Envelope
                | Route::Thread(_)
                | Route::ThreadStream(_)
                | Route::Cancel(_)
                | Route::ForkThread(_)
                | Route::RewindThread(_)
                | Route::ArchiveThread(_)
                | Route::ThreadRuns(_)
                | Route::ThreadQueue(_)
                | Route::QueueItem(..)
                | Route::Workspace(..)
        )
    }

    /// The methods this route answers (besides the CORS preflight).
    pub(super) fn allow(&self) -> &'static str {
        match self {
            Route::Run(_)
            | Route::Cancel(_)
            | Route::Envelope
            | Route::AgentRun(_)
            | Route::AgentConnect(_)
            | Route::AgentStop(..)
            | Route::Tokens
            | Route::ImportSession(..)
            | Route::ForkThread(_)
            | Route::RewindThread(_)
            | Route::ArchiveThread(_)
            | Route::ThreadRuns(_)
            | Route::Uploads => "POST, OPTIONS",
            Route::Thread(_) => "GET, PATCH, DELETE, OPTIONS",
            Route::Upload(_) | Route::Schedule(_) => "GET, DELETE, OPTIONS",
            Route::Schedules => "GET, POST, OPTIONS",
            Route::QueueItem(..) => "PATCH, DELETE, OPTIONS",
            Route::Healthz | Route::Readyz | Route::Console(_) => "GET, HEAD, OPTIONS",
            _ => "GET, OPTIONS",
        }
    }

    /// Whether this route answers `method` (the preflight, `OPTIONS`, is answered first).
    pub(super) fn allows(&self, method: &Method) -> bool {
        self.allow()
            .split(", ")
            .any(|allowed| allowed == method.as_str() && allowed != "OPTIONS")
    }

    /// Ids in the path obey the same rules as ids in a body.
    pub(super) fn check_ids(&self) -> Result<(), InputError> {
        match self {
            Route::Thread(id)
            | Route::ThreadMessages(id)
            | Route::ThreadStream(id)
            | Route::ForkThread(id)
            | Route::RewindThread(id)
            | Route::ArchiveThread(id)
            | Route::ThreadRuns(id)
            | Route::ThreadQueue(id)
            | Route::Workspace(id, _) => check_id(id, "threadId"),
            Route::QueueItem(id, item) => {
                check_id(id, "threadId")?;
                check_id(item, "itemId")
            }
            Route::ImportSession(_, session) => check_id(session, "sessionId"),
            Route::Cancel(id) => check_id(id, "runId"),
            Route::Schedule(id) => check_id(id, "scheduleId"),
            Route::AgentStop(_, thread) => check_id(thread, "threadId"),
            _ => Ok(()),
        }
    }

    pub(super) fn authenticated(&self) -> bool {
        // The console's files hold nothing secret; its API calls carry the token.
        !matches!(self, Route::Healthz | Route::Readyz | Route::Console(_))
    }

    /// The route's path under the namespace, parameters named.
    fn template(&self) -> &'static str {
        match self {
            Route::Run(_) => "/{agent}",
            Route::Info => "/info",
            Route::Agents => "/agents",
            Route::Healthz => "/healthz",
            Route::Readyz => "/readyz",
            Route::Threads => "/threads",
            Route::Thread(_) => "/threads/{id}",
            Route::ThreadMessages(_) => "/threads/{id}/messages",
            Route::ThreadStream(_) => "/threads/{id}/stream",
            Route::Cancel(_) => "/runs/{runId}/cancel",
            Route::Envelope => "",
            Route::AgentRun(_) => "/agent/{agent}/run",
            Route::AgentConnect(_) => "/agent/{agent}/connect",
            Route::AgentStop(..) => "/agent/{agent}/stop/{threadId}",
            Route::Metrics => "/metrics",
            Route::Tokens => "/tokens",
            Route::AgentSessions(_) => "/agents/{agent}/sessions",
            Route::ImportSession(..) => "/agents/{agent}/sessions/{sessionId}/import",
            Route::ForkThread(_) => "/threads/{id}/fork",
            Route::RewindThread(_) => "/threads/{id}/rewind",
            Route::ArchiveThread(_) => "/threads/{id}/archive",
            Route::ThreadRuns(_) => "/threads/{id}/runs",
            Route::ThreadQueue(_) => "/threads/{id}/queue",
            Route::QueueItem(..) => "/threads/{id}/queue/{itemId}",
            Route::Workspace(_, WorkspaceRoute::List) => "/threads/{id}/workspace",
            Route::Workspace(_, WorkspaceRoute::File) => "/threads/{id}/workspace/file",
            Route::Workspace(_, WorkspaceRoute::Changes) => "/threads/{id}/workspace/changes",
            Route::Workspace(_, WorkspaceRoute::Checkpoints) => "/threads/{id}/checkpoints",
            Route::FleetStream => "/fleet/stream",
            Route::Console(None) => "/console",
            Route::Console(Some(_)) => "/console/{file}",
            Route::Uploads => "/uploads",
            Route::Upload(_) => "/uploads/{id}",
            Route::Webhooks => "/webhooks",
            Route::WebhookDeliveries => "/webhooks/deliveries",
            Route::Schedules => "/schedules",
            Route::Schedule(_) => "/schedules/{id}",
        }
    }

    /// What the principal needs for this route with `method`.
    pub(super) fn needs(&self, method: &Method) -> Need {
        match self {
            // An agent's sessions belong to no principal: listing or importing them is the
            // operator's (who imports into a principal's namespace with `?owner=`).
            // The outbox names every principal's threads.
            Route::Metrics
            | Route::Tokens
            | Route::AgentSessions(_)
            | Route::ImportSession(..)
            | Route::Webhooks
            | Route::WebhookDeliveries => Need::Operator,
            Route::ForkThread(_)
            | Route::RewindThread(_)
            | Route::ArchiveThread(_)
            | Route::ThreadRuns(_)
            | Route::Uploads => Need::Capability(Capability::Run),
            Route::Thread(_) if method == Method::PATCH => Need::Capability(Capability::Run),
            Route::Upload(_) if method == Method::DELETE => Need::Capability(Capability::Run),
            Route::Upload(_) => Need::Capability(Capability::Read),
            // Creating or deleting a schedule starts or stops runs to come.
            Route::Schedules if method == Method::POST => Need::Capability(Capability::Run),
            Route::Schedule(_) if method == Method::DELETE => Need::Capability(Capability::Run),
            Route::Schedules | Route::Schedule(_) => Need::Capability(Capability::Read),
            Route::Thread(_) if method == Method::DELETE => Need::Capability(Capability::Run),
            Route::Cancel(_) | Route::AgentStop(..) | Route::QueueItem(..) => {
                Need::Capability(Capability::Run)
            }
            Route::Threads
            | Route::Thread(_)
            | Route::ThreadMessages(_)
            | Route::ThreadStream(_)
            | Route::ThreadQueue(_)
            | Route::Workspace(..)
            | Route::AgentConnect(_)
            | Route::FleetStream => Need::Capability(Capability::Read),
            Route::Run(_)
            | Route::AgentRun(_)
            | Route::Envelope
            | Route::Info
            | Route::Agents
            | Route::Healthz
            | Route::Readyz
            | Route::Console(_) => Need::Nothing,
        }
    }

    /// The thread or run the path names, for the audit line.
    pub(super) fn audit(&self, audit: &mut Audit) {
        match self {
            Route::Thread(id)
            | Route::ThreadMessages(id)
            | Route::ThreadStream(id)
            | Route::AgentStop(_, id)
            | Route::ForkThread(id)
            | Route::RewindThread(id)
            | Route::ArchiveThread(id)
            | Route::ThreadRuns(id)
            | Route::ThreadQueue(id)
            | Route::Workspace(id, _) => audit.thread = Some(id.clone()),
            Route::QueueItem(id, item) => {
                audit.thread = Some(id.clone());
                audit.run = Some(item.clone());
            }
            Route::Cancel(id) => audit.run = Some(id.clone()),
            _ => {}
        }
    }

    pub(super) fn name(&self) -> &'static str {
        match self {
            Route::Run(_) => "run",
            Route::Info => "info",
            Route::Agents => "agents",
            Route::Healthz => "healthz",
            Route::Readyz => "readyz",
            Route::Threads => "threads",
            Route::Thread(_) => "thread",
            Route::ThreadMessages(_) => "thread_messages",
            Route::ThreadStream(_) => "thread_stream",
            Route::Cancel(_) => "cancel",
            Route::Envelope => "copilotkit_envelope",
            Route::AgentRun(_) => "copilotkit_run",
            Route::AgentConnect(_) => "copilotkit_connect",
            Route::AgentStop(..) => "copilotkit_stop",
            Route::Metrics => "metrics",
            Route::Tokens => "tokens",
            Route::FleetStream => "fleet_stream",
            Route::Console(_) => "console",
            Route::AgentSessions(_) => "agent_sessions",
            Route::ImportSession(..) => "import_session",
            Route::ForkThread(_) => "fork_thread",
            Route::RewindThread(_) => "rewind_thread",
            Route::ArchiveThread(_) => "archive_thread",
            Route::ThreadRuns(_) => "thread_runs",
            Route::ThreadQueue(_) => "thread_queue",
            Route::QueueItem(..) => "queue_item",
            Route::Workspace(_, WorkspaceRoute::List) => "workspace",
            Route::Workspace(_, WorkspaceRoute::File) => "workspace_file",
            Route::Workspace(_, WorkspaceRoute::Changes) => "workspace_changes",
            Route::Workspace(_, WorkspaceRoute::Checkpoints) => "checkpoints",
            Route::Uploads => "uploads",
            Route::Upload(_) => "upload",
            Route::Webhooks => "webhooks",
            Route::WebhookDeliveries => "webhook_deliveries",
            Route::Schedules => "schedules",
            Route::Schedule(_) => "schedule",
        }
    }
}

/// The template of the route `path` matches under `namespace` (`/agui/threads/{id}`), for
/// a request's span.
pub(crate) fn template(namespace: &str, path: &str) -> Option<String> {
    let route = Route::parse(namespace, path)?;
    let template = format!("{namespace}{}", route.template());
    Some(if template.is_empty() {
        "/".to_owned()
    } else {
        template
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_methods_follow_the_allow_header() {
        let run = Route::Run("demo".into());
        assert!(run.allows(&Method::POST) && !run.allows(&Method::GET));
        let thread = Route::Thread("t".into());
        assert!(thread.allows(&Method::GET) && thread.allows(&Method::DELETE));
        assert!(!thread.allows(&Method::POST));
        assert!(Route::Healthz.allows(&Method::HEAD) && Route::Console(None).allows(&Method::HEAD));
        assert!(!Route::Info.allows(&Method::HEAD) && !Route::Info.allows(&Method::OPTIONS));
        assert!(Route::Schedules.allows(&Method::POST) && Route::Schedules.allows(&Method::GET));
        assert!(!Route::Schedules.allows(&Method::DELETE));
        let one = Route::Schedule("s".into());
        assert!(one.allows(&Method::GET) && one.allows(&Method::DELETE));
        assert!(!one.allows(&Method::POST));
    }

    #[test]
    fn routes_parse() {
        assert_eq!(
            Route::parse("/agui", "/agui/demo"),
            Some(Route::Run("demo".into()))
        );
        assert_eq!(Route::parse("/agui", "/agui/info"), Some(Route::Info));
        assert_eq!(
            Route::parse("/agui", "/agui/threads/a%20b/stream"),
            Some(Route::ThreadStream("a b".into()))
        );
        assert_eq!(
            Route::parse("/agui", "/agui/runs/r1/cancel"),
            Some(Route::Cancel("r1".into()))
        );
        assert_eq!(Route::parse("/agui", "/agui"), Some(Route::Envelope));
        assert_eq!(Route::parse("/agui", "/agui/"), Some(Route::Envelope));
        assert_eq!(Route::parse("", "/"), Some(Route::Envelope));
        assert_eq!(
            Route::parse("/agui", "/agui/agent/demo/stop/t%201"),
            Some(Route::AgentStop("demo".into(), "t 1".into()))
        );
        assert_eq!(Route::parse("/agui", "/agui/agent/demo"), None);
        assert_eq!(Route::parse("/agui", "/aguix/demo"), None);
        assert_eq!(Route::parse("/agui", "/agui/demo/extra"), None);
        assert_eq!(Route::parse("", "/demo"), Some(Route::Run("demo".into())));
        assert_eq!(
            Route::parse("/agui", "/agui/webhooks"),
            Some(Route::Webhooks)
        );
        assert_eq!(
            Route::parse("/agui", "/agui/webhooks/deliveries"),
            Some(Route::WebhookDeliveries)
        );
        assert_eq!(Route::parse("/agui", "/agui/webhooks/x"), None);
        assert_eq!(
            Route::parse("/agui", "/agui/schedules"),
            Some(Route::Schedules)
        );
        assert_eq!(
            Route::parse("/agui", "/agui/schedules/s%201"),
            Some(Route::Schedule("s 1".into()))
        );
        assert_eq!(Route::parse("/agui", "/agui/schedules/s/x"), None);
    }
}

//! Webhooks: signed JSON about runs and threads, POSTed to the configured endpoints
//! (`[[webhooks]]`) from a durable outbox in the store.
//!
//! Three parts:
//! - the runtime's side, [`Outbox`]: which endpoints want which [`EventKind`], and the
//!   outbox row ([`Outgoing`]) an [`Event`] becomes. The runtime hands that row to the
//!   store write that records the fact it reports (a run's end, a park, a thread's first
//!   run, a delete), so the two commit together or not at all: a `kill -9` never loses an
//!   event whose fact was stored, and never reports one that was not. Nothing in a run
//!   waits on a delivery.
//! - the delivery (`deliver.rs`, [`Delivery`]): one task per endpoint claims the oldest
//!   undelivered event of each thread, POSTs it with [`sign::signature`] and
//!   `agui-event-id`, and records the attempt: 2xx delivered, anything else retried with
//!   exponential backoff, capped. A thread's later events wait behind its undelivered one
//!   (order per thread per endpoint); other threads' do not. The HTTP client is lent by
//!   the server ([`Post`], implemented in `http::transport::webhook`), as traces are lent
//!   theirs.
//! - `sign.rs`: the signature, and its check for a receiver.
//!
//! Not here: the SQL (`store/*/outbox.rs`), the operator route (`http::api::webhooks`),
//! the hooks themselves (`runtime/notices.rs`).

mod deliver;
pub mod sign;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::metrics::WebhookMetrics;
pub use crate::store::Outgoing;
pub use deliver::{Delivery, POLL, Post, PostError, PostFuture, backoff};

/// An endpoint's request timeout by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest wait between two attempts by default.
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(300);
/// The wait after a first failed attempt; each further failure doubles it, up to the
/// endpoint's `max_backoff`.
pub const FIRST_BACKOFF: Duration = Duration::from_secs(1);

/// What an event reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A run ended with `RUN_FINISHED`.
    RunFinished,
    /// A run ended with `RUN_ERROR` (the agent's error, a shutdown, ...).
    RunFailed,
    /// A run was cancelled (the cancel route, a delete, a client that went away).
    RunCancelled,
    /// A run is parked waiting on the client: an approval, an answer, a frontend tool.
    RunWaiting,
    /// A budget was reached.
    BudgetReached,
    /// A thread's first run (or import, or fork) stored it.
    ThreadCreated,
    /// A thread was deleted.
    ThreadDeleted,
}

impl EventKind {
    pub const ALL: [EventKind; 7] = [
        EventKind::RunFinished,
        EventKind::RunFailed,
        EventKind::RunCancelled,
        EventKind::RunWaiting,
        EventKind::BudgetReached,
        EventKind::ThreadCreated,
        EventKind::ThreadDeleted,
    ];

    /// Its name: the payload's `type`, and the word `events` takes.
    pub fn name(self) -> &'static str {
        match self {
            EventKind::RunFinished => "run.finished",
            EventKind::RunFailed => "run.failed",
            EventKind::RunCancelled => "run.cancelled",
            EventKind::RunWaiting => "run.waiting",
            EventKind::BudgetReached => "budget.reached",
            EventKind::ThreadCreated => "thread.created",
            EventKind::ThreadDeleted => "thread.deleted",
        }
    }

    pub fn from_name(name: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|kind| kind.name() == name)
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of event kinds: what an endpoint receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Events(u8);

impl Events {
    /// Every kind (`"*"`, or `events` left out).
    pub fn all() -> Events {
        Events(
            EventKind::ALL
                .iter()
                .fold(0, |bits, kind| bits | kind.bit()),
        )
    }

    /// The kinds `names` names; `"*"` is every kind; an unknown name is an error naming it.
    pub fn parse(names: &[String]) -> Result<Events, String> {
        let mut bits = 0;
        for name in names {
            if name == "*" {
                return Ok(Events::all());
            }
            let kind = EventKind::from_name(name).ok_or_else(|| {
                format!(
                    "unknown event {name:?} (known: {}, or \"*\")",
                    EventKind::ALL.map(EventKind::name).join(", ")
                )
            })?;
            bits |= kind.bit();
        }
        if bits == 0 {
            return Err("events is empty: name at least one, or \"*\" for all".to_owned());
        }
        Ok(Events(bits))
    }

    pub fn contains(self, kind: EventKind) -> bool {
        self.0 & kind.bit() != 0
    }

    /// The names of the kinds in the set, in [`EventKind::ALL`]'s order.
    pub fn names(self) -> Vec<&'static str> {
        EventKind::ALL
            .into_iter()
            .filter(|kind| self.contains(*kind))
            .map(EventKind::name)
            .collect()
    }
}

/// An endpoint's signing secret: the bytes of its `secret_file` (one trailing newline
/// trimmed). Its `Debug` is redacted.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Arc<[u8]>);

impl Secret {
    /// The secret in `path`: its bytes, one trailing newline (`\n` or `\r\n`) trimmed; an
    /// empty one is an error.
    pub fn read(path: &std::path::Path) -> Result<Secret, String> {
        let mut bytes =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if bytes.ends_with(b"\n") {
            bytes.pop();
            if bytes.ends_with(b"\r") {
                bytes.pop();
            }
        }
        if bytes.is_empty() {
            return Err(format!("{} is empty", path.display()));
        }
        Ok(Secret(bytes.into()))
    }

    pub fn from_bytes(bytes: &[u8]) -> Secret {
        Secret(bytes.into())
    }

    pub fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// One configured endpoint (`[[webhooks]]`). Its `Debug` shows neither the secret nor the
/// URL's path and query (a path may be a secret of its own).
#[derive(Clone)]
pub struct EndpointConfig {
    /// Its name: in metrics, logs, the operator route and the outbox rows. Pending events
    /// follow the name.
    pub name: String,
    /// Where events are POSTed: `http://` or `https://` (the system's roots verify it).
    pub url: http::Uri,
    pub secret: Secret,
    pub secret_file: PathBuf,
    pub events: Events,
    /// How long one attempt may take, response head included.
    pub timeout: Duration,
    /// The longest wait between two attempts.
    pub max_backoff: Duration,
}

impl std::fmt::Debug for EndpointConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointConfig")
            .field("name", &self.name)
            .field("url", &redacted_url(&self.url))
            .field("secret", &self.secret)
            .field("events", &self.events.names())
            .field("timeout", &self.timeout)
            .field("max_backoff", &self.max_backoff)
            .finish_non_exhaustive()
    }
}

impl EndpointConfig {
    /// The endpoint as `check-config` shows it: the URL with no path or query (either may
    /// hold a secret), never the secret.
    pub fn redacted_json(&self) -> Value {
        json!({
            "name": self.name,
            "url": redacted_url(&self.url),
            "secret_file": self.secret_file,
            "events": self.events.names(),
            "timeout": humantime::format_duration(self.timeout).to_string(),
            "max_backoff": humantime::format_duration(self.max_backoff).to_string(),
        })
    }
}

/// `url`'s scheme and authority, and `/…` for a path or query left out.
pub fn redacted_url(url: &http::Uri) -> String {
    let scheme = url.scheme_str().unwrap_or("http");
    let authority = url.authority().map_or("", |a| a.as_str());
    let hidden = url
        .path_and_query()
        .is_some_and(|pq| pq.as_str() != "/" && !pq.as_str().is_empty());
    format!("{scheme}://{authority}{}", if hidden { "/…" } else { "" })
}

/// Parses an endpoint URL: `http://` or `https://`, a host, no credentials.
pub fn parse_url(text: &str) -> Result<http::Uri, String> {
    let url: http::Uri = text.trim().parse().map_err(|_| "is not a URL".to_owned())?;
    if !matches!(url.scheme_str(), Some("http" | "https")) {
        return Err("must start with http:// or https://".to_owned());
    }
    let Some(authority) = url.authority() else {
        return Err("has no host".to_owned());
    };
    if authority.as_str().contains('@') {
        return Err("must not hold credentials".to_owned());
    }
    if authority.host().is_empty() {
        return Err("has no host".to_owned());
    }
    Ok(url)
}

/// The default name of an endpoint: `webhook-` and 8 hex digits of its URL's SHA-256, so
/// it stays the same when the list is reordered and changes with the URL.
pub fn default_name(url: &str) -> String {
    format!("webhook-{}", &crate::hex::short_hash(url.as_bytes())[..8])
}

/// Whether `name` can name an endpoint: 1 to 64 of `[A-Za-z0-9._-]`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// Something to report: what, about which thread (by its key) and run, on which agent,
/// with what details.
#[derive(Debug, Clone)]
pub struct Event {
    pub kind: EventKind,
    /// The thread's key (`access::scoped_key`): its owner and id. Empty for an event about
    /// no thread (a principal's daily budget).
    pub thread_key: String,
    pub run_id: Option<String>,
    pub agent: Option<String>,
    /// The kind's own details (`data` in the payload).
    pub data: Value,
}

impl Event {
    /// An event of `kind` about thread `key`, its details `data`.
    pub fn new(kind: EventKind, key: &str, data: Value) -> Event {
        Event {
            kind,
            thread_key: key.to_owned(),
            run_id: None,
            agent: None,
            data,
        }
    }

    pub fn run(mut self, run_id: &str) -> Event {
        self.run_id = Some(run_id.to_owned());
        self
    }

    pub fn agent(mut self, agent: &str) -> Event {
        self.agent = Some(agent.to_owned());
        self
    }

    /// A budget was reached (the budget's own details in `data`); `key` is empty for a
    /// principal's budget that concerns no one thread, and `owner` then names whose.
    pub fn budget_reached(key: &str, owner: &str, data: Value) -> Event {
        let mut event = Event::new(EventKind::BudgetReached, key, data);
        if key.is_empty() {
            event.thread_key = crate::access::scoped_key(owner, "");
        }
        event
    }

    /// The JSON body sent: `id`, `type`, `createdAt`, `threadId`, `runId` and `agent` when
    /// known, `principal` (the thread's owner: `operator` for the operator's own
    /// namespace, else the principal's name; never a token), `data`.
    fn payload(&self, id: &str, created_at: i64) -> Value {
        let (owner, thread_id) = crate::access::split_key(&self.thread_key);
        let mut body = json!({
            "id": id,
            "type": self.kind.name(),
            "createdAt": crate::clock::rfc3339(created_at),
        });
        if !thread_id.is_empty() {
            body["threadId"] = json!(thread_id);
        }
        if let Some(run_id) = &self.run_id {
            body["runId"] = json!(run_id);
        }
        if let Some(agent) = &self.agent {
            body["agent"] = json!(agent);
        }
        body["principal"] = json!(if owner.is_empty() { "operator" } else { owner });
        body["data"] = self.data.clone();
        body
    }
}

/// The runtime's side of the webhooks: which endpoints want which kinds, the outbox rows
/// events become, and the wake-up of the delivery.
#[derive(Debug)]
pub struct Outbox {
    endpoints: Vec<EndpointInfo>,
    wake: Arc<tokio::sync::Notify>,
    metrics: WebhookMetrics,
}

/// What the operator route shows of a configured endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointInfo {
    pub name: String,
    /// The URL without its path and query ([`redacted_url`]).
    pub url: String,
    pub events: Events,
}

impl Outbox {
    /// The outbox for `endpoints` (none: nothing is ever written).
    pub fn new(endpoints: &[EndpointConfig]) -> Outbox {
        Outbox {
            endpoints: endpoints
                .iter()
                .map(|e| EndpointInfo {
                    name: e.name.clone(),
                    url: redacted_url(&e.url),
                    events: e.events,
                })
                .collect(),
            wake: Arc::default(),
            metrics: WebhookMetrics::new(endpoints.iter().map(|e| e.name.as_str())),
        }
    }

    /// Whether any endpoint receives `kind` (when none does, no event is built).
    pub fn wants(&self, kind: EventKind) -> bool {
        self.endpoints.iter().any(|e| e.events.contains(kind))
    }

    /// `event` as an outbox row for every endpoint that receives its kind, its id and time
    /// fixed now; `None` when none does.
    pub fn outgoing(&self, event: &Event) -> Option<Outgoing> {
        let endpoints: Vec<String> = self
            .endpoints
            .iter()
            .filter(|e| e.events.contains(event.kind))
            .map(|e| e.name.clone())
            .collect();
        if endpoints.is_empty() {
            return None;
        }
        let id = uuid::Uuid::new_v4().to_string();
        let created_at = crate::clock::now_ms() as i64;
        Some(Outgoing {
            body: event.payload(&id, created_at).to_string(),
            id,
            thread: event.thread_key.clone(),
            kind: event.kind.name().to_owned(),
            created_at,
            endpoints,
        })
    }

    /// An event was queued with a store write: the delivery looks for it (after the
    /// write's batch, which its claim follows in the store's FIFO).
    pub fn queued(&self) {
        self.wake.notify_waiters();
    }

    /// What the delivery tasks wait on between passes.
    pub fn wake(&self) -> Arc<tokio::sync::Notify> {
        self.wake.clone()
    }

    /// The configured endpoints, in configuration order.
    pub fn endpoints(&self) -> &[EndpointInfo] {
        &self.endpoints
    }

    /// The delivery counters and the pending gauge, by endpoint.
    pub fn metrics(&self) -> &WebhookMetrics {
        &self.metrics
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_names_parse_and_unknown_ones_are_named() {
        let all = Events::parse(&["*".to_owned()]).expect("all");
        assert_eq!(all, Events::all());
        assert_eq!(all.names().len(), EventKind::ALL.len());
        let some =
            Events::parse(&["run.finished".to_owned(), "thread.deleted".to_owned()]).expect("two");
        assert!(some.contains(EventKind::RunFinished) && some.contains(EventKind::ThreadDeleted));
        assert!(!some.contains(EventKind::RunWaiting));
        assert_eq!(some.names(), ["run.finished", "thread.deleted"]);
        let error = Events::parse(&["run.finish".to_owned()]).expect_err("unknown");
        assert!(error.contains("\"run.finish\""), "{error}");
        assert!(Events::parse(&[]).is_err());
        for kind in EventKind::ALL {
            assert_eq!(EventKind::from_name(kind.name()), Some(kind));
        }
    }

    #[test]
    fn urls_are_checked_and_shown_without_their_path() {
        assert!(parse_url("https://hooks.example.com/x").is_ok());
        for bad in [
            "ftp://h/x",
            "hooks.example.com/x",
            "https://u:p@h/x",
            "http:///x",
            "",
        ] {
            assert!(parse_url(bad).is_err(), "{bad:?}");
        }
        let url = parse_url("https://hooks.example.com:8443/T000/B000/s3cret?k=v").expect("url");
        assert_eq!(redacted_url(&url), "https://hooks.example.com:8443/…");
        let bare = parse_url("http://127.0.0.1:9000").expect("url");
        assert_eq!(redacted_url(&bare), "http://127.0.0.1:9000");
        assert_eq!(default_name("http://a/x"), default_name("http://a/x"));
        assert_ne!(default_name("http://a/x"), default_name("http://a/y"));
        assert!(valid_name(&default_name("http://a/x")));
    }

    #[test]
    fn an_event_goes_to_the_endpoints_that_want_it_and_names_only_its_owner() {
        let endpoint = |name: &str, events: Events| EndpointConfig {
            name: name.to_owned(),
            url: parse_url("http://127.0.0.1:1/").expect("url"),
            secret: Secret::from_bytes(b"s"),
            secret_file: PathBuf::from("/dev/null"),
            events,
            timeout: DEFAULT_TIMEOUT,
            max_backoff: DEFAULT_MAX_BACKOFF,
        };
        let outbox = Outbox::new(&[
            endpoint("all", Events::all()),
            endpoint(
                "runs",
                Events::parse(&["run.finished".to_owned()]).expect("events"),
            ),
        ]);
        let key = crate::access::scoped_key("alice", "t1");
        let event = Event::new(EventKind::RunFinished, &key, json!({}))
            .run("r1")
            .agent("demo");
        let row = outbox.outgoing(&event).expect("wanted");
        assert_eq!(row.endpoints, ["all", "runs"]);
        assert_eq!(row.thread, key);
        let body: Value = serde_json::from_str(&row.body).expect("json");
        assert_eq!(body["id"], json!(row.id));
        assert_eq!(body["type"], "run.finished");
        assert_eq!(body["threadId"], "t1");
        assert_eq!(body["runId"], "r1");
        assert_eq!(body["agent"], "demo");
        assert_eq!(body["principal"], "alice");
        assert!(
            !row.body.contains('\u{1f}'),
            "the key never leaves: {}",
            row.body
        );
        let created = Event::new(EventKind::ThreadCreated, "t2", json!({}));
        let row = outbox.outgoing(&created).expect("wanted");
        assert_eq!(row.endpoints, ["all"]);
        let body: Value = serde_json::from_str(&row.body).expect("json");
        assert_eq!(body["principal"], "operator");
        assert!(body.get("runId").is_none());
        let waiting = Event::new(EventKind::RunWaiting, "t2", json!({}));
        assert!(outbox.wants(EventKind::RunWaiting));
        assert!(Outbox::new(&[]).outgoing(&waiting).is_none());
        let budget = Event::budget_reached("", "bob", json!({"budget": "tokens"}));
        let body: Value =
            serde_json::from_str(&outbox.outgoing(&budget).expect("wanted").body).expect("json");
        assert_eq!(body["principal"], "bob");
        assert!(body.get("threadId").is_none());
    }
}

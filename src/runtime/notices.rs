//! The runtime's webhook hooks: what a run's end, a park, a thread's first run and a delete
//! report, as outbox rows (`webhooks::Outbox`) handed to the store write that records the
//! fact, so both commit together or not at all. With no endpoint wanting a kind, nothing
//! is built. The delivery is told once the write is queued; no run waits on it.

use serde_json::{Value, json};

use super::Runtime;
use super::suspension::{Channel, Suspension, Wait};
use super::thread::Thread;
use super::translator::Ending;
use crate::store::{EndpointSummary, OutboxRow, OutboxStatus, Outgoing, StoreError};
use crate::webhooks::{Event, EventKind};

impl Runtime {
    /// The outbox row of the event `build` makes, when an endpoint receives `kind`.
    pub(in crate::runtime) fn outgoing(
        &self,
        kind: EventKind,
        build: impl FnOnce() -> Event,
    ) -> Option<Outgoing> {
        let outbox = self.options().webhooks.as_ref()?;
        if !outbox.wants(kind) {
            return None;
        }
        outbox.outgoing(&build())
    }

    /// A write carrying an outbox row was queued (`queued`): the delivery looks for it.
    pub(in crate::runtime) fn outgoing_queued(&self, queued: bool) {
        if let (true, Some(outbox)) = (queued, &self.options().webhooks) {
            outbox.queued();
        }
    }

    /// Reports `event` on its own, in a store write of its own (a budget reached: the fact
    /// is the event). Nothing when no endpoint receives its kind.
    pub fn notify(&self, event: Event) {
        if let Some(row) = self.outgoing(event.kind, || event) {
            self.store().add_outgoing(row);
            self.outgoing_queued(true);
        }
    }

    /// Every endpoint's outbox rows, summed up (`GET {path}/webhooks`).
    pub async fn webhook_summary(&self) -> Result<Vec<EndpointSummary>, StoreError> {
        self.store().outbox_summary().await
    }

    /// Up to `limit` outbox rows of `status`, of `endpoint` if given
    /// (`GET {path}/webhooks/deliveries`).
    pub async fn webhook_deliveries(
        &self,
        status: OutboxStatus,
        endpoint: Option<String>,
        limit: usize,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        self.store().outbox_rows(status, endpoint, limit).await
    }

    /// The webhook outbox, when endpoints are configured.
    pub fn webhooks(&self) -> Option<&std::sync::Arc<crate::webhooks::Outbox>> {
        self.options().webhooks.as_ref()
    }
}

/// The event a run's `ending` reports (`run.finished`, `run.failed`, `run.cancelled`).
pub(in crate::runtime) fn ended(
    rt: &Runtime,
    thread: &Thread,
    run_id: &str,
    ending: &Ending,
) -> Option<Outgoing> {
    let (kind, data) = match ending {
        Ending::Finished { usage, .. } => {
            let mut data = json!({});
            if !usage.is_empty() {
                data["usage"] = serde_json::to_value(usage).unwrap_or(Value::Null);
            }
            (EventKind::RunFinished, data)
        }
        Ending::Cancelled => (EventKind::RunCancelled, json!({})),
        Ending::Error { code, message } => (
            EventKind::RunFailed,
            json!({"code": code, "message": message}),
        ),
        // A park is not an end (see `waiting`).
        Ending::Suspended { .. } | Ending::Interrupt { .. } => return None,
    };
    rt.outgoing(kind, || about(kind, thread, Some(run_id), data))
}

/// The event of a run parked on `suspension` (`run.waiting`): what it waits for, by kind
/// and id, and the interrupts' reasons.
pub(in crate::runtime) fn waiting(
    rt: &Runtime,
    thread: &Thread,
    run_id: &str,
    suspension: &Suspension,
    ending: &Ending,
) -> Option<Outgoing> {
    rt.outgoing(EventKind::RunWaiting, || {
        let waits: Vec<Value> = suspension
            .waits
            .iter()
            .map(|wait| {
                let kind = match wait {
                    Wait::Tool { .. } => "tool",
                    Wait::Permission { .. } => "permission",
                    Wait::Input { .. } => "input",
                };
                json!({"kind": kind, "id": wait.answer_id()})
            })
            .collect();
        let mut data = json!({
            "segmentRunId": suspension.segment_run_id,
            "answerWith": match suspension.channel {
                Channel::ToolMessages => "toolMessages",
                Channel::Interrupts => "resume",
            },
            "waits": waits,
        });
        if let Ending::Interrupt { interrupts } = ending {
            data["interrupts"] = interrupts
                .iter()
                .map(|i| json!({"id": i.id, "reason": i.reason}))
                .collect();
        }
        about(EventKind::RunWaiting, thread, Some(run_id), data)
    })
}

/// The event of a thread's creation (`thread.created`), written only if the write that
/// carries it creates the thread; `how` it came (`run`, `import`, `fork`).
pub(in crate::runtime) fn created(
    rt: &Runtime,
    key: &str,
    agent: &str,
    run_id: Option<&str>,
    how: &str,
) -> Option<Outgoing> {
    rt.outgoing(EventKind::ThreadCreated, || {
        let mut event = Event::new(EventKind::ThreadCreated, key, json!({"how": how})).agent(agent);
        if let Some(run_id) = run_id {
            event = event.run(run_id);
        }
        event
    })
}

/// The event of a thread's deletion (`thread.deleted`).
pub(in crate::runtime) fn deleted(rt: &Runtime, thread: &Thread) -> Option<Outgoing> {
    rt.outgoing(EventKind::ThreadDeleted, || {
        about(EventKind::ThreadDeleted, thread, None, json!({}))
    })
}

fn about(kind: EventKind, thread: &Thread, run_id: Option<&str>, data: Value) -> Event {
    let event = Event::new(kind, thread.key.as_str(), data).agent(&thread.agent);
    match run_id {
        Some(run_id) => event.run(run_id),
        None => event,
    }
}

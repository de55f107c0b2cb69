//! A thread's queue: new input sent with the `enqueue` strategy while a run was live. Each
//! item is stored before the request is answered, waits in order, and becomes a run of its
//! own when the runs before it have ended (`kick_queue`, from the end of every run). The
//! request that enqueued an item gets a stream that sends keep-alives until the item's run
//! starts, then follows that run; an item cancelled (or whose thread is deleted) ends its
//! stream with `RUN_ERROR`. Queued runs are background runs: once accepted, the input runs
//! whether its stream is still attached or not. After a restart the stored items start
//! again in order (`resume_queues`).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::oneshot;

use crate::access::{Capability, Caps, Principal, ThreadKey};
use crate::agent::Agent;
use crate::clock::now_ms;
use crate::protocol::input::Message;
use crate::protocol::{Profile, RunAgentInput};
use crate::runtime::attach::Attachment;
use crate::runtime::thread::{Decision, Queued, Thread, ThreadState};
use crate::runtime::{LoadError, Runtime, StartError};
use crate::store::QueuedRow;
use crate::sync::lock;

/// Most items one thread's queue holds.
pub const MAX_QUEUED: usize = 32;

/// How long a queued run that found no free slot waits before it tries again.
const RETRY_AFTER: Duration = Duration::from_millis(500);

/// A thread's queue as the API shows it.
#[derive(Debug, Clone)]
pub struct QueuedItem {
    pub id: String,
    pub created_at: i64,
    /// The item's messages the thread has not seen (what its run will add).
    pub messages: Vec<Message>,
}

/// Why a queue operation did nothing.
#[derive(Debug)]
pub enum QueueError {
    /// No such thread for the principal.
    NoThread,
    /// No such item in the thread's queue.
    NoItem,
    Load(LoadError),
}

impl From<LoadError> for QueueError {
    fn from(error: LoadError) -> QueueError {
        QueueError::Load(error)
    }
}

impl Runtime {
    /// Puts `input` in `thread`'s queue (the caller holds the decide section, and the
    /// thread's run is live). Stored before it returns; the stream it returns waits for
    /// the item's run.
    pub(in crate::runtime) async fn enqueue(
        &self,
        principal: &Principal,
        thread: &Arc<Thread>,
        backend: &dyn Agent,
        input: &RunAgentInput,
        profile: Profile,
    ) -> Result<Attachment, StartError> {
        if !principal.can(Capability::Run) {
            return Err(StartError::Forbidden(Capability::Run));
        }
        if self.runs().contains(&principal.run_key(&input.run_id)) {
            return Err(StartError::RunIdInUse);
        }
        // What the run would refuse is refused now, not when its turn comes.
        self.checked_input(principal, thread, backend, input)
            .await?;
        // Its input waits in memory, counted against the budget: refused when it does not
        // fit once what can be let go of is (finished runs' frames, idle threads).
        let bytes = crate::runtime::memory::json_size(input);
        let limit = self.retained_limit();
        if self.threads().meter().get() + bytes > limit {
            self.threads().enforce_budget();
            if self.threads().meter().get() + bytes > limit {
                return Err(StartError::QueueMemory(bytes));
            }
        }
        let (tx, rx) = oneshot::channel();
        let row = {
            let mut state = lock(&thread.state);
            if state.queue.iter().any(|item| item.id == input.run_id) {
                return Err(StartError::RunIdInUse);
            }
            if state.queue.len() >= MAX_QUEUED {
                return Err(StartError::QueueFull);
            }
            let seq = state.queue.back().map_or(1, |last| last.seq + 1);
            let item = Queued {
                id: input.run_id.clone(),
                seq,
                principal: principal.clone(),
                input: input.clone(),
                created_at: now_ms() as i64,
                waiter: Some(tx),
                _charge: crate::runtime::memory::Charge::new(self.threads().meter(), bytes),
            };
            let row = item.row()?;
            state.queue.push_back(item);
            row
        };
        self.store().queue_put(thread.key.as_str(), &row);
        if let Err(error) = self.store().commit().await {
            tracing::error!(%error, thread.id = %thread.id, "queued input not stored");
            lock(&thread.state).queue.retain(|item| item.id != row.id);
            self.store().queue_remove(thread.key.as_str(), &row.id);
            return Err(StartError::Store);
        }
        self.fleet_changed();
        // The live run may have ended since the decision (its end looked at the queue
        // before this item was in it): then nothing else starts the item.
        if lock(&thread.state).live.is_none() {
            self.kick_queue(thread);
        }
        Ok(self.waiting_attachment(thread, profile, rx))
    }

    /// A stream that sends keep-alives until the queued item's run starts (then follows
    /// it), or ends with what it is handed instead.
    fn waiting_attachment(
        &self,
        thread: &Arc<Thread>,
        profile: Profile,
        started: oneshot::Receiver<Attachment>,
    ) -> Attachment {
        self.attachment(
            thread,
            0,
            profile,
            None,
            crate::runtime::attach::Mode::Preamble,
        )
        .waiting_for(started)
    }

    /// After a run of `thread` ended: starts its next queued item, if any, in a task of
    /// its own.
    pub(in crate::runtime) fn kick_queue(&self, thread: &Arc<Thread>) {
        if lock(&thread.state).queue.is_empty() {
            return;
        }
        let (rt, thread) = (self.clone(), thread.clone());
        self.admission()
            .spawn(async move { rt.run_queue(thread).await });
    }

    /// Starts `thread`'s next queued item when no run is live on it; an item that cannot
    /// start ends its stream with the reason, and the next one is tried.
    async fn run_queue(&self, thread: Arc<Thread>) {
        loop {
            let decide = thread.decide.lock().await;
            if thread.retired.load(Ordering::SeqCst) || self.is_draining() {
                // Deleted (its items were told), or stopping: what is stored runs after
                // the restart.
                return;
            }
            let item = {
                let mut state = lock(&thread.state);
                if state.live.is_some() {
                    // Its end starts the next item.
                    return;
                }
                let Some(item) = state.queue.pop_front() else {
                    return;
                };
                match state.decide(&item.input) {
                    Decision::Start => Ok(item),
                    _ => Err(item),
                }
            };
            let mut item = match item {
                Ok(item) => item,
                Err(item) => {
                    self.store().queue_remove(thread.key.as_str(), &item.id);
                    self.refuse_item(
                        &thread,
                        item,
                        "QUEUED_INPUT_INVALID",
                        "the queued input no longer starts a run on this thread".to_owned(),
                    );
                    continue;
                }
            };
            let Some(backend) = self.agent(&thread.agent).cloned() else {
                return;
            };
            let profile = Profile::from_protocol_version(item.input.protocol_version.as_deref());
            lock(&thread.state).profile = profile;
            match self
                .start_new(
                    &item.principal,
                    &thread,
                    backend,
                    &item.input,
                    profile,
                    None,
                )
                .await
            {
                Ok(attachment) => {
                    self.store().queue_remove(thread.key.as_str(), &item.id);
                    if let Some(run) = attachment.live_run() {
                        run.background.store(true, Ordering::SeqCst);
                    }
                    if let Some(waiter) = item.waiter.take() {
                        // A stream gone meanwhile drops it: the run goes on.
                        let _ = waiter.send(attachment);
                    }
                    return;
                }
                Err(StartError::OverCapacity | StartError::PrincipalBusy) => {
                    // Its turn stays; it tries again when a slot may be free.
                    lock(&thread.state).queue.push_front(item);
                    drop(decide);
                    tokio::time::sleep(RETRY_AFTER).await;
                }
                Err(StartError::Draining) => {
                    lock(&thread.state).queue.push_front(item);
                    return;
                }
                Err(error) => {
                    self.store().queue_remove(thread.key.as_str(), &item.id);
                    let (code, message) = refusal(&error);
                    self.refuse_item(&thread, item, code, message);
                }
            }
        }
    }

    /// Ends a queued item that will not run: its stream (if still there) gets the run's
    /// start and a `RUN_ERROR` with `code`.
    fn refuse_item(&self, thread: &Arc<Thread>, mut item: Queued, code: &str, message: String) {
        tracing::info!(thread.id = %thread.id, run.id = %item.id, code, "queued input not run");
        if let Some(waiter) = item.waiter.take() {
            let profile = Profile::from_protocol_version(item.input.protocol_version.as_deref());
            let _ = waiter.send(self.rejection(thread, &item.input, profile, code, message));
        }
    }

    /// Empties `thread`'s queue (it is being deleted; the caller holds its decide
    /// section): every waiting stream is told. The stored items go with the thread.
    pub(in crate::runtime) fn drop_queue(&self, thread: &Arc<Thread>, message: &str) {
        let items: Vec<Queued> = lock(&thread.state).queue.drain(..).collect();
        for item in items {
            self.refuse_item(thread, item, "RUN_DEQUEUED", message.to_owned());
        }
    }

    /// The queue of `principal`'s thread `thread_id`; `None` when there is no such thread.
    pub async fn queue_of(
        &self,
        principal: &Principal,
        thread_id: &str,
    ) -> Result<Vec<QueuedItem>, QueueError> {
        let thread = self.queue_thread(principal, thread_id).await?;
        let state = lock(&thread.state);
        Ok(state.queue.iter().map(|item| item.view(&state)).collect())
    }

    /// Takes item `item_id` out of the queue of `principal`'s thread `thread_id`: it never
    /// runs, and its stream ends with `RUN_ERROR{code:"RUN_DEQUEUED"}`.
    pub async fn dequeue(
        &self,
        principal: &Principal,
        thread_id: &str,
        item_id: &str,
    ) -> Result<(), QueueError> {
        let thread = self.queue_thread(principal, thread_id).await?;
        // In the decide section, so the item cannot be starting meanwhile.
        let _decide = thread.decide.lock().await;
        let item = {
            let mut state = lock(&thread.state);
            let at = state
                .queue
                .iter()
                .position(|item| item.id == item_id)
                .ok_or(QueueError::NoItem)?;
            state.queue.remove(at).ok_or(QueueError::NoItem)?
        };
        self.store().queue_remove(thread.key.as_str(), item_id);
        self.fleet_changed();
        let stored = self.store().commit().await;
        self.refuse_item(
            &thread,
            item,
            "RUN_DEQUEUED",
            "the queued input was cancelled before it ran".to_owned(),
        );
        stored.map_err(|_| QueueError::Load(LoadError::Store))
    }

    /// Replaces the messages of item `item_id` of `principal`'s thread `thread_id`, which
    /// has not started; the item keeps its place (given with it).
    pub async fn edit_queued(
        &self,
        principal: &Principal,
        thread_id: &str,
        item_id: &str,
        mut messages: Vec<Message>,
    ) -> Result<(usize, QueuedItem), QueueError> {
        self.keep_plain(&mut messages);
        let thread = self.queue_thread(principal, thread_id).await?;
        let _decide = thread.decide.lock().await;
        let row = {
            let mut state = lock(&thread.state);
            let item = state
                .queue
                .iter_mut()
                .find(|item| item.id == item_id)
                .ok_or(QueueError::NoItem)?;
            item.input.messages = messages;
            item.row().map_err(|_| QueueError::Load(LoadError::Store))?
        };
        self.store().queue_put(thread.key.as_str(), &row);
        self.store()
            .commit()
            .await
            .map_err(|_| QueueError::Load(LoadError::Store))?;
        let state = lock(&thread.state);
        let position = state
            .queue
            .iter()
            .position(|item| item.id == item_id)
            .ok_or(QueueError::NoItem)?;
        Ok((position, state.queue[position].view(&state)))
    }

    /// How many items wait in the queue of the thread `key`, when it is in memory (a
    /// thread with a queue is: its queue runs from memory).
    pub fn queued_count(&self, key: &ThreadKey) -> usize {
        self.threads()
            .read(key, |thread| lock(&thread.state).queue.len())
            .unwrap_or(0)
    }

    /// `principal`'s thread `thread_id`, in memory, when it is one of an agent it may use.
    async fn queue_thread(
        &self,
        principal: &Principal,
        thread_id: &str,
    ) -> Result<Arc<Thread>, QueueError> {
        self.load_thread(&principal.key(thread_id))
            .await?
            .filter(|thread| principal.may_use(&thread.agent))
            .ok_or(QueueError::NoThread)
    }

    /// After a start: loads every thread with stored queued input and starts its next
    /// item (the run before it ended with the previous process). A thread another node
    /// holds is left to it.
    pub async fn resume_queues(&self) {
        let keys = match self.store().queued_threads().await {
            Ok(keys) => keys,
            Err(error) => {
                tracing::error!(%error, "queued input not read; it runs when its thread is next used");
                return;
            }
        };
        for key in keys {
            match self.load_thread(&ThreadKey::stored(key)).await {
                Ok(Some(thread)) => self.kick_queue(&thread),
                Ok(None) | Err(LoadError::Elsewhere(_)) => {}
                Err(LoadError::Store) => {
                    tracing::error!("a thread with queued input could not be loaded");
                }
            }
        }
    }
}

impl Queued {
    /// What the API shows of it on a thread as `state` is.
    fn view(&self, state: &ThreadState) -> QueuedItem {
        QueuedItem {
            id: self.id.clone(),
            created_at: self.created_at,
            messages: state
                .peek_new(&self.input.messages)
                .into_iter()
                .map(|(_, m)| m.clone())
                .collect(),
        }
    }

    /// Its stored form.
    fn row(&self) -> Result<QueuedRow, StartError> {
        Ok(QueuedRow {
            id: self.id.clone(),
            seq: self.seq,
            capped: self.principal.is_capped(),
            budget: self.principal.budget().copied(),
            input: serde_json::to_string(&self.input).map_err(|_| StartError::Store)?,
            created_at: self.created_at,
        })
    }

    /// An item read back from the store of thread `key`; `None` when its input no longer
    /// reads (logged).
    fn stored(
        key: &ThreadKey,
        row: QueuedRow,
        meter: &Arc<crate::runtime::memory::Meter>,
    ) -> Option<Queued> {
        let input = match crate::protocol::input::decode_run_input(row.input.as_bytes()) {
            Ok(input) => input,
            Err(error) => {
                tracing::warn!(%error, thread.id = %key, item = %row.id, "stored queued input unreadable; skipped");
                return None;
            }
        };
        let owner = key.split().0;
        // The principal it was accepted from, as far as a run needs one: its namespace,
        // its run cap if it had one (its capabilities were checked when it came), and its
        // token's budget claim.
        let principal = if row.capped {
            Principal::scoped(owner, None, Caps::from_names(&["run", "read", "approve"]))
        } else if owner.is_empty() {
            Principal::operator()
        } else {
            Principal::operator_as(owner)
        }
        .with_budget(row.budget);
        Some(Queued {
            id: row.id,
            seq: row.seq,
            principal,
            input,
            created_at: row.created_at,
            waiter: None,
            _charge: crate::runtime::memory::Charge::new(meter, row.input.len()),
        })
    }
}

/// A thread's queue read back from the store.
pub(super) fn restored(
    key: &ThreadKey,
    rows: Vec<QueuedRow>,
    meter: &Arc<crate::runtime::memory::Meter>,
) -> VecDeque<Queued> {
    rows.into_iter()
        .filter_map(|row| Queued::stored(key, row, meter))
        .collect()
}

/// The code and message a queued item's stream ends with when its run is refused.
fn refusal(error: &StartError) -> (&'static str, String) {
    let code = match error {
        StartError::Input(_) => "INVALID_INPUT",
        StartError::Forbidden(_) => "FORBIDDEN",
        StartError::RunIdInUse => "RUN_ID_IN_USE",
        StartError::Store => "STORE_UNAVAILABLE",
        _ => "RUN_REFUSED",
    };
    (code, error.to_string())
}

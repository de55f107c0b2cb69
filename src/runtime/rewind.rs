//! Rewind: a thread taken back to one of its messages. The conversation (the transcript
//! cut after that message, the agent's session let go: the next turn starts a new one
//! given the kept transcript), the files (the workspace put back to the checkpoint taken
//! before the turn that followed that message), or both. Only between runs, in the
//! thread's decide section, so no run starts meanwhile.
//!
//! Order, for kill -9: the files are put back first (writing the same checkpoint twice
//! changes nothing), then the transcript's cut is committed. A crash between the two
//! leaves the files put back and the conversation as it was, so the same rewind, asked
//! again, finds the same checkpoint and finishes.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::{Value, json};

use super::{Runtime, StartError, Thread};
use crate::access::{Capability, Principal};
use crate::agent::Agent;
use crate::clock::now_ms;
use crate::protocol::input::Message;
use crate::protocol::{Event, InputError, RunAgentInput};
use crate::sync::lock;
use crate::workspace::Unit;

/// What a rewind takes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RewindScope {
    Conversation,
    Files,
    Both,
}

impl RewindScope {
    /// `"conversation"`, `"files"` or `"both"`.
    pub fn parse(text: &str) -> Option<RewindScope> {
        match text {
            "conversation" => Some(RewindScope::Conversation),
            "files" => Some(RewindScope::Files),
            "both" => Some(RewindScope::Both),
            _ => None,
        }
    }

    fn conversation(self) -> bool {
        self != RewindScope::Files
    }

    fn files(self) -> bool {
        self != RewindScope::Conversation
    }
}

/// Why a rewind was refused; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RewindError {
    #[error("no such thread")]
    UnknownThread,
    #[error("the thread has no message {0:?}")]
    UnknownMessage(String),
    #[error("the thread has a live run")]
    RunInProgress,
    /// Files were asked for and the agent keeps no checkpoints of this thread.
    #[error("{0}")]
    NoCheckpoints(String),
    #[error("the workspace could not be put back: {0}")]
    Workspace(String),
    #[error("the thread store is unavailable")]
    Store,
    #[error("another node owns the thread")]
    Elsewhere(crate::cluster::Owner),
}

/// What a rewind did.
#[derive(Debug, Clone, PartialEq)]
pub struct Rewound {
    /// The transcript as it is now (as clients are shown it).
    pub messages: Value,
    /// The shared state document.
    pub state: Value,
    /// The checkpoint the files were put back to and how many entries that wrote or
    /// removed; `None` when files were not asked for. A checkpoint of `None`: no turn
    /// followed the message, so the files were already as it left them.
    pub files: Option<(Option<String>, usize)>,
    /// Whether the agent's session was let go (the conversation was rewound): its next
    /// turn starts a new session given the kept transcript.
    pub new_session: bool,
    /// The run id of the short run that showed the rewound thread to its streams.
    pub run_id: Option<String>,
}

impl Runtime {
    /// Rewinds thread `thread_id` of `principal`'s namespace to just after its message
    /// `message_id` (see the module's doc). Refused while a run is live.
    pub async fn rewind_thread(
        &self,
        principal: &Principal,
        thread_id: &str,
        message_id: &str,
        scope: RewindScope,
    ) -> Result<Rewound, RewindError> {
        let key = principal.key(thread_id);
        if let Some(owner) = self.owner_elsewhere(&key).await {
            return Err(RewindError::Elsewhere(owner));
        }
        loop {
            let thread = match self.load_thread(&key).await {
                Ok(Some(thread)) if principal.may_use(&thread.agent) => thread,
                Ok(_) => return Err(RewindError::UnknownThread),
                Err(super::LoadError::Elsewhere(owner)) => {
                    return Err(RewindError::Elsewhere(owner));
                }
                Err(super::LoadError::Store) => return Err(RewindError::Store),
            };
            let decide = thread.decide.lock().await;
            if thread.retired.load(Ordering::SeqCst) {
                continue;
            }
            let keep = {
                let state = lock(&thread.state);
                if state.live.is_some() || !state.queue.is_empty() {
                    return Err(RewindError::RunInProgress);
                }
                state
                    .transcript
                    .iter()
                    .position(|m| m.id() == message_id)
                    .ok_or_else(|| RewindError::UnknownMessage(message_id.to_owned()))?
                    + 1
            };
            let mut rewound = self.rewind_to(&thread, keep, scope).await?;
            let put_back = rewound.files.as_ref().is_some_and(|(at, _)| at.is_some());
            if rewound.new_session || put_back {
                rewound.run_id = Some(self.show_rewound(&thread, &rewound));
            }
            drop(decide);
            self.fleet_activity(thread.owner());
            return Ok(rewound);
        }
    }

    /// A request that owns its history, about to start a run (its decide section held, no
    /// run live): the thread is first rewound to where that history parts from the stored
    /// one (the files too, where the agent keeps checkpoints), and streams following it see
    /// that.
    pub(super) async fn follow_client_history(
        &self,
        principal: &Principal,
        thread: &Arc<Thread>,
        input: &RunAgentInput,
    ) -> Result<(), StartError> {
        let keep = {
            let state = lock(&thread.state);
            if state.live.is_some() {
                return Ok(());
            }
            client_history_point(&state.transcript, &input.messages)
        };
        let Some(keep) = keep else {
            return Ok(());
        };
        if !principal.can(Capability::Run) {
            return Err(StartError::Forbidden(Capability::Run));
        }
        let keeps_files = self
            .agents()
            .get(&thread.agent)
            .and_then(|agent| agent.workspace(thread.key.as_str()))
            .is_some_and(|(_, workspaces)| workspaces.checkpoints().is_some());
        let scope = match keeps_files {
            true => RewindScope::Both,
            false => RewindScope::Conversation,
        };
        let rewound = match self.rewind_to(thread, keep, scope).await {
            // No checkpoint of that point (let go, or never taken): the conversation alone.
            Err(RewindError::NoCheckpoints(why)) => {
                tracing::info!(thread.id = %thread.id, %why, "the client's history rewinds the conversation only");
                self.rewind_to(thread, keep, RewindScope::Conversation)
                    .await
            }
            other => other,
        };
        let rewound = rewound.map_err(|error| match error {
            RewindError::Store => StartError::Store,
            RewindError::Elsewhere(owner) => StartError::Elsewhere(owner),
            other => StartError::Rewind(other.to_string()),
        })?;
        // What the client sends beyond what was kept is its new input, seen before or not
        // (a regenerated question, a message edited under its own id).
        {
            let mut state = lock(&thread.state);
            let kept: std::collections::HashSet<&str> =
                state.transcript.iter().map(Message::id).collect();
            let again: Vec<&str> = input
                .messages
                .iter()
                .map(Message::id)
                .filter(|id| !kept.contains(id))
                .collect();
            for id in again {
                state.seen.remove(id);
            }
        }
        self.show_rewound(thread, &rewound);
        self.fleet_activity(thread.owner());
        tracing::info!(thread.id = %thread.id, kept = keep, "rewound to the history the client sent");
        Ok(())
    }

    /// Rewinds `thread` to its first `keep` messages, `scope` saying what; its decide
    /// section is held and no run is live.
    pub(super) async fn rewind_to(
        &self,
        thread: &Arc<Thread>,
        keep: usize,
        scope: RewindScope,
    ) -> Result<Rewound, RewindError> {
        let agent = self.agents().get(&thread.agent).cloned();
        let (cut, document) = {
            let state = lock(&thread.state);
            (
                Cut::of(&state.transcript, keep),
                state.document.value(&thread.agent),
            )
        };
        // Checked before anything changes: files asked of an agent that keeps none.
        let files = match (scope.files(), &agent) {
            (true, Some(agent)) => {
                Some(files_to_restore(agent.as_ref(), thread.key.as_str(), cut).await?)
            }
            (true, None) => return Err(no_checkpoints()),
            (false, _) => None,
        };
        // The files first: until the transcript is cut, the same rewind finds the same
        // checkpoint, so one a crash interrupted can be asked again.
        let files = match files {
            Some(restore) => Some(restore.run().await?),
            None => None,
        };
        let new_session = scope.conversation() && self.cut_transcript(thread, keep).await?;
        if new_session && let Some(agent) = &agent {
            agent.let_session_go(thread.key.as_str()).await;
        }
        let transcript = lock(&thread.state).transcript.clone();
        Ok(Rewound {
            messages: self.shown(&thread.key, json!(transcript)),
            state: document,
            files,
            new_session,
            run_id: None,
        })
    }

    /// Cuts the thread's transcript to its first `keep` messages, in the store (committed)
    /// and in memory; the thread's session is let go. Whether it was cut (`false`: nothing
    /// followed).
    async fn cut_transcript(&self, thread: &Arc<Thread>, keep: usize) -> Result<bool, RewindError> {
        let Some(first_cut) = lock(&thread.state)
            .transcript
            .get(keep)
            .map(|m| m.id().to_owned())
        else {
            return Ok(false);
        };
        let store = self.store();
        store.rewind(thread.key.as_str(), Some(&first_cut), now_ms() as i64);
        store.commit().await.map_err(|error| {
            tracing::error!(%error, "a rewind could not be stored");
            RewindError::Store
        })?;
        if self.lease_lost(&thread.key) {
            return Err(RewindError::Store);
        }
        {
            let mut state = lock(&thread.state);
            // What was cut stays seen: a client that is behind (and sends the old history
            // again) does not bring it back as new input.
            state.transcript.truncate(keep);
            state.transcript.shrink_to_fit();
            state.session_id = None;
            state.rebuild = true;
            state.resize();
        }
        thread.account();
        Ok(true)
    }

    /// Shows the rewound thread to the streams that follow it: a short run of its own
    /// (`RUN_STARTED`, `MESSAGES_SNAPSHOT`, `STATE_SNAPSHOT`, `RUN_FINISHED` saying what was
    /// rewound). Its run id.
    fn show_rewound(&self, thread: &Thread, rewound: &Rewound) -> String {
        let run_id = format!("rewind-{}", uuid::Uuid::new_v4());
        let events = [
            Event::run_started(&thread.id, &run_id, None),
            Event::MessagesSnapshot {
                messages: rewound.messages.clone(),
            },
            Event::StateSnapshot {
                snapshot: rewound.state.clone(),
            },
            Event::RunFinished {
                thread_id: thread.id.clone(),
                run_id: run_id.clone(),
                result: Some(json!({"rewound": answer_json(rewound)})),
                outcome: None,
                usage: None,
            },
        ];
        thread.journal.push_all(&events, now_ms());
        run_id
    }
}

/// What a rewind says it did, beside the transcript and state: `files` (the checkpoint
/// and the entries put back) and `session` (`"new"` when the agent's next turn starts a
/// new session given the kept transcript, else `"kept"`).
pub fn answer_json(rewound: &Rewound) -> Value {
    json!({
        "files": rewound.files.as_ref().map(|(checkpoint, written)| json!({
            "checkpoint": checkpoint,
            "written": written,
        })),
        "session": if rewound.new_session { "new" } else { "kept" },
    })
}

fn no_checkpoints() -> RewindError {
    RewindError::NoCheckpoints(
        "the thread's agent keeps no checkpoints of its files (only an agent whose threads \
         each have a workspace of their own does)"
            .to_owned(),
    )
}

/// A put-back of a thread's workspace, chosen and not yet done.
struct Restore {
    checkpoints: crate::workspace::Checkpoints,
    workspaces: crate::workspace::Workspaces,
    thread: String,
    dir: std::path::PathBuf,
    /// `None`: nothing to put back.
    name: Option<String>,
}

impl Restore {
    async fn run(self) -> Result<(Option<String>, usize), RewindError> {
        let Some(name) = self.name else {
            return Ok((None, 0));
        };
        let (checkpoints, thread, dir, at) =
            (self.checkpoints, self.thread, self.dir, name.clone());
        let written = tokio::task::spawn_blocking(move || checkpoints.restore(&thread, &at, &dir))
            .await
            .map_err(|e| RewindError::Workspace(e.to_string()))?
            .map_err(|e| RewindError::Workspace(e.to_string()))?;
        tracing::info!(checkpoint = %name, written, "workspace put back to a checkpoint");
        Ok((Some(name), written))
    }
}

/// Where a transcript is cut: its messages' ids (each with whether it is a user's), and
/// the last message kept.
pub(super) struct Cut {
    messages: Vec<(String, bool)>,
    from: usize,
}

impl Cut {
    /// `transcript` keeping its first `keep` messages.
    pub(super) fn of(transcript: &[Message], keep: usize) -> Cut {
        Cut {
            messages: transcript
                .iter()
                .map(|m| (m.id().to_owned(), matches!(m, Message::User(_))))
                .collect(),
            from: keep.saturating_sub(1).min(transcript.len()),
        }
    }
}

/// The put-back that makes `thread`'s files as they were before the turn that followed
/// its kept messages (`cut`).
async fn files_to_restore(
    agent: &dyn Agent,
    thread: &str,
    cut: Cut,
) -> Result<Restore, RewindError> {
    let (dir, workspaces) = agent.workspace(thread).ok_or_else(no_checkpoints)?;
    let checkpoints = workspaces
        .checkpoints()
        .cloned()
        .ok_or_else(no_checkpoints)?;
    let (store, key) = (checkpoints.clone(), thread.to_owned());
    let listed = tokio::task::spawn_blocking(move || store.list(&key))
        .await
        .map_err(|e| RewindError::Workspace(e.to_string()))?
        .map_err(|e| RewindError::Workspace(e.to_string()))?;
    let taken: Vec<(String, Option<String>)> = listed
        .into_iter()
        .filter(|l| !l.name.ends_with("-after"))
        .map(|l| {
            let about: Value = serde_json::from_str(&l.about).unwrap_or_default();
            (l.name, about["messageId"].as_str().map(str::to_owned))
        })
        .collect();
    let name = checkpoint_before(&taken, &cut).map_err(|Gone| {
        RewindError::NoCheckpoints(
            "no checkpoint holds the files as they were then: the turn that followed came \
             before checkpoints were kept, or its checkpoint was let go (an agent keeps its \
             newest `checkpoints` turns')"
                .to_owned(),
        )
    })?;
    Ok(Restore {
        checkpoints,
        workspaces,
        thread: thread.to_owned(),
        dir,
        name,
    })
}

/// The workspace of `fork`, a new thread forked from thread `source` of `agent`: a copy of
/// `source`'s as it is now, put back (with `cut`, as for a rewind) to the checkpoint
/// before the turn that followed the fork's last message. An agent without workspaces of
/// each thread's own has none to copy (and, with `cut`, no checkpoints: refused).
pub(super) async fn fork_files(
    agent: &dyn Agent,
    source: &str,
    fork: &str,
    cut: Option<Cut>,
) -> Result<(), RewindError> {
    let (dir, workspaces, put_back) = match cut {
        Some(cut) => {
            let restore = files_to_restore(agent, source, cut).await?;
            let put_back = restore.name.map(|name| (restore.checkpoints, name));
            (restore.dir, restore.workspaces, put_back)
        }
        None => match agent.workspace(source) {
            Some((dir, workspaces)) if workspaces.config().unit == Unit::Thread => {
                (dir, workspaces, None)
            }
            _ => return Ok(()),
        },
    };
    let (principal, thread) = crate::access::split_key(fork);
    let to = workspaces.dir_for(principal, thread);
    let source = source.to_owned();
    tokio::task::spawn_blocking(move || {
        if !dir.exists() {
            workspaces.prepare(&dir)?;
        }
        workspaces.fork(&dir, &to)?;
        match put_back {
            Some((checkpoints, name)) => checkpoints.restore(&source, &name, &to).map(drop),
            None => Ok(()),
        }
    })
    .await
    .map_err(|e| RewindError::Workspace(e.to_string()))?
    .map_err(|e| RewindError::Workspace(e.to_string()))
}

/// No checkpoint is kept of before the turn that followed a cut.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Gone;

/// Of the checkpoints taken before turns (`(name, the message the turn answered)`, oldest
/// first), the one before the turn that followed `cut`: the turn of the first user message
/// from the last kept one on (a kept user message whose answer goes is one such turn); of
/// several turns that answered it (a regenerated answer), the latest. A user message on
/// the way with no checkpoint (a steering message, which lands inside a turn) is passed
/// over, but not one older than every checkpoint kept: that turn's checkpoint was let go,
/// or never taken ([`Gone`]). `None`: no turn followed, nothing to put back.
pub(super) fn checkpoint_before(
    taken: &[(String, Option<String>)],
    cut: &Cut,
) -> Result<Option<String>, Gone> {
    let place = |message: &Option<String>| {
        let id = message.as_deref()?;
        cut.messages.iter().position(|(m, _)| m == id)
    };
    // A turn starts at a user message, or at the input a checkpoint names (a tool result
    // that resumed the agent).
    let starts = |(id, user): &(String, bool)| {
        *user || taken.iter().any(|(_, m)| m.as_deref() == Some(id.as_str()))
    };
    let Some(first_turn) = cut.messages[cut.from..]
        .iter()
        .position(starts)
        .map(|at| cut.from + at)
    else {
        return Ok(None);
    };
    let oldest = taken
        .iter()
        .filter_map(|(_, m)| place(m))
        .min()
        .ok_or(Gone)?;
    if first_turn < oldest {
        return Err(Gone);
    }
    let first = taken
        .iter()
        .filter_map(|(_, m)| place(m))
        .filter(|at| *at >= first_turn)
        .min()
        .ok_or(Gone)?;
    Ok(taken
        .iter()
        .rev()
        .find(|(_, m)| place(m) == Some(first))
        .map(|(name, _)| name.clone()))
}

/// Whose history a request says it follows (`forwardedProps.agui.history`: `"client"`
/// is `Some(true)`, `"server"` `Some(false)`); `None` when it does not say (the agent's
/// `history` applies).
pub(super) fn client_owned(input: &RunAgentInput) -> Result<Option<bool>, InputError> {
    let value = input
        .forwarded_props
        .as_ref()
        .and_then(|props| props.get("agui"))
        .and_then(|agui| agui.get("history"));
    match value.map(|v| v.as_str()) {
        None => Ok(None),
        Some(Some("server")) => Ok(Some(false)),
        Some(Some("client")) => Ok(Some(true)),
        Some(_) => Err(InputError {
            field: Some("forwardedProps.agui.history".to_owned()),
            message: "must be \"client\" (the messages sent are the history) or \"server\" \
                      (the stored history wins, the default)"
                .to_owned(),
        }),
    }
}

/// Where a history the client owns (`sent`) parts from the stored `transcript`: the number
/// of stored messages to keep before the request runs, or `None` when it only adds to
/// them. Messages are matched by id, in order; stored messages a client keeps no copy of
/// (reasoning, or its own copy of a tool call under another id) may be skipped. A sent
/// user message whose text differs from the stored one of its id was edited: the stored
/// history ends before it. Sent messages that end inside the stored history (the last
/// answer dropped: "regenerate") keep what they name, less a last user message, which
/// then runs again.
pub(super) fn client_history_point(transcript: &[Message], sent: &[Message]) -> Option<usize> {
    // No messages at all is no history to follow (a thread is emptied by deleting it).
    if sent.is_empty() {
        return None;
    }
    let mut next = 0;
    for message in sent {
        let found = transcript[next..]
            .iter()
            .position(|m| m.id() == message.id())
            .map(|offset| next + offset);
        match found {
            Some(at) if edited(&transcript[at], message) => return Some(at),
            Some(at) => next = at + 1,
            // Already passed: the client holds it in another order (a steering message
            // it saw after the answer the transcript records it before).
            None if transcript[..next].iter().any(|m| m.id() == message.id()) => {}
            None if is_copy_of_stored_call(transcript, message) => {}
            None => return parts_at(transcript, next),
        }
    }
    parts_at(transcript, next)?;
    match sent.last() {
        Some(Message::User(last)) if transcript[next - 1].id() == last.id => Some(next - 1),
        _ => Some(next),
    }
}

/// `Some(next)` when the stored messages from `next` on hold one the client would have
/// had (it left them out on purpose); `None` when it lacks only what a client keeps no
/// copy of: a failed run's recorded error (the stream said `RUN_ERROR`), reasoning,
/// activity.
fn parts_at(transcript: &[Message], next: usize) -> Option<usize> {
    transcript[next.min(transcript.len())..]
        .iter()
        .any(|m| !kept_by_no_client(m))
        .then_some(next)
}

/// A stored message a client need not hold.
fn kept_by_no_client(message: &Message) -> bool {
    match message {
        Message::Reasoning(_) | Message::Activity(_) => true,
        Message::Assistant(a) => {
            a.id.contains("-error")
                && a.tool_calls.is_empty()
                && a.content
                    .as_deref()
                    .is_some_and(|c| c.starts_with("Error: "))
        }
        _ => false,
    }
}

/// A user message sent again with other text.
fn edited(stored: &Message, sent: &Message) -> bool {
    match (stored, sent) {
        (Message::User(stored), Message::User(sent)) => {
            stored.content.text() != sent.content.text()
        }
        _ => false,
    }
}

/// A client's copy of an assistant tool-call message the transcript holds under another
/// id: no text, and every call one the transcript has.
fn is_copy_of_stored_call(transcript: &[Message], message: &Message) -> bool {
    let Message::Assistant(copy) = message else {
        return false;
    };
    copy.content.as_deref().unwrap_or("").is_empty()
        && !copy.tool_calls.is_empty()
        && copy.tool_calls.iter().all(|call| {
            transcript.iter().any(|m| {
                matches!(m, Message::Assistant(a) if a.tool_calls.iter().any(|c| c.id == call.id))
            })
        })
}

/// The stored messages a client that sent history (some stored message) left out after
/// the first it sent: it is behind (another tab ran meanwhile). Empty for a client that
/// sends only its new input.
pub(super) fn unsent(transcript: &[Message], sent: &[Message]) -> Vec<String> {
    let ids: std::collections::HashSet<&str> = sent.iter().map(Message::id).collect();
    let Some(first) = transcript.iter().position(|m| ids.contains(m.id())) else {
        return Vec::new();
    };
    transcript[first..]
        .iter()
        .filter(|m| !ids.contains(m.id()))
        .filter(|m| {
            matches!(
                m,
                Message::User(_) | Message::Assistant(_) | Message::Tool(_)
            )
        })
        .filter(|m| {
            !sent
                .iter()
                .any(|s| is_copy_of_stored_call(std::slice::from_ref(m), s))
        })
        .map(|m| m.id().to_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn taken(list: &[(&str, Option<&str>)]) -> Vec<(String, Option<String>)> {
        list.iter()
            .map(|(n, m)| ((*n).to_owned(), m.map(str::to_owned)))
            .collect()
    }

    /// A transcript of ids (a `u` first letter: a user's), cut after `kept` messages.
    fn cut(ids: &[&str], kept: usize) -> Cut {
        Cut {
            messages: ids
                .iter()
                .map(|id| ((*id).to_owned(), id.starts_with('u')))
                .collect(),
            from: kept.saturating_sub(1),
        }
    }

    const SIX: [&str; 6] = ["u1", "a1", "u2", "a2", "u3", "a3"];

    #[test]
    fn the_checkpoint_is_the_one_before_the_turn_that_followed() {
        let taken = taken(&[
            ("1", Some("u1")),
            ("2", None),
            ("3", Some("u2")),
            ("4", Some("u3")),
        ]);
        // Kept through a1: the turn of u2 goes.
        assert_eq!(
            checkpoint_before(&taken, &cut(&SIX, 2)),
            Ok(Some("3".into()))
        );
        // Kept through u2 itself (its answer goes): the turn that answered u2.
        assert_eq!(
            checkpoint_before(&taken, &cut(&SIX, 3)),
            Ok(Some("3".into()))
        );
        // Kept through a2.
        assert_eq!(
            checkpoint_before(&taken, &cut(&SIX, 4)),
            Ok(Some("4".into()))
        );
        // Nothing followed.
        assert_eq!(checkpoint_before(&taken, &cut(&SIX, 6)), Ok(None));
        // Everything goes.
        assert_eq!(
            checkpoint_before(&taken, &cut(&SIX, 0)),
            Ok(Some("1".into()))
        );
    }

    #[test]
    fn a_regenerated_answer_puts_back_its_own_turn() {
        // u2 answered twice (the second after a rewind): the latest turn that answered it.
        let taken = taken(&[("1", Some("u1")), ("2", Some("u2")), ("5", Some("u2"))]);
        assert_eq!(
            checkpoint_before(&taken, &cut(&["u1", "a1", "u2", "a2"], 2)),
            Ok(Some("5".into()))
        );
    }

    #[test]
    fn a_turn_whose_checkpoint_was_let_go_is_refused_not_put_back_later() {
        // The checkpoints of u1's and u2's turns were let go: a cut after a1 cannot be
        // put back by u3's (that would keep what u2's turn did).
        let kept = taken(&[("3", Some("u3"))]);
        assert_eq!(checkpoint_before(&kept, &cut(&SIX, 2)), Err(Gone));
        assert_eq!(
            checkpoint_before(&kept, &cut(&SIX, 4)),
            Ok(Some("3".into()))
        );
        // A turn resumed by a tool result names that input.
        let resumed = taken(&[("1", Some("u1")), ("2", Some("t1")), ("3", Some("u2"))]);
        let tools = ["u1", "a1", "t1", "a2", "u2", "a3"];
        assert_eq!(
            checkpoint_before(&resumed, &cut(&tools, 2)),
            Ok(Some("2".into()))
        );
        // No checkpoint at all.
        assert_eq!(checkpoint_before(&[], &cut(&SIX, 2)), Err(Gone));
        // A steering message inside u1's turn has no checkpoint: passed over.
        let steered = ["u1", "a1", "us", "a1b", "u2", "a2"];
        let both = taken(&[("1", Some("u1")), ("2", Some("u2"))]);
        assert_eq!(
            checkpoint_before(&both, &cut(&steered, 2)),
            Ok(Some("2".into()))
        );
    }

    fn messages(list: serde_json::Value) -> Vec<Message> {
        serde_json::from_value(list).expect("messages")
    }

    fn stored() -> Vec<Message> {
        messages(json!([
            {"id": "u1", "role": "user", "content": "one"},
            {"id": "a1", "role": "assistant", "content": "One."},
            {"id": "u2", "role": "user", "content": "two"},
            {"id": "a2", "role": "assistant", "toolCalls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"id": "t1", "role": "tool", "toolCallId": "c1", "content": "done"},
            {"id": "a3", "role": "assistant", "content": "Two."},
        ]))
    }

    #[test]
    fn a_client_history_is_read_against_the_stored_one() {
        let stored = stored();
        let all = serde_json::to_value(&stored).expect("json");
        // The same history, or more after it: nothing to rewind.
        assert_eq!(client_history_point(&stored, &stored), None);
        let mut more = stored.clone();
        more.extend(messages(
            json!([{"id": "u3", "role": "user", "content": "three"}]),
        ));
        assert_eq!(client_history_point(&stored, &more), None);
        // Only new input: the history it owns is that (the first message edited).
        assert_eq!(client_history_point(&stored, &more[6..]), Some(0));
        // No messages at all rewinds nothing.
        assert_eq!(client_history_point(&stored, &[]), None);
        // A failed run's recorded error is no message a client holds: new input after it
        // only adds.
        let mut failed = stored.clone();
        failed.extend(messages(json!([
            {"id": "u3", "role": "user", "content": "three"},
            {"id": "r3-error", "role": "assistant", "content": "Error: the agent failed"},
        ])));
        let mut after = stored.clone();
        after.extend(messages(json!([
            {"id": "u3", "role": "user", "content": "three"},
            {"id": "u4", "role": "user", "content": "four"},
        ])));
        assert_eq!(client_history_point(&failed, &after), None);
        assert_eq!(
            client_history_point(&failed, &failed[..7]),
            None,
            "nothing left out"
        );
        // A steering message the client holds after the answer the transcript puts it
        // before: the same history.
        let steered = messages(json!([
            {"id": "u1", "role": "user", "content": "one"},
            {"id": "s1", "role": "user", "content": "steer"},
            {"id": "a1", "role": "assistant", "content": "One."},
            {"id": "u2", "role": "user", "content": "two"},
            {"id": "a2", "role": "assistant", "content": "Two."},
        ]));
        let client = serde_json::to_value(&steered).expect("json");
        let reordered = messages(
            json!([client[0], client[2], client[1], client[3], client[4],
            {"id": "u3", "role": "user", "content": "three"}]),
        );
        assert_eq!(client_history_point(&steered, &reordered), None);
        // The second message edited under a new id: kept through a1.
        let edited =
            messages(json!([all[0], all[1], {"id": "u2b", "role": "user", "content": "2"}]));
        assert_eq!(client_history_point(&stored, &edited), Some(2));
        // Edited under its own id.
        let in_place =
            messages(json!([all[0], all[1], {"id": "u2", "role": "user", "content": "2"}]));
        assert_eq!(client_history_point(&stored, &in_place), Some(2));
        // Regenerate: the answer to u2 dropped; u2 runs again.
        assert_eq!(client_history_point(&stored, &stored[..3]), Some(2));
        // The client's own copy of the tool call (another id) is the stored one.
        let copy = messages(json!([all[0], all[1], all[2],
            {"id": "mine", "role": "assistant", "toolCalls": all[3]["toolCalls"]},
            all[4], all[5]]));
        assert_eq!(client_history_point(&stored, &copy), None);
        // Reasoning the client keeps no copy of is skipped.
        assert_eq!(
            client_history_point(
                &stored,
                &messages(json!([all[0], all[2], all[3], all[4], all[5]]))
            ),
            None
        );
    }

    #[test]
    fn a_client_behind_is_told_what_it_did_not_send() {
        let stored = stored();
        let all = serde_json::to_value(&stored).expect("json");
        let behind =
            messages(json!([all[0], all[1], {"id": "u9", "role": "user", "content": "x"}]));
        assert_eq!(unsent(&stored, &behind), ["u2", "a2", "t1", "a3"]);
        let copy = messages(json!([all[0], all[1], all[2],
            {"id": "mine", "role": "assistant", "toolCalls": all[3]["toolCalls"]},
            all[4], all[5]]));
        assert!(unsent(&stored, &copy).is_empty());
        // A client that sends only its new input is not behind.
        let only_new = messages(json!([{"id": "u9", "role": "user", "content": "x"}]));
        assert!(unsent(&stored, &only_new).is_empty());
    }
}

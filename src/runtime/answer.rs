//! Requests on a thread whose run is suspended: resume with the answers, reject a bad
//! `resume[]` in-band, replay the suspended segment, or fail the waits closed because new
//! user input superseded them.

use std::sync::Arc;
use std::time::Duration;

use super::attach::{self, Attachment, Resume};
use super::suspension::{SUSPENSION_LOST, Suspension};
use super::{Control, LiveRun, NextSegment, Runtime, StartError, Thread, transcript_json};
use crate::clock::now_ms;
use crate::protocol::input::{Content, Message, ToolMessage};
use crate::protocol::{Event, Profile, RunAgentInput};
use crate::sync::lock;

/// How long new user input waits for a superseded (suspended) turn to finish before the
/// turn is cancelled.
pub(super) const SUPERSEDE_WAIT: Duration = Duration::from_secs(10);

/// What a request did to a suspended run.
pub(super) enum Answered {
    Resumed(Attachment),
    Rejected(Attachment),
    Replay,
    Superseded,
}

impl Runtime {
    /// A request on a thread whose run is suspended: resume it with the answers, reject a
    /// bad `resume[]`, replay the suspended segment (no new input), or fail the waits closed
    /// because new user input superseded them. The caller is in the decide section.
    pub(super) fn answer(
        &self,
        thread: &Arc<Thread>,
        run: &Arc<LiveRun>,
        input: &RunAgentInput,
        profile: Profile,
    ) -> Result<Answered, StartError> {
        let has_new_input = lock(&thread.state).has_new_input(input);
        let mut slot = lock(&run.suspension);
        let Some(suspension) = slot.as_ref() else {
            return Ok(Answered::Replay);
        };
        let new_messages: Vec<Message> = {
            let state = lock(&thread.state);
            input
                .messages
                .iter()
                .filter(|m| !state.seen.contains(m.id()))
                .cloned()
                .collect()
        };
        let resumes = if !input.resume.is_empty() {
            if let Err(message) = suspension.check_resume(&input.resume) {
                drop(slot);
                return Ok(Answered::Rejected(self.rejection(
                    thread,
                    input,
                    profile,
                    "INVALID_RESUME",
                    message,
                )));
            }
            true
        } else {
            suspension.answered_by_messages(&new_messages)
        };
        if !resumes && !has_new_input {
            return Ok(Answered::Replay);
        }
        if self
            .runs()
            .names_another(&thread.run_key(&input.run_id), run)
        {
            return Err(StartError::RunIdInUse);
        }
        // The waits stay locked until the pump has been told (below): a pump that ends
        // meanwhile takes what is left of them first, then opens the segment it was told
        // of, so an answer never waits on a pump that is gone.
        let Some(suspension) = slot.take() else {
            return Ok(Answered::Replay);
        };
        if !resumes {
            return Ok(self.supersede_waits(run, slot, suspension));
        }
        Ok(self.resume_with(
            thread,
            run,
            input,
            profile,
            (slot, suspension),
            &new_messages,
        ))
    }

    /// Whether `input` brings new input that answers none of `run`'s waits (it would
    /// supersede them).
    pub(super) fn would_supersede(
        &self,
        thread: &Thread,
        run: &LiveRun,
        input: &RunAgentInput,
    ) -> bool {
        if !input.resume.is_empty() {
            return false;
        }
        let new_messages: Vec<Message> = {
            let state = lock(&thread.state);
            if !state.has_new_input(input) {
                return false;
            }
            input
                .messages
                .iter()
                .filter(|m| !state.seen.contains(m.id()))
                .cloned()
                .collect()
        };
        lock(&run.suspension)
            .as_ref()
            .is_some_and(|suspension| !suspension.answered_by_messages(&new_messages))
    }

    /// New user input instead of the answer: the waits fail closed and the old turn
    /// finishes in a continuation segment of its own. The new input is not taken here: the
    /// run that starts after the old turn has ended takes it, as its own turn.
    fn supersede_waits(
        &self,
        run: &LiveRun,
        slot: Waits<'_>,
        suspension: Box<Suspension>,
    ) -> Answered {
        let why = "the user sent a new message instead of answering";
        run.control.send(Control::Resume(Box::new(NextSegment {
            run_id: suspension.segment_run_id.clone(),
            parent_run_id: None,
            abandoned: suspension.unanswered_calls(&[]),
            why: why.to_owned(),
            link: self.request_span(),
        })));
        drop(slot);
        suspension.fail_closed(why);
        Answered::Superseded
    }

    /// The answers resume the run: the request's new messages are stored, its run id
    /// becomes the next segment's, and the pump is told before the waits are resolved.
    fn resume_with(
        &self,
        thread: &Arc<Thread>,
        run: &Arc<LiveRun>,
        input: &RunAgentInput,
        profile: Profile,
        (slot, suspension): (Waits<'_>, Box<Suspension>),
        new_messages: &[Message],
    ) -> Answered {
        let recorded = lock(&thread.state).take_new(&input.messages);
        self.store()
            .record_messages(thread.key.as_str(), recorded, now_ms() as i64);
        lock(&run.aliases).push(input.run_id.clone());
        self.runs()
            .insert(thread.run_key(&input.run_id), run.clone());
        // The segment the answer opens starts after the suspended one's terminal frame,
        // which may not be journaled yet (it waits for the store).
        let cursor = thread.journal.last_seq();
        let attachment = self.attachment(
            thread,
            cursor,
            profile,
            Some(run.clone()),
            attach::Mode::NextSegment,
        );
        // The pump opens the next segment before the agent can act on the answers: it
        // handles control before it polls the agent again.
        run.control.send(Control::Resume(Box::new(NextSegment {
            run_id: input.run_id.clone(),
            parent_run_id: input.parent_run_id.clone(),
            abandoned: suspension.unanswered_calls(new_messages),
            why: "no answer was given".to_owned(),
            link: self.request_span(),
        })));
        drop(slot);
        suspension.resolve(new_messages, &input.resume);
        Answered::Resumed(attachment)
    }

    /// A stream that refuses a request in-band: `RUN_STARTED` then `RUN_ERROR` with `code`.
    /// Nothing is journaled.
    pub(super) fn rejection(
        &self,
        thread: &Arc<Thread>,
        input: &RunAgentInput,
        profile: Profile,
        code: &str,
        message: String,
    ) -> Attachment {
        let events = [
            Event::run_started(&thread.id, &input.run_id, input.parent_run_id.clone()),
            Event::RunError {
                message,
                code: Some(code.to_owned()),
                usage: None,
            },
        ];
        self.short_run(thread, profile, &events, Resume::Exact)
    }

    /// Refuses, in-band with `SUSPENSION_LOST`, a request whose only new messages answer
    /// client tool calls (`calls`) that nothing waits for any more (the server restarted,
    /// the wait timed out, the run was cancelled, another client answered): never a silent
    /// success. A call with no result yet gets one saying the answer was not delivered,
    /// committed before the refusal is shown; to a principal that may read the thread
    /// (`reads`) the refusal carries its messages (`MESSAGES_SNAPSHOT`), each call with the
    /// answer that stands.
    pub(super) async fn lost_answers(
        &self,
        thread: &Arc<Thread>,
        input: &RunAgentInput,
        profile: Profile,
        calls: Vec<String>,
        reads: bool,
    ) -> Attachment {
        // Calls another client (or an earlier request) already answered, and calls whose
        // wait ended unanswered: told apart, since the advice differs.
        let (recorded, answered) = {
            let mut state = lock(&thread.state);
            let mut recorded = Vec::new();
            let mut answered = Vec::new();
            for call in &calls {
                if let Some(by) = state.answer_of(call) {
                    if !by_the_daemon(call, by) {
                        answered.push(call.as_str());
                    }
                    continue;
                }
                let message = Message::Tool(ToolMessage {
                    id: lost_id(call),
                    content: Content::Text(
                        "not delivered: nothing was waiting for this answer any more".to_owned(),
                    ),
                    tool_call_id: call.clone(),
                    error: None,
                });
                state.seen.insert(message.id().to_owned());
                state.transcript.push(message.clone());
                recorded.push(message);
            }
            (recorded, answered)
        };
        if !recorded.is_empty() {
            self.store()
                .record_messages(thread.key.as_str(), recorded, now_ms() as i64);
            if let Err(error) = self.store().commit().await {
                tracing::error!(%error, "store commit failed");
            }
        }
        tracing::info!(thread.id = %thread.id, calls = ?calls, "answer to a wait that no longer exists refused");
        let lost: Vec<&str> = calls
            .iter()
            .map(String::as_str)
            .filter(|c| !answered.contains(c))
            .collect();
        let message = lost_message(&lost, &answered);
        if !reads {
            // A principal that may answer but not read the thread is told no more.
            return self.rejection(thread, input, profile, SUSPENSION_LOST, message);
        }
        // The thread as it is goes first: a page that applied its stale answer locally
        // (a card reading Deny) is shown the answer that counted, or "not delivered".
        let messages = transcript_json(&lock(&thread.state).transcript);
        let events = [
            Event::run_started(&thread.id, &input.run_id, input.parent_run_id.clone()),
            Event::MessagesSnapshot {
                messages: self.shown(&thread.key, messages),
            },
            Event::RunError {
                message,
                code: Some(SUSPENSION_LOST.to_owned()),
                usage: None,
            },
        ];
        self.short_run(thread, profile, &events, Resume::Exact)
    }
}

/// The id of the answer recorded for client call `call` that nothing waited for.
fn lost_id(call: &str) -> String {
    format!("{call}-lost")
}

/// Whether answer `id` of client call `call` is one the daemon recorded itself: the call's
/// wait ended unanswered (`-cancelled`, by the pump) or an answer came too late (`-lost`).
fn by_the_daemon(call: &str, id: &str) -> bool {
    id.strip_prefix(call)
        .is_some_and(|rest| rest == "-cancelled" || rest == "-lost")
}

/// What `SUSPENSION_LOST` tells the client: which calls were answered elsewhere (nothing to
/// do but read the thread), which ones nothing waits for any more (recorded as not
/// delivered; sending the same answer again cannot help, a new message goes on).
fn lost_message(lost: &[&str], answered: &[&str]) -> String {
    let mut parts = Vec::new();
    if !answered.is_empty() {
        parts.push(format!(
            "{} already answered on this thread (by another client or an earlier request), \
             so this answer was not used; read the thread's messages to see the answer given",
            answered.join(", ")
        ));
    }
    if !lost.is_empty() {
        parts.push(format!(
            "nothing is waiting for the answer to {} any more (the run that asked ended: the \
             server restarted, the wait timed out, or the run was cancelled) and it is \
             recorded as not delivered; sending it again cannot help: send a new message to \
             go on",
            lost.join(", ")
        ));
    }
    parts.join("; ")
}

/// A live run's open waits, locked.
type Waits<'a> = std::sync::MutexGuard<'a, Option<Box<Suspension>>>;

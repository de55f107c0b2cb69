//! Requests on a thread whose run is suspended: resume with the answers, reject a bad
//! `resume[]` in-band, replay the suspended segment, or fail the waits closed because new
//! user input superseded them.

use std::sync::Arc;
use std::time::Duration;

use super::attach::{self, Attachment, Resume};
use super::{Control, LiveRun, Runtime, StartError, Thread, lock, now_ms};
use crate::protocol::input::Message;
use crate::protocol::{Event, Profile, RunAgentInput};

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
    /// because new user input superseded them. The caller holds the decide lock.
    pub(super) fn answer(
        &self,
        thread: &Arc<Thread>,
        run: &Arc<LiveRun>,
        input: &RunAgentInput,
        profile: Profile,
        has_new_input: bool,
    ) -> Result<Answered, StartError> {
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
                return Ok(Answered::Rejected(
                    self.rejection(thread, input, profile, message),
                ));
            }
            true
        } else {
            suspension.answered_by_messages(&new_messages)
        };
        if !resumes && !has_new_input {
            return Ok(Answered::Replay);
        }
        if lock(&self.inner.runs)
            .get(&input.run_id)
            .is_some_and(|other| !Arc::ptr_eq(other, run))
        {
            return Err(StartError::RunIdInUse);
        }
        let Some(suspension) = slot.take() else {
            return Ok(Answered::Replay);
        };
        drop(slot);
        let recorded = lock(&thread.state).take_new(&input.messages);
        self.inner
            .store
            .record_messages(&thread.id, recorded, now_ms() as i64);
        if !resumes {
            // New user input instead of the answer: fail closed, let the old turn finish
            // in a continuation segment of its own.
            let run_id = suspension.segment_run_id.clone();
            let _ = run.control.send(Control::Resume {
                run_id,
                parent_run_id: None,
            });
            suspension.fail_closed("the user sent a new message instead of answering");
            return Ok(Answered::Superseded);
        }
        lock(&run.aliases).push(input.run_id.clone());
        lock(&self.inner.runs).insert(input.run_id.clone(), run.clone());
        let cursor = thread.journal.last_seq();
        let attachment = self.attachment(
            thread,
            cursor,
            profile,
            Some(run.clone()),
            attach::Mode::Segment,
        );
        // The pump opens the next segment before the agent can act on the answers: it
        // handles control before it polls the agent again.
        let _ = run.control.send(Control::Resume {
            run_id: input.run_id.clone(),
            parent_run_id: input.parent_run_id.clone(),
        });
        suspension.resolve(&new_messages, &input.resume);
        Ok(Answered::Resumed(attachment))
    }

    /// A stream that refuses a request in-band: `RUN_STARTED` then `RUN_ERROR`. Nothing is
    /// journaled and the thread is unchanged.
    pub(super) fn rejection(
        &self,
        thread: &Arc<Thread>,
        input: &RunAgentInput,
        profile: Profile,
        message: String,
    ) -> Attachment {
        let events = [
            Event::run_started(&thread.id, &input.run_id, input.parent_run_id.clone()),
            Event::RunError {
                message,
                code: Some("INVALID_RESUME".to_owned()),
                usage: None,
            },
        ];
        self.short_run(thread, profile, &events, Resume::Exact)
    }
}

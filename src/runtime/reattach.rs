//! The stream route: exact replay after a client's last event id, an explicit resync when
//! the id cannot be honoured, or a short hydration run when nothing is live.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::attach::{self, Attachment, Resume};
use super::{EventId, LiveRun, Runtime, Thread, transcript_json};
use super::{LoadError, ReattachError};
use crate::access::Principal;
use crate::clock::now_ms;
use crate::protocol::{Event, Profile};
use crate::sync::lock;

impl Runtime {
    /// Attaches to a thread's stream after `last_event_id` (the stream route): exact replay
    /// then live, or a resync preamble when the id cannot be honoured, or a hydration run
    /// when nothing is live and nothing is left to replay.
    pub async fn reattach(
        &self,
        thread_id: &str,
        last_event_id: Option<&str>,
    ) -> Result<Attachment, ReattachError> {
        self.reattach_as(&Principal::operator(), thread_id, last_event_id)
            .await
    }

    /// [`Runtime::reattach`] to thread `thread_id` of `principal`'s namespace; a thread of
    /// an agent the principal may not use is unknown.
    pub async fn reattach_as(
        &self,
        principal: &Principal,
        thread_id: &str,
        last_event_id: Option<&str>,
    ) -> Result<Attachment, ReattachError> {
        self.reattach_with(principal, thread_id, last_event_id, false)
            .await
    }

    /// [`Runtime::reattach_as`], and then every later run of the thread: the stream does
    /// not end with a run (`?follow=all`), so a page that stays open sees runs started
    /// elsewhere (another tab, `POST {path}/threads/{id}/runs`).
    pub async fn follow_thread_as(
        &self,
        principal: &Principal,
        thread_id: &str,
        last_event_id: Option<&str>,
    ) -> Result<Attachment, ReattachError> {
        self.reattach_with(principal, thread_id, last_event_id, true)
            .await
    }

    async fn reattach_with(
        &self,
        principal: &Principal,
        thread_id: &str,
        last_event_id: Option<&str>,
        every_run: bool,
    ) -> Result<Attachment, ReattachError> {
        let key = principal.key(thread_id);
        loop {
            let thread = self
                .load_thread(&key)
                .await
                .map_err(|error| match error {
                    LoadError::Store => ReattachError::Store,
                    LoadError::Elsewhere(owner) => ReattachError::Elsewhere(owner),
                })?
                .filter(|thread| principal.may_use(&thread.agent))
                .ok_or(ReattachError::UnknownThread)?;
            let _decide = thread.decide.lock().await;
            if thread.retired.load(Ordering::SeqCst) {
                // Deleted or evicted while this request waited: look again.
                continue;
            }
            let attachment = self.reattach_to(&thread, last_event_id);
            self.run_metrics().reattached(attachment.kind());
            return Ok(if every_run {
                attachment.following_every_run()
            } else {
                attachment
            });
        }
    }

    /// The reattach decision on `thread`, in its decide section.
    fn reattach_to(&self, thread: &Arc<Thread>, last_event_id: Option<&str>) -> Attachment {
        let (live, profile) = {
            let state = lock(&thread.state);
            (state.live.clone(), state.profile)
        };
        let cursor = last_event_id
            .and_then(EventId::parse)
            .and_then(|id| thread.journal.cursor_for(id).ok());
        // Without a usable cursor: `resync` when the client asked for one, else `exact`
        // (there was nothing to resume from).
        let without_cursor = if last_event_id.is_some() {
            Resume::Resync
        } else {
            Resume::Exact
        };
        match (cursor, live) {
            (Some(cursor), Some(run)) => {
                let attachment =
                    self.attachment(thread, cursor, profile, Some(run), attach::Mode::Follow);
                attachment.with_resume(Resume::Exact)
            }
            (Some(cursor), None) if cursor < thread.journal.last_seq() => {
                let attachment =
                    self.attachment(thread, cursor, profile, None, attach::Mode::Follow);
                attachment.with_resume(Resume::Exact)
            }
            (Some(_), None) => self.hydration(thread, profile, Resume::Exact),
            (None, Some(run)) => {
                let parked = lock(&run.suspension)
                    .as_ref()
                    .and_then(|s| Some((s.segment_run_id.clone(), s.terminal.clone()?)));
                let (started, ended) = {
                    let translator = lock(&run.translator);
                    (translator.is_started(), translator.is_ended())
                };
                match parked {
                    Some((run_id, terminal)) => {
                        self.snapshot_run(thread, &run_id, terminal, profile, without_cursor)
                    }
                    // The segment's RUN_STARTED is not journaled yet (it waits for its
                    // commit): follow from just before it, exactly.
                    None if !started => {
                        let cursor = run.segment_start.load(Ordering::SeqCst).saturating_sub(1);
                        self.attachment(thread, cursor, profile, Some(run), attach::Mode::Follow)
                            .with_resume(without_cursor)
                    }
                    // Between segments, or the run's terminal event is out and the run is
                    // about to be cleared: no segment is open to resync into.
                    None if ended => self.hydration(thread, profile, without_cursor),
                    None => self.resync(thread, run, profile, without_cursor, attach::Mode::Follow),
                }
            }
            (None, None) => self.hydration(thread, profile, without_cursor),
        }
    }

    /// RUN_STARTED + MESSAGES_SNAPSHOT + STATE_SNAPSHOT + re-opened items, then live.
    pub(super) fn resync(
        &self,
        thread: &Arc<Thread>,
        run: Arc<LiveRun>,
        profile: Profile,
        resume: Resume,
        mode: attach::Mode,
    ) -> Attachment {
        // Lock order: translator, then thread state (the pump's order).
        let translator = lock(&run.translator);
        if translator.is_ended() {
            // The segment's terminal event went out after the caller looked: following the
            // journal from here would wait for a frame that never comes. The thread as it is
            // now, as a complete run, instead.
            drop(translator);
            return self.hydration(thread, profile, resume);
        }
        let cursor = thread.journal.last_seq();
        let (messages, document) = {
            let state = lock(&thread.state);
            (
                transcript_json(&state.transcript),
                state.document.value(&thread.agent),
            )
        };
        let messages = self.shown(&thread.key, messages);
        let mut events = vec![
            Event::run_started(&thread.id, translator.run_id(), None),
            Event::MessagesSnapshot { messages },
            Event::StateSnapshot { snapshot: document },
        ];
        events.extend(translator.reopen());
        drop(translator);
        self.preamble(thread, cursor, profile, &events, Some(run), mode, resume)
    }

    /// A short run that hands the client the thread as it is: RUN_STARTED,
    /// MESSAGES_SNAPSHOT, STATE_SNAPSHOT, RUN_FINISHED.
    fn hydration(&self, thread: &Arc<Thread>, profile: Profile, resume: Resume) -> Attachment {
        let run_id = format!("hydrate-{}", uuid::Uuid::new_v4());
        let finished = Event::RunFinished {
            thread_id: thread.id.clone(),
            run_id: run_id.clone(),
            result: None,
            outcome: None,
            usage: None,
        };
        self.snapshot_run(thread, &run_id, finished, profile, resume)
    }

    /// RUN_STARTED, MESSAGES_SNAPSHOT, STATE_SNAPSHOT and `terminal`, then the stream
    /// ends. For a run parked on the client (to a stream with no cursor: a reloaded page),
    /// `terminal` is the suspended segment's own, with the pending calls or interrupts, so
    /// the client can answer; ids resume after the suspension, on the segment the answer
    /// starts.
    fn snapshot_run(
        &self,
        thread: &Arc<Thread>,
        run_id: &str,
        terminal: Event,
        profile: Profile,
        resume: Resume,
    ) -> Attachment {
        let (messages, document) = {
            let state = lock(&thread.state);
            (
                transcript_json(&state.transcript),
                state.document.value(&thread.agent),
            )
        };
        let messages = self.shown(&thread.key, messages);
        let events = [
            Event::run_started(&thread.id, run_id, None),
            Event::MessagesSnapshot { messages },
            Event::StateSnapshot { snapshot: document },
            terminal,
        ];
        self.short_run(thread, profile, &events, resume)
    }

    /// An attachment that sends `events` and ends. They carry the id of the journal's last
    /// segment boundary, not its end: a segment may be half written (a refusal while a
    /// suspension's terminal event waits for the store), and a client that reconnects with
    /// the id must get whole segments, from the start of that one.
    pub(super) fn short_run(
        &self,
        thread: &Arc<Thread>,
        profile: Profile,
        events: &[Event],
        resume: Resume,
    ) -> Attachment {
        let cursor = thread.journal.boundary();
        self.preamble(
            thread,
            cursor,
            profile,
            events,
            None,
            attach::Mode::Preamble,
            resume,
        )
    }

    /// An attachment that first sends `events` (each framed with the id of journal
    /// position `cursor`, so a reconnect with it resumes right after), then follows `mode`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn preamble(
        &self,
        thread: &Arc<Thread>,
        cursor: u64,
        profile: Profile,
        events: &[Event],
        run: Option<Arc<LiveRun>>,
        mode: attach::Mode,
        resume: Resume,
    ) -> Attachment {
        let now = now_ms();
        let frames = events
            .iter()
            .map(|e| thread.journal.frame_at(cursor, e, now, profile))
            .collect();
        self.attachment(thread, cursor, profile, run, mode)
            .with_preamble(frames, resume)
    }
}

//! Steering: new input on a running turn (`multitask = "steer"`) handed to the agent now,
//! where it takes input mid-turn (the turn goes on with it, and the input lands in the
//! stream and the transcript where the agent took it); else the input falls back to the
//! agent's `interrupt` strategy when that is its own, or to `enqueue`, and the run that
//! carries it says so.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::json;

use super::start::ThreadForRun;
use crate::access::{Capability, Principal};
use crate::agent::Multitask;
use crate::protocol::input::Message;
use crate::protocol::{Profile, RunAgentInput};
use crate::runtime::attach::Attachment;
use crate::runtime::live::{Control, LiveRun};
use crate::runtime::thread::Retry;
use crate::runtime::{CancelReason, Runtime, StartError};
use crate::sync::lock;

impl Runtime {
    /// What steering input on `agent`'s threads falls back to: `interrupt` when that is
    /// the agent's own strategy, else `enqueue`.
    pub(super) fn steer_fallback(&self, agent: &str) -> Multitask {
        match self.options().multitask.get(agent) {
            Some(Multitask::Interrupt) => Multitask::Interrupt,
            _ => Multitask::Enqueue,
        }
    }

    /// New input for `run`, the thread's running turn, with the steer strategy. The
    /// thread's decide section (`decide`) is let go while the agent is asked.
    pub(super) async fn steer(
        &self,
        found: &mut ThreadForRun,
        (principal, input, profile): (&Principal, &RunAgentInput, Profile),
        run: Arc<LiveRun>,
        decide: tokio::sync::MutexGuard<'_, ()>,
    ) -> Result<Result<Attachment, StartError>, Retry> {
        if !principal.can(Capability::Run) {
            return Ok(Err(StartError::Forbidden(Capability::Run)));
        }
        let thread = found.thread.clone();
        // Marked seen before the agent is asked, so the same input sent again meanwhile is
        // not handed over twice; unmarked if the agent does not take it.
        let new: Vec<Message> = {
            let mut state = lock(&thread.state);
            let new: Vec<Message> = state
                .peek_new(&input.messages)
                .into_iter()
                .map(|(_, m)| m.clone())
                .collect();
            for message in &new {
                state.seen.insert(message.id().to_owned());
            }
            new
        };
        if new.is_empty() {
            return Ok(Ok(self.segment_attachment(&thread, run, profile)));
        }
        drop(decide);
        let answer = found.backend.steer(thread.key.as_str(), new.clone()).await;
        let decide = thread.decide.lock().await;
        if thread.retired.load(Ordering::SeqCst) {
            return Err(Retry);
        }
        let reason = match answer {
            Ok(()) => {
                self.hand_over(&thread, &run, new);
                return Ok(Ok(self.segment_attachment(&thread, run, profile)));
            }
            Err(reason) => {
                let mut state = lock(&thread.state);
                for message in &new {
                    state.seen.remove(message.id());
                }
                self.sanitized(&reason)
            }
        };
        let fallback = self.steer_fallback(&thread.agent);
        tracing::info!(thread.id = %thread.id, %reason, fallback = fallback.name(), "steering fell back");
        let delivery = match fallback {
            Multitask::Interrupt => "interrupted",
            _ => "enqueued",
        };
        let marked = marked(input, delivery, &reason);
        if fallback == Multitask::Enqueue {
            let queued = self
                .enqueue(principal, &thread, &*found.backend, &marked, profile)
                .await;
            return Ok(queued);
        }
        run.cancel_with(CancelReason::Requested);
        drop(decide);
        run.finished.cancelled().await;
        // Decided again from scratch, as the input that says what happened.
        let agent = thread.agent.clone();
        loop {
            match Box::pin(self.decide_run(principal, &agent, &marked)).await {
                Ok(decided) => return Ok(decided),
                Err(Retry) => continue,
            }
        }
    }
}

impl Runtime {
    /// Input the agent took into `run`, already seen: while the run is live its pump
    /// records it where it landed (a run that ends records what it was handed, see
    /// `SegmentWriter`'s `Drop`); a run that ended meanwhile has it recorded after its
    /// output.
    fn hand_over(
        &self,
        thread: &Arc<crate::runtime::thread::Thread>,
        run: &Arc<LiveRun>,
        new: Vec<Message>,
    ) {
        let mut state = lock(&thread.state);
        if state
            .live
            .as_ref()
            .is_some_and(|live| Arc::ptr_eq(live, run))
        {
            run.control.send(Control::Steered(new));
        } else {
            state.transcript.extend(new.iter().cloned());
            // Stored in the order of the transcript: enqueued under its lock.
            self.store()
                .record_messages(thread.key.as_str(), new, crate::clock::now_ms() as i64);
            drop(state);
            thread.account();
        }
        tracing::info!(thread.id = %thread.id, run.id = %run.id, "input steered into the running turn");
    }
}

/// `input` with `forwardedProps.agui.steered` saying how it was delivered instead, with
/// this process's mark (see `steer_note.rs`).
fn marked(input: &RunAgentInput, delivery: &str, reason: &str) -> RunAgentInput {
    let mut marked = input.clone();
    let props = marked.forwarded_props.get_or_insert_with(|| json!({}));
    if !props.is_object() {
        *props = json!({});
    }
    if !props["agui"].is_object() {
        props["agui"] = json!({});
    }
    props["agui"]["steered"] =
        json!({"delivery": delivery, "reason": reason, "mark": super::steer_note::mark()});
    marked
}

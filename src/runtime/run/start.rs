//! A run's start: the decide step for a run request (attach, answer, supersede, refuse or
//! start), admission, and the spawn of the new run's pump.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tracing::Instrument;

use super::RunBudget;
use super::drive::{Launch, Pump, drive};
use super::inputs::{TurnInputs, record_start, turn_inputs};
use super::segment::SegmentWriter;
use crate::access::{Capability, Principal};
use crate::agent::{Agent, Turn};
use crate::agent::{Hitl, Multitask};
use crate::budget::Limits;
use crate::clock::now_ms;
use crate::protocol::InputError;
use crate::protocol::{Profile, RunAgentInput};
use crate::runtime::Resume;
use crate::runtime::Runtime;
use crate::runtime::admission::{Gate, Slot};
use crate::runtime::attach::{Attachment, Mode};
use crate::runtime::live::{DisconnectWatch, LiveRun};
use crate::runtime::thread::{Decision, Retry, Thread};
use crate::runtime::{CancelReason, StartError};
use crate::runtime::{LoadError, answer, attach, rewind};
use crate::sync::lock;
use crate::uploads::Resolved;

impl Runtime {
    /// One attempt of [`Runtime::start_run`]; `Err(Retry)` when the thread object it used
    /// left memory meanwhile (deleted or discarded) and the request must start over.
    /// The steps: the agent looked up and its use checked (once on the run's path), the
    /// thread found or created, its decide section entered, the thread's decision, then
    /// either the input queued for its turn or the decision carried out.
    pub(in crate::runtime) async fn decide_run(
        &self,
        principal: &Principal,
        agent: &str,
        input: &RunAgentInput,
    ) -> Result<Result<Attachment, StartError>, Retry> {
        // The agent looked up, and its use checked, once: what it alone reads of the input
        // is checked next, then the request's own choices.
        let Some(backend) = self.agent(agent).filter(|_| principal.may_use(agent)) else {
            return Ok(Err(StartError::UnknownAgent(agent.to_owned())));
        };
        if let Err(error) = backend.check_input(input) {
            return Ok(Err(StartError::Input(error)));
        }
        let strategy = match requested_multitask(input) {
            Ok(strategy) => strategy,
            Err(error) => return Ok(Err(StartError::Input(error))),
        };
        if let Err(error) = rewind::client_owned(input) {
            return Ok(Err(StartError::Input(error)));
        }
        let mut found = match self
            .thread_for_run(principal, (agent, backend), input)
            .await
        {
            Ok(found) => found,
            Err(error) => return Ok(Err(error)),
        };
        let profile = Profile::from_protocol_version(input.protocol_version.as_deref());
        let thread = found.thread.clone();
        let decide = thread.decide.lock().await;
        if thread.retired.load(Ordering::SeqCst) {
            return Err(Retry);
        }
        let decision = match decision(principal, &thread, input, profile) {
            Ok(decision) => decision,
            Err(error) => return Ok(Err(self.refused(&found, error))),
        };
        if self.waits_its_turn(&thread, strategy, &decision, input) {
            let queued = self
                .enqueue(principal, &thread, &*found.backend, input, profile)
                .await;
            return Ok(queued.map_err(|error| self.refused(&found, error)));
        }
        let decided = Decided {
            principal,
            input,
            profile,
            strategy,
            decide,
        };
        self.carry_out(&mut found, decided, decision).await
    }

    /// A refusal leaves nothing behind: a thread this request created is discarded, as
    /// long as nothing else has used it meanwhile.
    fn refused(&self, found: &ThreadForRun, error: StartError) -> StartError {
        self.threads()
            .discard_if_pristine(&found.thread, found.created);
        error
    }

    /// Whether new input on a live run waits its turn: where the strategy enqueues (on a
    /// run that waits on the client, input that answers nothing, instead of superseding
    /// it).
    fn waits_its_turn(
        &self,
        thread: &Arc<Thread>,
        strategy: Option<Multitask>,
        decision: &Decision,
        input: &RunAgentInput,
    ) -> bool {
        match decision {
            Decision::Busy {
                new_input: true, ..
            } => self.multitask(&thread.agent, strategy, true) == Multitask::Enqueue,
            Decision::Suspended(run) => {
                // A run that waits on the client takes no steering: its fallback applies.
                let strategy = match self.multitask(&thread.agent, strategy, true) {
                    Multitask::Steer => self.steer_fallback(&thread.agent),
                    other => other,
                };
                strategy == Multitask::Enqueue && self.would_supersede(thread, run, input)
            }
            _ => false,
        }
    }

    /// Carries out the thread's decision, in its decide section (`decided.decide`, let go
    /// before a wait on another run).
    async fn carry_out(
        &self,
        found: &mut ThreadForRun,
        decided: Decided<'_, '_>,
        decision: Decision,
    ) -> Result<Result<Attachment, StartError>, Retry> {
        let Decided {
            principal,
            input,
            profile,
            strategy,
            decide,
        } = decided;
        let thread = found.thread.clone();
        let attachment = match decision {
            Decision::Attach(run) => Ok(self.segment_attachment(&thread, run, profile)),
            Decision::Busy { run, new_input } => {
                let strategy = self.multitask(&thread.agent, strategy, new_input);
                if strategy == Multitask::Steer {
                    let request = (principal, input, profile);
                    return self.steer(found, request, run, decide).await;
                }
                Err(busy(principal, &run, strategy, decide).await?)
            }
            Decision::Suspended(run) => match self.answer(&thread, &run, input, profile) {
                Err(error) => Err(error),
                Ok(
                    answer::Answered::Resumed(attachment) | answer::Answered::Rejected(attachment),
                ) => Ok(attachment),
                Ok(answer::Answered::Replay) => Ok(self.segment_attachment(&thread, run, profile)),
                Ok(answer::Answered::Superseded) => {
                    // The wait happens outside the decide section.
                    drop(decide);
                    supersede(&run).await;
                    return Err(Retry);
                }
            },
            Decision::RejectResume { code, message } => {
                self.threads().discard_if_pristine(&thread, found.created);
                Ok(self.rejection(&thread, input, profile, code, message))
            }
            Decision::LostAnswers(calls) => {
                // Shown the thread as it is only when it may read the thread.
                let reads = principal.can(Capability::Read);
                Ok(self
                    .lost_answers(&thread, input, profile, calls, reads)
                    .await)
            }
            Decision::Start => {
                let backend = found.backend.clone();
                let permit = found.permit.take();
                self.start_new(principal, &thread, backend, input, profile, permit)
                    .await
            }
        };
        Ok(attachment.map_err(|error| self.refused(found, error)))
    }

    /// A new run of `input` on `thread`, decided in its decide section: its input checked
    /// (uploads read), admitted, started, and the uploads it named bound to the thread.
    pub(in crate::runtime) async fn start_new(
        &self,
        principal: &Principal,
        thread: &Arc<Thread>,
        backend: Arc<dyn Agent>,
        input: &RunAgentInput,
        profile: Profile,
        permit: Option<Slot>,
    ) -> Result<Attachment, StartError> {
        // A client that owns its history has the thread taken back to where it parts from
        // the stored one first (decided already: nothing else runs on the thread), so the
        // input is checked against the thread it runs on.
        let owned = rewind::client_owned(input).ok().flatten();
        if owned.unwrap_or_else(|| self.options().client_history.contains(&thread.agent)) {
            self.follow_client_history(principal, thread, input).await?;
        }
        let resolved = self
            .checked_input(principal, thread, &*backend, input)
            .await?;
        let budget = self.run_budget(principal, thread).await?;
        let attachment = {
            // The start gate is held until the pump is spawned.
            let (_gate, permit) = self.start_decided(principal, input, permit)?;
            start(
                self,
                thread,
                backend,
                input.clone(),
                profile,
                permit,
                &resolved,
                budget,
            )
        };
        if let Some(uploads) = &self.options().uploads
            && !resolved.is_empty()
        {
            uploads
                .bind(principal.owner(), &resolved, thread.key.as_str())
                .await;
        }
        Ok(attachment)
    }

    /// The budgets of a run `principal` starts on `thread` (`None`: none applies, and the
    /// run counts nothing); refused when the principal's day is spent.
    async fn run_budget(
        &self,
        principal: &Principal,
        thread: &Thread,
    ) -> Result<Option<Box<RunBudget>>, StartError> {
        let budgets = &self.options().budgets;
        let run = self
            .options()
            .agent_budgets
            .get(&thread.agent)
            .copied()
            .unwrap_or(budgets.run);
        // The operator's own runs have no day to spend.
        let day = match principal.budget() {
            Some(own) => *own,
            None if principal.is_capped() => budgets.principal,
            None => Limits::default(),
        };
        if run.is_empty() && day.is_empty() && budgets.thread.is_empty() && budgets.hard.is_empty()
        {
            return Ok(None);
        }
        let day_number = crate::budget::day_of(now_ms());
        let day_meter = self.days().meter(principal.owner(), day_number);
        // Seeded whatever the ceilings, so the day the fleet shows is the whole day.
        let store = &self.store();
        day_meter
            .seed(store.spent_on(principal.owner(), day_number))
            .await
            .map_err(|_| StartError::Store)?;
        // The day's ceiling shown is the principal's own (an operator's run on its behalf
        // has none of its own to show).
        if principal.budget().is_some() || principal.is_capped() {
            day_meter.started_under(day);
        }
        if let Some(reached) = day.reached(&day_meter.spent()) {
            return Err(StartError::BudgetExceeded(format!(
                "the principal's daily budget is spent ({reached}); it renews at 00:00 UTC"
            )));
        }
        let thread_before = lock(&thread.state)
            .document
            .changed()
            .and_then(|document| document.pointer("/budget/thread"))
            .and_then(|spent| serde_json::from_value(spent.clone()).ok())
            .unwrap_or_default();
        Ok(Some(Box::new(RunBudget::new(
            run,
            budgets.thread,
            thread_before,
            day,
            day_meter,
            principal.owner().to_owned(),
            day_number,
            budgets.hard,
        ))))
    }

    /// The strategy for new input (`new_input`: else only a `resume[]`) on a busy thread of
    /// `agent`: the request's, else the agent's, else `reject`.
    fn multitask(&self, agent: &str, requested: Option<Multitask>, new_input: bool) -> Multitask {
        requested
            .or_else(|| self.options().multitask.get(agent).copied())
            .unwrap_or_default()
            .when(new_input)
    }

    /// The uploads the messages new to `thread` name, read (an earlier message's were read
    /// when it was new: an upload removed since does not block the thread), and what
    /// `backend` cannot take refused, before anything starts.
    pub(in crate::runtime) async fn checked_input(
        &self,
        principal: &Principal,
        thread: &Thread,
        backend: &dyn Agent,
        input: &RunAgentInput,
    ) -> Result<Resolved, StartError> {
        let resolved = match &self.options().uploads {
            Some(uploads) => {
                let new = lock(&thread.state).peek_new(&input.messages);
                uploads
                    .resolve(principal.owner(), new)
                    .await
                    .map_err(StartError::Input)?
            }
            None => Resolved::default(),
        };
        // The agent is asked about the messages as it will get them.
        let applied;
        let messages = if resolved.is_empty() {
            &input.messages
        } else {
            let mut messages = input.messages.clone();
            resolved.apply(&mut messages);
            applied = messages;
            &applied
        };
        let new = lock(&thread.state).peek_new(messages);
        backend
            .check_new_messages(&new)
            .map_err(StartError::Input)?;
        Ok(resolved)
    }

    /// The thread a run request is for, found or (when the principal may create it, a
    /// slot is free and the run id unused) created, with the agent it runs on; a brand-new
    /// thread comes with its admission.
    async fn thread_for_run(
        &self,
        principal: &Principal,
        (agent, backend): (&str, &Arc<dyn Agent>),
        input: &RunAgentInput,
    ) -> Result<ThreadForRun, StartError> {
        let backend = backend.clone();
        let key = principal.key(&input.thread_id);
        let run_key = principal.run_key(&input.run_id);
        let existing = match self.load_thread(&key).await {
            Ok(existing) => existing,
            Err(LoadError::Store) => return Err(StartError::Store),
            Err(LoadError::Elsewhere(owner)) => return Err(StartError::Elsewhere(owner)),
        };
        if let Some(thread) = &existing
            && thread.agent != agent
        {
            return Err(agent_mismatch(principal, thread));
        }
        // A brand-new thread needs a slot and an unused run id before it may exist at all.
        let mut permit = None;
        if existing.is_none() {
            if !principal.can(Capability::Run) {
                return Err(StartError::Forbidden(Capability::Run));
            }
            if self.runs().contains(&run_key) {
                return Err(StartError::RunIdInUse);
            }
            permit = Some(self.admission().admit(principal)?);
        }
        // `created`: this request put the thread in memory (a racing request for the same
        // new id may have put its own there first; then this one uses that).
        let (thread, created) = match existing {
            Some(thread) => (thread, false),
            None => {
                let threads = self.threads();
                threads.insert(threads.new_thread(&key, agent, None, None))
            }
        };
        if thread.agent != agent {
            return Err(agent_mismatch(principal, &thread));
        }
        Ok(ThreadForRun {
            backend,
            thread,
            created,
            permit,
        })
    }

    /// The last checks of a run the decide step starts, under the start gate: not
    /// draining, the run id unused, a slot (the one a new thread came with, or a new one).
    /// The gate comes back held: the caller keeps it until the run's pump is spawned, so
    /// `drain` never misses a run it did not refuse.
    fn start_decided(
        &self,
        principal: &Principal,
        input: &RunAgentInput,
        permit: Option<Slot>,
    ) -> Result<(Gate<'_>, Slot), StartError> {
        let admission = self.admission();
        let gate = admission.gate()?;
        if self.runs().contains(&principal.run_key(&input.run_id)) {
            return Err(StartError::RunIdInUse);
        }
        let permit = match permit {
            Some(permit) => permit,
            None => admission.admit(principal)?,
        };
        Ok((gate, permit))
    }

    pub(in crate::runtime) fn attachment(
        &self,
        thread: &Arc<Thread>,
        cursor: u64,
        profile: Profile,
        run: Option<Arc<LiveRun>>,
        mode: attach::Mode,
    ) -> Attachment {
        Attachment::new(
            thread.source(),
            cursor,
            profile,
            mode,
            self.options().keep_alive,
            self.stop_token().clone(),
            run,
        )
        .counted(self.stream_metrics().open())
    }

    /// Attaches from the start of the live run's current segment: the journal replays it,
    /// then follows live.
    pub(in crate::runtime) fn segment_attachment(
        &self,
        thread: &Arc<Thread>,
        run: Arc<LiveRun>,
        profile: Profile,
    ) -> Attachment {
        let cursor = run.segment_start.load(Ordering::SeqCst).saturating_sub(1);
        let attachment = self.attachment(
            thread,
            cursor,
            profile,
            Some(run.clone()),
            attach::Mode::Segment,
        );
        if attachment.is_registered() {
            return attachment;
        }
        // The segment's start is no longer retained (a long segment nobody was reading):
        // the stream starts with a resync of the segment instead, never a cut.
        self.resync(thread, run, profile, Resume::Resync, attach::Mode::Segment)
    }
}

/// New input on a thread whose `run` is live: refused (the error), or the run interrupted,
/// waited for outside the decide section (`decide`), and the request decided again.
async fn busy(
    principal: &Principal,
    run: &LiveRun,
    strategy: Multitask,
    decide: tokio::sync::MutexGuard<'_, ()>,
) -> Result<StartError, Retry> {
    match strategy {
        Multitask::Reject | Multitask::Enqueue | Multitask::Steer => {
            Ok(StartError::RunInProgress(run.id.clone()))
        }
        // New input: the principal must be able to start runs.
        Multitask::Interrupt if !principal.can(Capability::Run) => {
            Ok(StartError::Forbidden(Capability::Run))
        }
        Multitask::Interrupt => {
            run.cancel_with(CancelReason::Requested);
            drop(decide);
            run.finished.cancelled().await;
            Err(Retry)
        }
    }
}

/// The multitask strategy a request chooses (`forwardedProps.agui.multitask`), if any.
fn requested_multitask(input: &RunAgentInput) -> Result<Option<Multitask>, InputError> {
    let Some(value) = input
        .forwarded_props
        .as_ref()
        .and_then(|props| props.get("agui"))
        .and_then(|agui| agui.get("multitask"))
    else {
        return Ok(None);
    };
    let field = Some("forwardedProps.agui.multitask".to_owned());
    match value.as_str() {
        Some(name) => Multitask::from_name(name)
            .map(Some)
            .map_err(|message| InputError { field, message }),
        None => Err(InputError {
            field,
            message: "must be a string: reject, interrupt, enqueue or steer".to_owned(),
        }),
    }
}

/// Starts a run on `thread`; the caller is in the thread's decide section and holds `permit`.
#[allow(clippy::too_many_arguments)]
pub(in crate::runtime) fn start(
    rt: &Runtime,
    thread: &Arc<Thread>,
    agent: Arc<dyn Agent>,
    input: RunAgentInput,
    profile: Profile,
    permit: Slot,
    uploads: &Resolved,
    budget: Option<Box<RunBudget>>,
) -> Attachment {
    let segment_start = thread.journal.next_seq();
    let options = rt.options();
    let hitl = options
        .hitl
        .get(&thread.agent)
        .copied()
        .unwrap_or(Hitl::Tool);
    let span = tracing::info_span!("run", thread.id = %thread.id, run.id = %input.run_id);
    let run = Arc::new(LiveRun::new(
        &input.run_id,
        &thread.id,
        &thread.agent,
        segment_start,
        DisconnectWatch {
            grace: options.disconnect_grace,
            tasks: rt.admission().tasks(),
            span: span.clone(),
        },
    ));
    let TurnInputs {
        new_messages,
        opening,
        rebuilt,
        session_id,
        document,
        tool_call_ids,
    } = turn_inputs(rt, thread, &run, &input);
    // A session to restore is restored while the run's start is committed.
    if let Some(session) = &session_id {
        agent.prepare(thread.key.as_str(), session);
    }
    record_start(rt, thread, &run, &new_messages);

    // Attached before the pump starts, so the disconnect watcher sees this stream.
    let attachment = rt.attachment(
        thread,
        segment_start.saturating_sub(1),
        profile,
        Some(run.clone()),
        Mode::Segment,
    );

    // The transcript keeps the parts as the client sent them; the agent gets the uploads'
    // data.
    let (mut messages, mut new_messages) = (rebuilt.unwrap_or(input.messages), new_messages);
    uploads.apply(&mut messages);
    uploads.apply(&mut new_messages);
    let turn = Turn {
        thread_id: thread.key.to_string(),
        run_id: run.id.clone(),
        messages,
        new_messages,
        tools: input.tools,
        context: input.context,
        client_state: input.state,
        forwarded_props: input.forwarded_props,
        session_id,
        document,
        tool_call_ids,
        cancel: run.cancel.child_token(),
    };
    let launch = Box::new(Launch {
        turn,
        parent_run_id: input.parent_run_id,
        opening,
    });
    let writer = SegmentWriter::first(rt, thread, &run, permit);
    let mut pump = Box::new(Pump::new(writer, hitl, options.suspend_timeout));
    pump.budget = budget;
    rt.admission()
        .spawn(drive(pump, agent, launch).instrument(span));
    attachment
}

/// What a run request found: its agent, its thread, whether the request created it, and
/// the admission a brand-new thread came with.
pub(super) struct ThreadForRun {
    pub(super) backend: Arc<dyn Agent>,
    pub(super) thread: Arc<Thread>,
    created: bool,
    permit: Option<Slot>,
}

/// What a decided request carries into its decision's execution.
struct Decided<'a, 'g> {
    principal: &'a Principal,
    input: &'a RunAgentInput,
    profile: Profile,
    strategy: Option<Multitask>,
    /// The thread's decide section, held.
    decide: tokio::sync::MutexGuard<'g, ()>,
}

/// The thread's decision on `input`, refused when the principal lacks what it needs.
fn decision(
    principal: &Principal,
    thread: &Thread,
    input: &RunAgentInput,
    profile: Profile,
) -> Result<Decision, StartError> {
    let mut state = lock(&thread.state);
    let decision = state.decide(input);
    if let Some(needed) = principal.caps().missing(state.needs(&decision, input)) {
        return Err(StartError::Forbidden(needed));
    }
    state.profile = profile;
    Ok(decision)
}

/// A thread of another agent, named unless the principal may not use it.
fn agent_mismatch(principal: &Principal, thread: &Thread) -> StartError {
    StartError::AgentMismatch(
        principal
            .may_use(&thread.agent)
            .then(|| thread.agent.clone()),
    )
}

/// New input superseded a suspended run: the old turn runs to its end with its waits
/// failed closed (cancelled if it does not end within the supersede wait); the new input
/// then starts a run of its own, decided afresh.
async fn supersede(run: &LiveRun) {
    if tokio::time::timeout(answer::SUPERSEDE_WAIT, run.finished.cancelled())
        .await
        .is_err()
    {
        run.cancel_with(CancelReason::Requested);
        // Bounded: a cancelled pump ends within its cancel bound.
        run.finished.cancelled().await;
    }
}

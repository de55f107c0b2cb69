//! What a new run takes from its thread as it becomes the thread's live run (its new
//! messages, the history owed to the client, the session, the state, the tool-call ids
//! used), and the record of its start.

use std::collections::HashSet;
use std::sync::Arc;

use serde_json::Value;

use crate::clock::now_ms;
use crate::protocol::{Message, RunAgentInput};
use crate::runtime::live::LiveRun;
use crate::runtime::run::segment::Opening;
use crate::runtime::thread::Thread;
use crate::runtime::{Runtime, notices, state};
use crate::sync::lock;

/// The newest messages of `transcript` that fit both bounds, in order.
pub(in crate::runtime) fn capped_history(
    transcript: &[Message],
    max_messages: usize,
    max_bytes: usize,
) -> Value {
    let mut kept = Vec::new();
    let mut bytes = 0;
    for message in transcript.iter().rev().take(max_messages) {
        let value = serde_json::to_value(message).unwrap_or(Value::Null);
        let size = value.to_string().len();
        if bytes + size > max_bytes && !kept.is_empty() {
            break;
        }
        bytes += size;
        kept.push(value);
    }
    kept.reverse();
    Value::Array(kept)
}

/// The ids of every tool call and tool result in `transcript`.
pub(in crate::runtime) fn tool_call_ids(transcript: &[Message]) -> HashSet<String> {
    let mut ids = HashSet::new();
    for message in transcript {
        match message {
            Message::Assistant(a) => ids.extend(a.tool_calls.iter().map(|c| c.id.clone())),
            Message::Tool(t) => {
                ids.insert(t.tool_call_id.clone());
            }
            _ => {}
        }
    }
    ids
}

/// A thread title from its first user message: one line, at most 80 characters.
pub(in crate::runtime) fn title_of(text: &str) -> String {
    let line = text.lines().next().unwrap_or("").trim();
    let mut title: String = line.chars().take(80).collect();
    if line.chars().count() > 80 {
        title.push('…');
    }
    title
}

/// What a new turn takes from its thread, taken as the run becomes the thread's live one.
pub(super) struct TurnInputs {
    /// The input's messages the thread has not seen.
    pub(super) new_messages: Vec<Message>,
    /// The transcript to replay to the client first, when one is owed, and the stored
    /// messages the client left out.
    pub(super) opening: Opening,
    /// The whole transcript, for an agent whose session a rewind let go (see `rewind.rs`).
    pub(super) rebuilt: Option<Vec<Message>>,
    pub(super) session_id: Option<String>,
    pub(super) document: Value,
    pub(super) tool_call_ids: HashSet<String>,
}

/// Makes `run` the thread's live run and takes what its turn needs, under the thread's
/// state lock; the client's state is applied to the document first.
pub(super) fn turn_inputs(
    rt: &Runtime,
    thread: &Thread,
    run: &Arc<LiveRun>,
    input: &RunAgentInput,
) -> TurnInputs {
    let options = rt.options();
    let mut state = lock(&thread.state);
    let unsent = crate::runtime::rewind::unsent(&state.transcript, &input.messages);
    let new_messages = state.take_new(&input.messages);
    state.live = Some(run.clone());
    if let Some(client) = &input.state {
        state::set_client(state.document.make_mut(&thread.agent), client);
    }
    let history = std::mem::take(&mut state.history_pending).then(|| {
        let history = capped_history(
            &state.transcript,
            options.history_max_messages,
            options.history_max_bytes,
        );
        rt.shown(&thread.key, history)
    });
    let steer = super::steer_note::fallback_note(input, &new_messages);
    let rebuilt = (state.rebuild && state.session_id.is_none()).then(|| state.transcript.clone());
    TurnInputs {
        new_messages,
        opening: Opening {
            history,
            unsent,
            steer,
        },
        rebuilt,
        session_id: state.session_id.clone(),
        document: state.document.value(&thread.agent),
        tool_call_ids: tool_call_ids(&state.transcript),
    }
}

/// Stores the run's start with its new input (committed before `RUN_STARTED` is
/// announced), names the thread after its first user message, and makes the run live.
pub(super) fn record_start(
    rt: &Runtime,
    thread: &Thread,
    run: &Arc<LiveRun>,
    new_messages: &[Message],
) {
    let title = new_messages.iter().find_map(|m| match m {
        Message::User(user) => Some(title_of(&user.content.text())),
        _ => None,
    });
    // Written only if this run's start creates the thread.
    let created = notices::created(rt, thread.key.as_str(), &thread.agent, Some(&run.id), "run");
    let reported = created.is_some();
    rt.store().record_run_start_notifying(
        thread.key.as_str(),
        &thread.agent,
        title,
        &run.id,
        new_messages.to_vec(),
        now_ms() as i64,
        created,
    );
    rt.outgoing_queued(reported);
    rt.runs().insert(thread.run_key(&run.id), run.clone());
    rt.fleet_changed();
}

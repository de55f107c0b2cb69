//! A thread: one conversation's journal, live run, transcript and shared state, and the
//! decision every run request on it gets.
//!
//! Decisions on a thread are made one at a time, in its *decide section* (the `decide`
//! lock): [`ThreadState::decide`] looks at the thread as it is and says what a request does
//! (attach, answer a suspension, refuse, start); the runtime then carries it out. Nothing
//! in the section waits on an agent or a timer: where a decision needs the live run to end
//! first (new input superseding a suspended turn, a delete), the request leaves the section,
//! waits, and decides again from scratch.

use std::collections::{BTreeSet, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::memory::{Meter, json_size};
use super::suspension::{PERMISSION_TOOL, SUSPENSION_LOST};
use super::{Journal, JournalLimits, LiveRun, state};
use crate::access::{Capability, Caps, ThreadKey};
use crate::clock::now_ms;
use crate::protocol::input::Message;
use crate::protocol::{Profile, RunAgentInput};
use crate::sync::lock;

/// What a run request does to a thread.
pub(super) enum Decision {
    /// No new input while a run produces: replay its current segment, then follow it.
    Attach(Arc<LiveRun>),
    /// The live run waits on the client: the request answers, replays or supersedes it.
    Suspended(Arc<LiveRun>),
    /// New input while a run produces: refused or the run interrupted, as the request's
    /// multitask strategy (or its agent's) says.
    Busy {
        run: Arc<LiveRun>,
        /// The request brings new input (not only a `resume[]`): only new input may
        /// interrupt.
        new_input: bool,
    },
    /// A `resume[]` with nothing suspended: refused in-band.
    RejectResume { code: &'static str, message: String },
    /// Only answers to client tool calls that nothing waits for any more (their ids):
    /// refused in-band with `SUSPENSION_LOST`.
    LostAnswers(Vec<String>),
    /// A new run with the request's new input.
    Start,
}

/// One conversation: its journal, its live run, and what it has seen.
pub(crate) struct Thread {
    /// Its key in its owner's namespace ([`crate::access::scoped_key`]): the key of the
    /// threads map, the store and the agent's session map.
    pub(crate) key: ThreadKey,
    /// The thread id the client chose (what the wire shows).
    pub(crate) id: String,
    pub(crate) agent: String,
    pub(crate) journal: Arc<Journal>,
    /// Last time a request used this thread (ms), for eviction.
    pub(super) last_used: AtomicU64,
    /// Serializes the decide-attach/refuse/start section and reattach decisions.
    pub(super) decide: tokio::sync::Mutex<()>,
    /// Set (under the threads map's lock) when this object left the map: deleted,
    /// discarded after a refusal, or evicted. A request that finds it set under the decide
    /// lock starts over, so it never acts on a thread object that is no longer the one.
    pub(super) retired: Arc<AtomicBool>,
    pub(super) state: Mutex<ThreadState>,
    /// The runtime's memory count, and this thread's transcript and document share of it
    /// as of the last [`Thread::account`].
    meter: Arc<Meter>,
    cached_bytes: AtomicUsize,
}

pub(super) struct ThreadState {
    pub(super) live: Option<Arc<LiveRun>>,
    /// Ids of every message the agent has been given or produced.
    pub(super) seen: HashSet<String>,
    /// The transcript, in order.
    pub(super) transcript: Vec<Message>,
    /// The shared state document.
    pub(super) document: state::Document,
    /// The first run this process serves on a stored thread starts with its history.
    pub(super) history_pending: bool,
    /// The client profile of the last request on this thread (for reattach).
    pub(super) profile: Profile,
    /// Interrupts that failed closed (a late resume for them is "expired", not "unknown").
    pub(super) expired_interrupts: BTreeSet<String>,
    /// The agent session bound to this thread, if any.
    pub(super) session_id: Option<String>,
    /// A rewind let the agent's session go: until a turn binds a new one, each turn gives
    /// the agent the whole transcript (see `rewind.rs`).
    pub(super) rebuild: bool,
    /// Input waiting for runs of its own, in order (see `queue.rs`).
    pub(super) queue: std::collections::VecDeque<Queued>,
    /// How many transcript messages [`Thread::account`] has sized, and their JSON bytes.
    sized: (usize, usize),
}

impl ThreadState {
    /// The messages of a request not seen before, now recorded as seen and appended to the
    /// transcript.
    ///
    /// The client's copy of an assistant tool-call message the agent produced (clients give
    /// it their own id) is marked seen but not recorded twice.
    pub(super) fn take_new(&mut self, messages: &[Message]) -> Vec<Message> {
        let mut new = Vec::new();
        for message in messages {
            if self.seen.contains(message.id()) {
                continue;
            }
            self.seen.insert(message.id().to_owned());
            if self.is_client_copy(message) {
                continue;
            }
            new.push(message.clone());
        }
        // Sized to what came: a thread's first request is most often one message, and a
        // vector's first growth makes room for four.
        new.shrink_to_fit();
        if self.transcript.capacity() == 0 {
            self.transcript.reserve_exact(new.len());
        }
        self.transcript.extend(new.iter().cloned());
        new
    }

    /// The transcript was cut: the next [`Thread::account`] sizes it anew.
    pub(super) fn resize(&mut self) {
        self.sized = (0, 0);
    }

    /// The messages of a request [`ThreadState::take_new`] would take, each with its index
    /// in `messages`; nothing is recorded.
    pub(super) fn peek_new<'m>(&self, messages: &'m [Message]) -> Vec<(usize, &'m Message)> {
        let mut ids = HashSet::new();
        messages
            .iter()
            .enumerate()
            .filter(|(_, m)| !self.seen.contains(m.id()) && ids.insert(m.id()))
            .filter(|(_, m)| !self.is_client_copy(m))
            .collect()
    }

    /// Whether `message` is the client's copy of an assistant tool-call message the agent
    /// produced (clients give it their own id): no text, and every call already seen.
    fn is_client_copy(&self, message: &Message) -> bool {
        matches!(message, Message::Assistant(assistant)
            if assistant.content.as_deref().unwrap_or("").is_empty()
                && !assistant.tool_calls.is_empty()
                && assistant.tool_calls.iter().all(|call| self.seen.contains(&call.id)))
    }
}

/// One item of a thread's queue (see `queue.rs`).
pub(super) struct Queued {
    /// The run id it starts with (also the item's id).
    pub(super) id: String,
    pub(super) seq: i64,
    /// Who sent it: its run is admitted, and its uploads read, as this principal's.
    pub(super) principal: crate::access::Principal,
    pub(super) input: RunAgentInput,
    pub(super) created_at: i64,
    /// The stream of the request that enqueued it, while that request is still there.
    pub(super) waiter: Option<tokio::sync::oneshot::Sender<super::Attachment>>,
    /// Its input's bytes, counted against the memory budget while it waits.
    pub(super) _charge: super::memory::Charge,
}

/// What the store holds of a thread: its transcript, and the state document its last run
/// left.
pub(super) type Stored = (Vec<Message>, Option<serde_json::Value>);

/// The thread object a request used left memory: start the request over.
pub(super) struct Retry;

pub(super) fn new_thread(
    key: &ThreadKey,
    agent: &str,
    epoch: u64,
    limits: JournalLimits,
    stored: Option<Stored>,
    session_id: Option<String>,
    meter: Arc<Meter>,
) -> Thread {
    let history_pending = stored.is_some();
    let (transcript, document) = stored.unwrap_or_default();
    Thread {
        key: key.clone(),
        id: key.split().1.to_owned(),
        agent: agent.to_owned(),
        journal: Arc::new(Journal::metered(epoch, limits, meter.clone())),
        last_used: AtomicU64::new(now_ms()),
        decide: tokio::sync::Mutex::new(()),
        retired: Arc::new(AtomicBool::new(false)),
        state: Mutex::new(ThreadState {
            live: None,
            seen: transcript.iter().map(|m| m.id().to_owned()).collect(),
            history_pending,
            transcript,
            document: state::Document::stored(document),
            profile: Profile::V1,
            expired_interrupts: BTreeSet::new(),
            session_id,
            rebuild: false,
            queue: std::collections::VecDeque::new(),
            sized: (0, 0),
        }),
        meter,
        cached_bytes: AtomicUsize::new(0),
    }
}

impl Thread {
    /// The key of run `run_id` of this thread in the runs map: its owner's namespace.
    pub(super) fn run_key(&self, run_id: &str) -> String {
        crate::access::scoped_key(self.owner(), run_id)
    }

    /// Its owner's namespace (`""`: the operator's).
    pub(crate) fn owner(&self) -> &str {
        crate::access::split_key(self.key.as_str()).0
    }

    /// Brings this thread's share of the memory count up to date with its transcript
    /// (only the messages added since the last call are sized) and its state document;
    /// returns the transcript and document bytes.
    pub(super) fn account(&self) -> usize {
        let bytes = {
            let mut state = lock(&self.state);
            let (counted, mut bytes) = state.sized;
            bytes += state.transcript[counted.min(state.transcript.len())..]
                .iter()
                .map(json_size)
                .sum::<usize>();
            state.sized = (state.transcript.len(), bytes);
            bytes + state.document.size(&self.agent)
        };
        let old = self.cached_bytes.swap(bytes, Ordering::Relaxed);
        self.meter.replace(old, bytes);
        bytes
    }

    /// Transcript and document bytes as of the last [`Thread::account`].
    pub(super) fn cached_bytes(&self) -> usize {
        self.cached_bytes.load(Ordering::Relaxed)
    }
}

impl Thread {
    /// What a stream attached to this thread reads of it.
    pub(super) fn source(&self) -> super::attach::Source {
        super::attach::Source {
            journal: self.journal.clone(),
            id: self.id.clone(),
            retired: self.retired.clone(),
        }
    }
}

impl Drop for Thread {
    fn drop(&mut self) {
        self.meter.sub(*self.cached_bytes.get_mut());
    }
}

impl ThreadState {
    /// What `input` does to the thread as it is now.
    pub(super) fn decide(&self, input: &RunAgentInput) -> Decision {
        let has_new_input = self.has_new_input(input);
        if let Some(run) = &self.live {
            if lock(&run.suspension).is_some() {
                return Decision::Suspended(run.clone());
            }
            if has_new_input || !input.resume.is_empty() {
                return Decision::Busy {
                    run: run.clone(),
                    new_input: has_new_input,
                };
            }
            return Decision::Attach(run.clone());
        }
        if let Some(first) = input.resume.first() {
            let expired = input
                .resume
                .iter()
                .find(|r| self.expired_interrupts.contains(&r.interrupt_id));
            return match expired {
                Some(r) => Decision::RejectResume {
                    code: "INVALID_RESUME",
                    message: format!(
                        "interrupt {:?} expired and can no longer be answered",
                        r.interrupt_id
                    ),
                },
                None => Decision::RejectResume {
                    code: SUSPENSION_LOST,
                    message: format!(
                        "nothing on this thread is waiting for interrupt {:?} (it was \
                         answered already, or its run ended: the server restarted, the wait \
                         timed out, or the run was cancelled); sending it again cannot help: \
                         read the thread, or send a new message to go on",
                        first.interrupt_id
                    ),
                },
            };
        }
        if let Some(calls) = self.lost_calls(input) {
            return Decision::LostAnswers(calls);
        }
        Decision::Start
    }

    /// The capabilities a request needs to have `decision` carried out: reading to follow
    /// a run, approving to answer one that waits (whatever else the request carries),
    /// running for new input (a new user message, or input that supersedes a wait). Checked
    /// before anything is carried out, so a refusal changes nothing.
    pub(super) fn needs(&self, decision: &Decision, input: &RunAgentInput) -> Caps {
        let only = |capability| Caps::NONE.with(capability);
        match decision {
            Decision::Busy { .. } => Caps::NONE,
            Decision::Attach(_) => only(Capability::Read),
            Decision::Suspended(run) => {
                let new: Vec<Message> = input
                    .messages
                    .iter()
                    .filter(|m| !self.seen.contains(m.id()))
                    .cloned()
                    .collect();
                // An answer may add the answering tool messages, one per wait, and
                // `resume[]` (and the client's copy of the agent's tool-call message),
                // nothing else: any other message it brings (a user's; a system, developer
                // or assistant message written into the history; a tool message for a call
                // nothing waits on, or a second answer to one) is new input.
                let suspension = lock(&run.suspension);
                let new_user_message = new
                    .iter()
                    .any(|m| !matches!(m, Message::Tool(_)) && !self.is_client_copy(m))
                    || suspension.as_ref().map_or_else(
                        || new.iter().any(|m| matches!(m, Message::Tool(_))),
                        |s| s.has_stray_tool_messages(&new),
                    );
                let answers = !input.resume.is_empty()
                    || suspension
                        .as_ref()
                        .is_some_and(|s| s.answered_by_messages(&new));
                drop(suspension);
                if answers && new_user_message {
                    only(Capability::Approve).with(Capability::Run)
                } else if answers {
                    only(Capability::Approve)
                } else if self.has_new_input(input) {
                    only(Capability::Run)
                } else {
                    only(Capability::Read)
                }
            }
            Decision::RejectResume { .. } | Decision::LostAnswers(_) => only(Capability::Approve),
            Decision::Start => only(Capability::Run),
        }
    }

    /// Whether nothing has happened on the thread yet: no run, no message.
    pub(super) fn is_pristine(&self) -> bool {
        self.live.is_none() && self.seen.is_empty() && self.transcript.is_empty()
    }

    /// Whether `input` carries a user or tool message the thread has not seen.
    pub(super) fn has_new_input(&self, input: &RunAgentInput) -> bool {
        input.messages.iter().any(|m| {
            matches!(m, Message::User(_) | Message::Tool(_)) && !self.seen.contains(m.id())
        })
    }

    /// The client tool calls answered by a request whose only new messages are such
    /// answers (with no live run, nothing waits for them); `None` for any other request.
    fn lost_calls(&self, input: &RunAgentInput) -> Option<Vec<String>> {
        let mut calls = Vec::new();
        for message in input
            .messages
            .iter()
            .filter(|m| !self.seen.contains(m.id()))
        {
            match message {
                Message::Tool(tool) if self.is_client_call(&tool.tool_call_id, input) => {
                    calls.push(tool.tool_call_id.clone());
                }
                message if self.is_client_copy(message) => {}
                _ => return None,
            }
        }
        (!calls.is_empty()).then_some(calls)
    }

    /// Whether `tool_call_id` is a call the client was asked to answer: a permission
    /// request, or a frontend tool the request declares.
    fn is_client_call(&self, tool_call_id: &str, input: &RunAgentInput) -> bool {
        self.transcript.iter().any(|m| match m {
            Message::Assistant(a) => a.tool_calls.iter().any(|call| {
                call.id == tool_call_id
                    && (call.function.name == PERMISSION_TOOL
                        || input.tools.iter().any(|t| t.name == call.function.name))
            }),
            _ => false,
        })
    }

    /// Whether the transcript holds a result for `tool_call_id`.
    /// The id of the message that answered `tool_call_id`, if one did.
    pub(super) fn answer_of(&self, tool_call_id: &str) -> Option<&str> {
        self.transcript.iter().find_map(|m| match m {
            Message::Tool(t) if t.tool_call_id == tool_call_id => Some(t.id.as_str()),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::access::Principal;

    #[test]
    fn peek_new_finds_what_take_new_takes() {
        let message = |value: serde_json::Value| -> Message {
            serde_json::from_value(value).expect("a message")
        };
        let stored = vec![
            message(json!({"id": "u1", "role": "user", "content": "hi"})),
            message(json!({"id": "a1", "role": "assistant", "toolCalls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]})),
        ];
        let thread = new_thread(
            &Principal::operator().key("t"),
            "agent",
            0,
            JournalLimits::default(),
            Some((stored.clone(), None)),
            None,
            Arc::new(Meter::default()),
        );
        let request = [
            stored[0].clone(),
            // The client's copy of the agent's tool call, under its own id.
            message(json!({"id": "copy", "role": "assistant", "toolCalls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]})),
            message(json!({"id": "u2", "role": "user", "content": "again"})),
            message(json!({"id": "u2", "role": "user", "content": "twice"})),
            message(json!({"id": "u3", "role": "user", "content": "more"})),
        ];
        let mut state = lock(&thread.state);
        // As a run records the agent's tool calls.
        state.seen.insert("c1".to_owned());
        let peeked: Vec<(usize, Message)> = state
            .peek_new(&request)
            .into_iter()
            .map(|(i, m)| (i, m.clone()))
            .collect();
        let taken = state.take_new(&request);
        assert_eq!(
            peeked.iter().map(|(i, _)| *i).collect::<Vec<_>>(),
            [2, 4],
            "indices into the request"
        );
        assert_eq!(
            peeked.into_iter().map(|(_, m)| m).collect::<Vec<_>>(),
            taken
        );
        assert!(state.peek_new(&request).is_empty(), "all seen now");
    }
}

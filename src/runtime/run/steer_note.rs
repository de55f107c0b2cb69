//! How steering input was delivered, as the stream says it (see `steer.rs`): the
//! `CUSTOM` event's name, and the note a run carries when its input fell back.

use serde_json::{Value, json};

use crate::protocol::RunAgentInput;
use crate::protocol::input::Message;

/// The `CUSTOM` event saying how steering input was delivered: `{"messageIds",
/// "delivery": "steered" | "enqueued" | "interrupted", "reason"?}`.
pub(in crate::runtime) const STEER_EVENT: &str = "agui.steer";

/// What a run's input says of steering that fell back (set by the daemon on the input it
/// enqueues or runs instead; `forwardedProps.agui.steered`).
pub(in crate::runtime) fn fallback_note(input: &RunAgentInput, new: &[Message]) -> Option<Value> {
    let note = input
        .forwarded_props
        .as_ref()?
        .get("agui")?
        .get("steered")?;
    // Only the daemon's own note, not one a client wrote.
    if note["mark"].as_str() != Some(mark()) {
        return None;
    }
    let ids: Vec<&str> = new.iter().map(Message::id).collect();
    Some(json!({"messageIds": ids, "delivery": note["delivery"], "reason": note["reason"]}))
}

/// A mark of this process's own, unknown to clients, that its notes carry.
pub(in crate::runtime) fn mark() -> &'static str {
    static MARK: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    MARK.get_or_init(|| uuid::Uuid::new_v4().simple().to_string())
}

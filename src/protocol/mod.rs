//! The AG-UI wire format and nothing else: typed events, request decoding, SSE framing, the
//! protobuf encoding and content negotiation.
//!
//! Architecture invariant: this module does no I/O and knows nothing of tokio or hyper. It is
//! the one place that knows what bytes go on the wire.

pub mod accept;
mod decode;
pub mod events;
pub mod input;
pub mod proto;
pub mod sse;

pub use accept::{Negotiated, Offer, negotiate};
pub use events::{Event, Outcome, TextRole};
pub use input::{InputError, Message, RunAgentInput, decode_run_input};
pub use sse::{KEEP_ALIVE, encode_event, event_frame, frame_into, sse_frame};

/// The AG-UI protocol version this server speaks.
pub const PROTOCOL_VERSION: &str = "1.0";

/// Which client generation a stream is encoded for.
///
/// A request body without `protocolVersion` comes from a pre-1.0 client (CopilotKit pins
/// `@ag-ui/client` 0.0.59). Its stream never carries `outcome:{type:"cancelled"}` (it gets
/// `RUN_ERROR{code:"cancelled"}` instead), `pendingToolCallIds`, nor `RUN_FINISHED.usage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Profile {
    V1,
    Legacy,
}

impl Profile {
    /// The profile implied by a request's `protocolVersion` field.
    pub fn from_protocol_version(version: Option<&str>) -> Profile {
        match version {
            None => Profile::Legacy,
            Some(_) => Profile::V1,
        }
    }

    /// Rewrites `event` into what this profile accepts; `None` when it needs no change.
    pub fn adapt(self, event: &Event) -> Option<Event> {
        if self == Profile::V1 {
            return None;
        }
        match event {
            Event::RunFinished {
                outcome: Some(Outcome::Cancelled),
                ..
            } => Some(Event::RunError {
                message: "run cancelled".to_owned(),
                code: Some("cancelled".to_owned()),
                usage: None,
            }),
            // `usage` is a 1.0 field: the pre-1.0 profile reads usage from state only.
            Event::RunFinished {
                thread_id,
                run_id,
                result,
                outcome,
                usage,
            } if usage.is_some() || matches!(outcome, Some(Outcome::Success { .. })) => {
                Some(Event::RunFinished {
                    thread_id: thread_id.clone(),
                    run_id: run_id.clone(),
                    result: result.clone(),
                    outcome: match outcome {
                        Some(Outcome::Success { .. }) => None,
                        other => other.clone(),
                    },
                    usage: None,
                })
            }
            _ => None,
        }
    }
}

//! The turn's token usage: what the model billed through the agent's relays, where it has
//! any (counted as it streamed, `exits.rs`), else as the agent reports it with its answer
//! to `session/prompt` (an unstable part of ACP: `unstable_end_turn_token_usage`).

use agent_client_protocol::v1::schema::{PromptResponse, Usage};
use serde_json::{Value, json};

use crate::agent::{EventSink, SinkClosed, Turn};
use crate::egress::ModelUsage;
use crate::protocol::events::TokenUsage;

/// The turn's token usage, from its relays (`relayed`: already counted against the run) or
/// the prompt's answer (an unstable ACP field): for `RUN_FINISHED.usage`, and added up in
/// the shared state (`/usage/turn`, the last turn's; `/usage/total`, the thread's so far).
pub(super) async fn note_usage(
    response: &PromptResponse,
    relayed: Option<ModelUsage>,
    turn: &Turn,
    sink: &EventSink,
) -> Result<Vec<TokenUsage>, SinkClosed> {
    let (reported, unbilled) = match (relayed, &response.usage) {
        (Some(billed), _) => (billed_usage(&billed), 0),
        (None, Some(usage)) => (token_usage(usage), usage.total_tokens),
        (None, None) => return Ok(Vec::new()),
    };
    let this_turn = serde_json::to_value(&reported).unwrap_or(Value::Null);
    let mut total = turn.document["usage"]["total"].clone();
    if !total.is_object() {
        total = json!({});
    }
    if let Value::Object(this_turn) = &this_turn {
        for (key, value) in this_turn {
            let sum = total[key].as_u64().unwrap_or(0) + value.as_u64().unwrap_or(0);
            total[key] = json!(sum);
        }
    }
    sink.set_state("/usage/turn", this_turn).await?;
    sink.set_state("/usage/total", total).await?;
    sink.report_usage(unbilled).await?;
    Ok(vec![reported])
}

/// What the model billed through the relays, in AG-UI's terms.
fn billed_usage(usage: &ModelUsage) -> TokenUsage {
    TokenUsage {
        input_tokens: Some(usage.input_tokens),
        output_tokens: Some(usage.output_tokens),
        total_tokens: Some(usage.total_tokens),
        cached_input_tokens: Some(usage.cache_read_tokens),
        cache_write_input_tokens: Some(usage.cache_write_tokens),
        ..TokenUsage::default()
    }
}

/// ACP `Usage` in AG-UI's terms.
fn token_usage(usage: &Usage) -> TokenUsage {
    TokenUsage {
        input_tokens: Some(usage.input_tokens),
        output_tokens: Some(usage.output_tokens),
        total_tokens: Some(usage.total_tokens),
        reasoning_tokens: usage.thought_tokens,
        cached_input_tokens: usage.cached_read_tokens,
        cache_write_input_tokens: usage.cached_write_tokens,
        ..TokenUsage::default()
    }
}

//! ACP form elicitation (`elicitation/create`) answered by a person at the client.

use agent_client_protocol::v1::schema::{
    CreateElicitationRequest, CreateElicitationResponse, ElicitationAcceptAction,
    ElicitationAction, ElicitationMode, ElicitationScope,
};
use serde_json::Value;

use super::Stop;
use super::router::ElicitationResponder;
use super::translate::UpdateTranslator;
use crate::agent::{AgentError, EventSink, InputAnswer, InputRequest};

/// Answers an `elicitation/create` request through the client: a form becomes a wait for
/// the person (an interrupt whose response schema is the form, or an `agui_input_request`
/// tool call); its values go back as `accept`, a refusal as `decline`, anything that fails
/// closed as `cancel`. URL elicitation is not offered (`initialize` advertises forms only),
/// so one is cancelled.
pub(super) async fn elicitation(
    request: CreateElicitationRequest,
    responder: Box<ElicitationResponder>,
    translator: &mut UpdateTranslator,
    sink: &EventSink,
) -> Result<(), Stop> {
    let action = match &request.mode {
        ElicitationMode::Form(form) => {
            let schema = serde_json::to_value(&form.requested_schema)
                .map_err(|e| AgentError::Backend(format!("ACP elicitation schema: {e}")))?;
            // Closed first: a call still settling opens now, so the form can name it.
            translator.close(sink).await?;
            let tool_call_id = match &form.scope {
                ElicitationScope::Session(scope) => scope
                    .tool_call_id
                    .as_ref()
                    .map(ToString::to_string)
                    .filter(|id| translator.is_open(id))
                    .map(|id| translator.wire_id(&id)),
                _ => None,
            };
            let answer = sink
                .request_input(InputRequest {
                    message: request.message.clone(),
                    schema,
                    tool_call_id,
                })
                .await?;
            match answer {
                InputAnswer::Accepted(values) => {
                    match serde_json::from_value(Value::Object(values)) {
                        Ok(content) => ElicitationAction::Accept(
                            ElicitationAcceptAction::new().content(Some(content)),
                        ),
                        Err(error) => {
                            tracing::warn!(%error, "form values do not fit the ACP types");
                            ElicitationAction::Cancel
                        }
                    }
                }
                InputAnswer::Declined => ElicitationAction::Decline,
                InputAnswer::Cancelled { reason } => {
                    tracing::info!(%reason, "form not answered; elicitation cancelled");
                    ElicitationAction::Cancel
                }
            }
        }
        _ => {
            tracing::info!("URL elicitation is not offered to the agent; cancelled");
            ElicitationAction::Cancel
        }
    };
    if let Err(error) = responder.respond(CreateElicitationResponse::new(action)) {
        tracing::debug!(%error, "elicitation answer not delivered");
    }
    Ok(())
}

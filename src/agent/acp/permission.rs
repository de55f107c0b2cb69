//! A permission request of the agent (`session/request_permission`): answered at once by
//! option kind (`permissions = "allow"|"deny"`), or asked of the client (`"ask"`) and the
//! chosen option sent back. A denial, a timeout or an answer naming no offered option picks
//! the request's reject option (the agent then tells its model the person refused);
//! `cancelled` is kept for a cancelled turn, as ACP means it, and for a request that offers
//! no option to pick.

use agent_client_protocol::v1::schema::{
    PermissionOptionKind, RequestPermissionOutcome, RequestPermissionRequest,
    RequestPermissionResponse, SelectedPermissionOutcome, ToolCallUpdate,
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::router::{self, PermissionResponder};
use super::translate::UpdateTranslator;
use super::{Inner, Permissions, Stop};
use crate::agent::{AgentError, EventSink, PermissionOption, PermissionOutcome, PermissionRequest};

impl Inner {
    /// Answers a permission request: at once by kind, or through the client.
    pub(super) async fn permission(
        &self,
        request: RequestPermissionRequest,
        responder: Box<PermissionResponder>,
        translator: &mut UpdateTranslator,
        cancel: &CancellationToken,
        sink: &EventSink,
    ) -> Result<(), Stop> {
        let reject = [
            PermissionOptionKind::RejectOnce,
            PermissionOptionKind::RejectAlways,
        ];
        let chosen = match self.config.permissions {
            Permissions::Allow => by_kind(
                &request,
                &[
                    PermissionOptionKind::AllowOnce,
                    PermissionOptionKind::AllowAlways,
                ],
            ),
            Permissions::Deny => by_kind(&request, &reject),
            Permissions::Ask => match self.ask(&request, translator, sink).await? {
                Some(option) => Some(option),
                None if cancel.is_cancelled() => None,
                None => by_kind(&request, &reject),
            },
        };
        let response = match chosen {
            Some(option_id) => RequestPermissionResponse::new(RequestPermissionOutcome::Selected(
                SelectedPermissionOutcome::new(option_id),
            )),
            None => router::cancelled(),
        };
        if let Err(error) = responder.respond(response) {
            tracing::debug!(%error, "permission answer not delivered");
        }
        Ok(())
    }

    /// Asks the client, after the tool call the request is about is on the stream; the
    /// option it chose (`None`: denied).
    async fn ask(
        &self,
        request: &RequestPermissionRequest,
        translator: &mut UpdateTranslator,
        sink: &EventSink,
    ) -> Result<Option<String>, Stop> {
        let options = offered(request);
        let tool_call = &request.tool_call;
        let acp_id = Some(tool_call.tool_call_id.to_string()).filter(|id| !id.is_empty());
        if acp_id.is_some() {
            settle_call(tool_call, translator, sink).await?;
        }
        translator.close(sink).await?;
        let about = acp_id.as_deref().and_then(|id| translator.describe(id));
        let tool_call_id = acp_id.map(|id| translator.wire_id(&id));
        let title = tool_call
            .fields
            .title
            .clone()
            .filter(|t| !t.is_empty())
            .unwrap_or_else(|| format!("{} asks for permission", self.name));
        let outcome = sink
            .request_permission(PermissionRequest {
                title,
                tool_call_id,
                tool_call: about,
                options: options.clone(),
            })
            .await?;
        Ok(match outcome {
            // The client names an option by id, or (a generic UI) by its kind.
            PermissionOutcome::Selected { option_id } => options
                .iter()
                .find(|o| o.option_id == option_id)
                .or_else(|| options.iter().find(|o| o.kind == option_id))
                .map(|o| o.option_id.clone()),
            PermissionOutcome::Denied { .. } => None,
        })
    }
}

/// The call a permission is about, opened on the stream (if it is not yet) with the
/// request's description of it merged over what the agent said before: its input has
/// settled. (Through JSON: the translator reads every update that way, see
/// `translate.rs`.)
async fn settle_call(
    tool_call: &ToolCallUpdate,
    translator: &mut UpdateTranslator,
    sink: &EventSink,
) -> Result<(), Stop> {
    let mut opening = serde_json::to_value(tool_call)
        .map_err(|e| AgentError::Backend(format!("ACP tool call: {e}")))?;
    opening["sessionUpdate"] = json!("tool_call_update");
    if let Some(map) = opening.as_object_mut() {
        map.remove("status");
    }
    translator.settle(&opening, sink).await?;
    Ok(())
}

/// The request's options, as the client is shown them.
fn offered(request: &RequestPermissionRequest) -> Vec<PermissionOption> {
    request
        .options
        .iter()
        .map(|o| PermissionOption {
            option_id: o.option_id.to_string(),
            name: o.name.clone(),
            kind: kind_name(o.kind).to_owned(),
        })
        .collect()
}

/// The first option of the request of one of `kinds`, in their order.
fn by_kind(request: &RequestPermissionRequest, kinds: &[PermissionOptionKind]) -> Option<String> {
    kinds.iter().find_map(|kind| {
        request
            .options
            .iter()
            .find(|o| o.kind == *kind)
            .map(|o| o.option_id.to_string())
    })
}

/// The wire name of a permission option kind (`allow_once`, ...), as clients match it.
fn kind_name(kind: PermissionOptionKind) -> &'static str {
    match kind {
        PermissionOptionKind::AllowOnce => "allow_once",
        PermissionOptionKind::AllowAlways => "allow_always",
        PermissionOptionKind::RejectOnce => "reject_once",
        PermissionOptionKind::RejectAlways => "reject_always",
        _ => "other",
    }
}

//! What the daemon says of itself: `/info` (CopilotKit's runtime-info shape), `/agents`,
//! `/healthz` and `/readyz`.

use http::header::HOST;
use http::{HeaderMap, Response, StatusCode};
use serde_json::json;

use super::App;
use super::common::json_response;
use crate::access::Principal;
use crate::http::body::Body;
use crate::http::error::ApiError;

pub(super) fn info(
    app: &App,
    principal: &Principal,
    headers: &HeaderMap,
    uri: &http::Uri,
    tls: bool,
) -> serde_json::Value {
    let scheme = if tls {
        "https"
    } else {
        match headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .map(|v| v.trim().to_ascii_lowercase())
            .as_deref()
        {
            Some("https") => "https",
            _ => "http",
        }
    };
    let host = headers
        .get(HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| uri.authority().map(|a| a.as_str().to_owned()))
        .filter(|h| valid_host(h));
    // Keyed by name: CopilotKit reads `agents` with `Object.entries`.
    let agents: serde_json::Map<String, serde_json::Value> = app
        .agents
        .iter()
        .filter(|(name, _)| principal.may_use(name))
        .map(|(name, description)| {
            let mut agent = json!({
                "name": name,
                "description": description,
                "className": "HttpAgent",
            });
            if let Some(host) = &host {
                let encoded =
                    percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC);
                agent["url"] = json!(format!("{scheme}://{host}{}/{encoded}", app.path));
            }
            (name.clone(), agent)
        })
        .collect();
    // The CopilotKit runtime-info shape (`RuntimeInfo` of @copilotkit/shared 1.74), then our
    // own fields. Of CopilotKit's thread endpoints the list is served (`{path}/threads`);
    // its inspect and mutation routes, suggestions, transcription and generative UI are
    // not, so they are advertised as off.
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "agents": agents,
        "mode": "sse",
        "threadEndpoints": {
            "list": true,
            "inspect": false,
            "mutations": false,
            "realtimeMetadata": false,
        },
        "suggestions": false,
        "audioFileTranscriptionEnabled": false,
        "a2uiEnabled": false,
        "openGenerativeUIEnabled": false,
        "telemetryDisabled": true,
        "protocol": "ag-ui",
        "protocolVersion": crate::protocol::PROTOCOL_VERSION,
        "path": app.path,
        "capabilities": {
            "frontendTools": true,
            "humanInTheLoop": true,
            "sharedState": true,
            "interrupts": true,
            "reattach": true,
        },
    })
}

/// A `Host` value we are willing to echo into URLs.
fn valid_host(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 255
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']' | '_'))
}

/// Each agent's last known state; for `auth_required`, the auth methods it offers.
pub(super) fn agents(app: &App, principal: &Principal) -> serde_json::Value {
    let statuses = app.runtime.agent_statuses();
    let agents: Vec<_> = app
        .agents
        .iter()
        .filter(|(name, _)| principal.may_use(name))
        .map(|(name, description)| {
            let mut agent = json!({"name": name, "description": description});
            if let Some((_, status)) = statuses.iter().find(|(n, _)| n == name)
                && let (Some(agent), Ok(serde_json::Value::Object(status))) =
                    (agent.as_object_mut(), serde_json::to_value(status))
            {
                agent.extend(status);
            }
            agent
        })
        .collect();
    json!({"agents": agents})
}

pub(super) fn healthz(app: &App) -> Response<Body> {
    let gauge = app.runtime.gauge();
    let draining = app.runtime.is_draining();
    json_response(
        StatusCode::OK,
        json!({
            "status": if draining { "draining" } else { "ok" },
            "version": env!("CARGO_PKG_VERSION"),
            "uptimeSeconds": app.runtime.uptime().as_secs(),
            "runs": {"active": gauge.active, "capacity": gauge.capacity},
            "draining": draining,
        }),
    )
}

pub(super) fn readyz(app: &App) -> Response<Body> {
    if app.runtime.is_draining() || !app.runtime.agents_ready() {
        return ApiError::not_ready();
    }
    json_response(StatusCode::OK, json!({"status": "ready"}))
}

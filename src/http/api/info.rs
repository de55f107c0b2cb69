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
    let (scheme, host) = origin(headers, uri, tls);
    // Keyed by name: CopilotKit reads `agents` with `Object.entries`.
    let agents: serde_json::Map<String, serde_json::Value> = app
        .agents
        .iter()
        .filter(|(name, _)| principal.may_use(name))
        .map(|(name, description)| {
            let base = host
                .as_ref()
                .map(|host| format!("{scheme}://{host}{}", app.path));
            (
                name.clone(),
                agent_entry(app, name, description, base.as_deref()),
            )
        })
        .collect();
    // The CopilotKit runtime-info shape (`RuntimeInfo` of @copilotkit/shared 1.74), then our
    // own fields. Of CopilotKit's thread endpoints the list (`{path}/threads`) and the
    // mutations (rename, archive, delete) are served; its inspect routes, suggestions,
    // transcription and generative UI are not, so they are advertised as off. The daemon
    // checks no CopilotKit license: its status is `unknown`, which CopilotKit's threads UI
    // takes as "ask the threads endpoint" (an absent status keeps it loading forever).
    let mut value = json!({
        "version": env!("CARGO_PKG_VERSION"),
        "agents": agents,
        "mode": "sse",
        "licenseStatus": "unknown",
        "threadEndpoints": {
            "list": true,
            "inspect": false,
            "mutations": true,
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
            "uploads": app.runtime.uploads().is_some(),
        },
    });
    if let Some(uploads) = app.runtime.uploads() {
        let limits = uploads.limits();
        let path = format!("{}/uploads", app.path.trim_end_matches('/'));
        value["uploads"] = json!({
            "url": match &host {
                Some(host) => format!("{scheme}://{host}{path}"),
                None => path,
            },
            "maxSize": limits.max_bytes,
            "types": limits.types,
        });
    }
    value
}

/// One agent of `/info`: its name, description, capabilities, what it may reach beyond
/// its sandbox (a confined ACP agent), and its URL under `base` (when the request's host
/// is known).
fn agent_entry(app: &App, name: &str, description: &str, base: Option<&str>) -> serde_json::Value {
    let mut agent = json!({
        "name": name,
        "description": description,
        "className": "HttpAgent",
    });
    if let Some((features, hitl)) = app.runtime.agent_features(name) {
        agent["capabilities"] = capabilities(name, description, &features, hitl, &app.path);
    }
    if let Some(reach) = app.runtime.agent_reach(name) {
        agent["reach"] = reach;
    }
    if let Some(base) = base {
        let encoded =
            percent_encoding::utf8_percent_encode(name, percent_encoding::NON_ALPHANUMERIC);
        agent["url"] = json!(format!("{base}/{encoded}"));
    }
    agent
}

/// The npm package (`clients/resume`) that resumes a cut stream for an AG-UI `HttpAgent`.
const RESUME_CLIENT: &str = "@agui-serve/resume";

/// An agent's capabilities in the AG-UI SDK's shape (`AgentCapabilities` of
/// `@ag-ui/core`): what the daemon does for every agent (transport, tools, state, human in
/// the loop), and what the agent's backend knows of it (identity, input kinds, reasoning).
/// A field the daemon does not know is left out: the SDK reads that as unknown.
fn capabilities(
    name: &str,
    description: &str,
    features: &crate::agent::Features,
    hitl: crate::agent::Hitl,
    path: &str,
) -> serde_json::Value {
    let mut identity = json!({
        "name": name,
        "type": format!("agui-serve/{}", features.kind),
        "description": description,
    });
    if let Some((provider, version)) = &features.made_by {
        identity["provider"] = json!(provider);
        if let Some(version) = version {
            identity["version"] = json!(version);
        }
    }
    let mut value = json!({
        "identity": identity,
        "transport": {
            "streaming": true,
            "websocket": false,
            // The protobuf encoding (`Accept: application/vnd.ag-ui.event+proto`).
            "httpBinary": true,
            "pushNotifications": false,
            // A cut stream is taken up again after its last event id (reattach).
            "resumable": true,
        },
        // How: the route a client reattaches to (with `Last-Event-ID`), and the client
        // package that does it for an `HttpAgent` (clients/resume, docs/resume.md).
        "custom": {"resume": {
            "stream": format!("{path}/threads/{{threadId}}/stream"),
            "client": RESUME_CLIENT,
        }},
        "tools": {"supported": true, "clientProvided": true},
        "state": {"snapshots": true, "deltas": true, "persistentState": true},
        "humanInTheLoop": {
            "supported": true,
            "approvals": true,
            "interrupts": hitl == crate::agent::Hitl::Interrupt,
            "approveWithEdits": false,
        },
    });
    if let Some(input) = features.input {
        value["multimodal"] = json!({"input": {
            "image": input.image,
            "audio": input.audio,
            "pdf": input.file,
            "file": input.file,
            "video": false,
        }});
    }
    if let Some(reasoning) = features.reasoning {
        value["reasoning"] = json!({"supported": reasoning, "streaming": reasoning});
    }
    if let Some(runs_code) = features.runs_code {
        value["execution"] = json!({"codeExecution": runs_code});
    }
    if let Some(subagents) = features.subagents {
        value["multiAgent"] = json!({"supported": subagents});
    }
    value
}

/// The scheme and host (when the request names one we will echo) that URLs in an answer
/// to this request start with: the `Host` header's, and the scheme of `X-Forwarded-Proto`
/// when a proxy says it, else the connection's; `X-Forwarded-Host` never counts.
pub(super) fn origin(
    headers: &HeaderMap,
    uri: &http::Uri,
    tls: bool,
) -> (&'static str, Option<String>) {
    // A proxy's word on how the client reached it wins either way (one serving plain HTTP
    // in front of a TLS daemon, too): a URL built from it only goes back to that client.
    let forwarded = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase());
    let scheme = match forwarded.as_deref() {
        Some("https") => "https",
        Some("http") => "http",
        _ if tls => "https",
        _ => "http",
    };
    let host = headers
        .get(HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| uri.authority().map(|a| a.as_str().to_owned()))
        .filter(|h| valid_host(h));
    (scheme, host)
}

/// A `Host` value we are willing to echo into URLs.
fn valid_host(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 255
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']' | '_'))
}

/// Each agent's last known state; for `auth_required`, the auth methods it offers; for
/// the operator, the spares ready of an agent that keeps them.
pub(super) fn agents(app: &App, principal: &Principal) -> serde_json::Value {
    let statuses = app.runtime.agent_statuses();
    let agents: Vec<_> = app
        .agents
        .iter()
        .filter(|(name, _)| principal.may_use(name))
        .map(|(name, description)| {
            let mut agent = json!({"name": name, "description": description});
            if let Some((_, status)) = statuses.iter().find(|(n, _)| n == name)
                && let (Some(agent), Ok(serde_json::Value::Object(mut status))) =
                    (agent.as_object_mut(), serde_json::to_value(status))
            {
                // Every principal's spares: the operator's to see.
                if !principal.is_operator() {
                    status.remove("spares");
                }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_take_the_scheme_a_proxy_names_and_else_the_connection_s() {
        let uri: http::Uri = "/agui/info".parse().expect("uri");
        let with = |proto: Option<&str>| {
            let mut headers = HeaderMap::new();
            headers.insert(HOST, "app.example:8080".parse().expect("host"));
            if let Some(proto) = proto {
                headers.insert("x-forwarded-proto", proto.parse().expect("proto"));
            }
            headers
        };
        for (proto, tls, scheme) in [
            (None, true, "https"),
            (None, false, "http"),
            (Some("http"), true, "http"),
            (Some("HTTPS"), false, "https"),
            (Some("gopher"), true, "https"),
        ] {
            let (got, host) = origin(&with(proto), &uri, tls);
            assert_eq!(
                (got, host.as_deref()),
                (scheme, Some("app.example:8080")),
                "{proto:?} {tls}"
            );
        }
    }
}

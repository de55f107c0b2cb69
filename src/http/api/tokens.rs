//! `POST {path}/tokens` (operator only): scoped tokens signed by the daemon.

use http::{Response, StatusCode};
use serde_json::json;

use super::App;
use super::common::{json_response, rfc3339};
use crate::access::{Capability, check_principal_name};
use crate::http::body::Body;
use crate::http::error::ApiError;

/// Longest lifetime of a minted token.
const MAX_MINTED_TTL_SECONDS: u64 = 24 * 3600;

/// `POST {path}/tokens` (operator only): a scoped token for a principal.
pub(super) fn mint(app: &App, body: &serde_json::Value) -> Result<Response<Body>, ApiError> {
    let Some(signer) = &app.access.signer else {
        return Err(ApiError::not_found("token signing key"));
    };
    let sub = sub_of(body)?;
    let ttl = ttl_of(body)?;
    let agents = names(body, "agents")?;
    if let Some(unknown) = agents
        .iter()
        .flatten()
        .find(|name| !app.agents.iter().any(|(a, _)| a == *name))
    {
        return Err(ApiError::invalid_input(
            format!("no agent named {unknown:?}"),
            Some("agents".to_owned()),
        ));
    }
    let capabilities = names(body, "capabilities")?;
    if let Some(unknown) = capabilities
        .iter()
        .flatten()
        .find(|name| Capability::from_name(name).is_none())
    {
        return Err(ApiError::invalid_input(
            format!("unknown capability {unknown:?}: expected run, read or approve"),
            Some("capabilities".to_owned()),
        ));
    }
    let budget = match body.get("budget") {
        None | Some(serde_json::Value::Null) => None,
        Some(budget) => Some(
            serde_json::from_value::<crate::budget::Limits>(budget.clone()).map_err(|e| {
                ApiError::invalid_input(
                    format!(
                        "budget must be {{\"tokens\"?, \"wall_time\"? (seconds), \"tool_calls\"?}}: {e}"
                    ),
                    Some("budget".to_owned()),
                )
            })?,
        ),
    };
    let (token, exp) = signer
        .mint(
            &sub,
            std::time::Duration::from_secs(ttl),
            agents,
            capabilities,
            budget,
        )
        .map_err(|error| {
            tracing::error!(%error, "token signing failed");
            ApiError::internal()
        })?;
    tracing::info!(
        target: "audit",
        principal = "operator",
        auth = "master-token",
        minted_for = %sub,
        ttl_seconds = ttl,
        "token minted"
    );
    Ok(json_response(
        StatusCode::OK,
        json!({"token": token, "expiresAt": rfc3339(exp as i64 * 1000)}),
    ))
}

/// The principal a token is minted for (`sub`), a valid principal name.
fn sub_of(body: &serde_json::Value) -> Result<String, ApiError> {
    let sub = match body.get("sub") {
        Some(serde_json::Value::String(sub)) => sub.clone(),
        _ => {
            return Err(ApiError::invalid_input(
                "sub must be a string naming the principal",
                Some("sub".to_owned()),
            ));
        }
    };
    check_principal_name(&sub).map_err(|problem| {
        ApiError::invalid_input(format!("sub {problem}"), Some("sub".to_owned()))
    })?;
    Ok(sub)
}

/// The token's lifetime in seconds (`ttlSeconds`, 900 when absent).
fn ttl_of(body: &serde_json::Value) -> Result<u64, ApiError> {
    match body.get("ttlSeconds") {
        None | Some(serde_json::Value::Null) => Ok(900),
        Some(value) => value
            .as_u64()
            .filter(|ttl| (1..=MAX_MINTED_TTL_SECONDS).contains(ttl))
            .ok_or_else(|| {
                ApiError::invalid_input(
                    format!("ttlSeconds must be an integer from 1 to {MAX_MINTED_TTL_SECONDS}"),
                    Some("ttlSeconds".to_owned()),
                )
            }),
    }
}

/// An optional array of strings (`agents`, `capabilities`).
fn names(body: &serde_json::Value, field: &str) -> Result<Option<Vec<String>>, ApiError> {
    match body.get(field) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .map(|item| item.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .map(Some)
            .ok_or_else(|| {
                ApiError::invalid_input(
                    format!("{field} must be an array of strings"),
                    Some(field.to_owned()),
                )
            }),
        Some(_) => Err(ApiError::invalid_input(
            format!("{field} must be an array of strings"),
            Some(field.to_owned()),
        )),
    }
}

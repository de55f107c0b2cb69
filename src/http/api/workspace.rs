//! The workspace routes: a thread's files as its agent left them, scoped like the thread
//! itself (another principal's thread is 404).
//!
//! - `GET {path}/threads/{id}/workspace?path=DIR`: a directory's entries.
//! - `GET {path}/threads/{id}/workspace/file?path=FILE`: a file's bytes, at most
//!   [`MAX_FILE`], served as text or octet-stream with `nosniff` and a sandboxing CSP.
//! - `GET {path}/threads/{id}/workspace/changes`: what changed against the source (a git
//!   diff, or the changed files with sizes).
//! - `GET {path}/threads/{id}/checkpoints`: the checkpoint taken before each turn, with
//!   the message it came before and the files the turn changed.
//!
//! Paths are relative to the workspace: `..`, absolute paths and symlinks that lead out are
//! refused (`crate::workspace` resolves them).

use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Response, StatusCode};
use serde_json::json;

use super::App;
use super::common::{json_response, query_param};
use super::threads::visible_thread;
use crate::access::Principal;
use crate::http::body::{Body, full};
use crate::http::error::ApiError;

/// Largest file served.
pub(super) const MAX_FILE: u64 = 1 << 20;
/// Largest diff text in a changes answer.
const MAX_DIFF: usize = 1 << 20;

/// Which workspace route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum WorkspaceRoute {
    List,
    File,
    Changes,
    Checkpoints,
}

/// Answers one workspace route for thread `id`.
pub(super) async fn serve(
    app: &App,
    principal: &Principal,
    id: &str,
    route: WorkspaceRoute,
    query: Option<&str>,
) -> Result<Response<Body>, ApiError> {
    let row = visible_thread(app, principal, id).await?;
    let Some((dir, workspaces)) = app.runtime.workspace(&row.agent, &row.key) else {
        return Err(ApiError::not_found(
            "workspace (the thread's agent has none)",
        ));
    };
    if !dir.exists() {
        return Err(ApiError::not_found(
            "workspace (the thread has not run yet)",
        ));
    }
    let path = query_param(query, "path").unwrap_or_default();
    let id = id.to_owned();
    let blocking = tokio::task::spawn_blocking(move || match route {
        WorkspaceRoute::List => crate::workspace::list(&dir, &path)
            .map(|entries| Answer::Json(json!({"threadId": id, "path": path, "entries": entries}))),
        WorkspaceRoute::File => crate::workspace::read(&dir, &path, MAX_FILE).map(Answer::File),
        WorkspaceRoute::Changes => workspaces
            .changes(&dir, MAX_DIFF)
            .map(|changes| Answer::Json(json!({"threadId": id, "changes": changes}))),
        WorkspaceRoute::Checkpoints => checkpoints(&workspaces, &row.key, &id),
    });
    let answer = blocking.await.map_err(|_| ApiError::internal())??;
    Ok(match answer {
        Answer::Json(value) => json_response(StatusCode::OK, value),
        Answer::File(bytes) => file_response(bytes),
    })
}

/// Checkpoints listed at most, the newest.
const MAX_CHECKPOINTS: usize = 200;

/// The checkpoints of thread `key` (`id` to the client): each taken before a turn, with
/// the run and message it came before, when, and the files that turn changed (with line
/// counts; `null` while the turn runs, or when it ended without its closing checkpoint).
fn checkpoints(
    workspaces: &crate::workspace::Workspaces,
    key: &crate::access::ThreadKey,
    id: &str,
) -> Result<Answer, crate::workspace::WorkspaceError> {
    let Some(store) = workspaces.checkpoints() else {
        return Ok(Answer::Json(json!({"threadId": id, "checkpoints": []})));
    };
    let listed = store.list(key.as_str())?;
    let closing: std::collections::HashSet<&str> = listed
        .iter()
        .filter_map(|l| l.name.strip_suffix("-after"))
        .collect();
    let before: Vec<_> = listed
        .iter()
        .filter(|l| !l.name.ends_with("-after"))
        .collect();
    let skip = before.len().saturating_sub(MAX_CHECKPOINTS);
    let mut out = Vec::new();
    for taken in before.into_iter().skip(skip) {
        let about: serde_json::Value = serde_json::from_str(&taken.about).unwrap_or_default();
        let files = if closing.contains(taken.name.as_str()) {
            json!(store.changes(key.as_str(), &taken.name, &format!("{}-after", taken.name))?)
        } else {
            serde_json::Value::Null
        };
        out.push(json!({
            "id": taken.name,
            "messageId": about["messageId"],
            "runId": about["runId"],
            // Named by the millisecond it was taken.
            "at": crate::clock::rfc3339(taken.name.parse().unwrap_or(taken.at * 1000)),
            "files": files,
        }));
    }
    Ok(Answer::Json(json!({"threadId": id, "checkpoints": out})))
}

enum Answer {
    Json(serde_json::Value),
    File(Vec<u8>),
}

/// A file's bytes: never rendered as a page of the daemon's origin.
fn file_response(bytes: Vec<u8>) -> Response<Body> {
    let text = std::str::from_utf8(&bytes).is_ok();
    let mut response = Response::new(full(bytes));
    let headers = response.headers_mut();
    headers.insert(
        CONTENT_TYPE,
        HeaderValue::from_static(if text {
            "text/plain; charset=utf-8"
        } else {
            "application/octet-stream"
        }),
    );
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        "content-security-policy",
        HeaderValue::from_static("default-src 'none'; sandbox"),
    );
    response
}

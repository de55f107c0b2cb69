//! The workspace routes: a thread's files as its agent left them, scoped like the thread
//! itself (another principal's thread is 404).
//!
//! - `GET {path}/threads/{id}/workspace?path=DIR`: a directory's entries.
//! - `GET {path}/threads/{id}/workspace/file?path=FILE`: a file's bytes, at most
//!   [`MAX_FILE`], served as text or octet-stream with `nosniff` and a sandboxing CSP.
//! - `GET {path}/threads/{id}/workspace/changes`: what changed against the source (a git
//!   diff, or the changed files with sizes).
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
    });
    let answer = blocking.await.map_err(|_| ApiError::internal())??;
    Ok(match answer {
        Answer::Json(value) => json_response(StatusCode::OK, value),
        Answer::File(bytes) => file_response(bytes),
    })
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

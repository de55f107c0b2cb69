//! `POST {path}/uploads`, `GET` and `DELETE {path}/uploads/{id}`: a principal's files for
//! its messages (see [`crate::uploads`]).

use std::time::Duration;

use http::header::{CACHE_CONTROL, CONTENT_LENGTH, CONTENT_TYPE, LOCATION};
use http::{HeaderValue, Request, Response, StatusCode};
use serde_json::json;

use super::App;
use super::common::{json_response, query_param};
use crate::access::Principal;
use crate::http::body::{Body, RequestBody, empty};
use crate::http::error::ApiError;
use crate::http::transport::ConnInfo;
use crate::uploads::Uploads;

/// The shortest time an upload's body is given to arrive.
const MIN_UPLOAD_TIME: Duration = Duration::from_secs(120);

fn uploads(app: &App) -> Result<&Uploads, ApiError> {
    app.runtime
        .uploads()
        .map(|u| &**u)
        .ok_or_else(|| ApiError::not_found("route"))
}

/// Stores the request's body as a new upload of `principal`: 201 with its id and URL.
pub(super) async fn create(
    app: &App,
    principal: &Principal,
    req: Request<RequestBody>,
    conn: &ConnInfo,
) -> Result<Response<Body>, ApiError> {
    let uploads = uploads(app)?;
    let (parts, body) = req.into_parts();
    let Some(content_type) = parts
        .headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
        return Err(ApiError::from(crate::uploads::UploadError::Type(
            String::new(),
        )));
    };
    let declared = parts
        .headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let filename = query_param(parts.uri.query(), "filename");
    let time = conn.limits.body_read_timeout.max(MIN_UPLOAD_TIME);
    let put = uploads.put(principal.owner(), content_type, filename, declared, body);
    let upload = tokio::time::timeout(time, put)
        .await
        .map_err(|_| ApiError::request_timeout(time))?
        .map_err(ApiError::from)?;
    let (scheme, host) = super::info::origin(&parts.headers, &parts.uri, conn.tls);
    let path = uploads.url_path(&upload.id);
    let url = match host {
        Some(host) => format!("{scheme}://{host}{path}"),
        None => path.clone(),
    };
    let (preview, expires) = uploads.preview(principal.owner(), &upload.id);
    let mut response = json_response(
        StatusCode::CREATED,
        json!({
            "id": upload.id,
            "url": url,
            "previewUrl": format!("{url}?{preview}"),
            "previewExpiresAt": crate::clock::rfc3339(expires as i64 * 1000),
            "size": upload.size,
            "contentType": upload.content_type,
        }),
    );
    if let Ok(location) = HeaderValue::from_str(&path) {
        response.headers_mut().insert(LOCATION, location);
    }
    Ok(response)
}

/// Upload `id`'s bytes, with its type.
pub(super) async fn get(
    app: &App,
    principal: &Principal,
    id: &str,
) -> Result<Response<Body>, ApiError> {
    let uploads = uploads(app)?;
    let Some(upload) = uploads.get(principal.owner(), id).await else {
        return Err(ApiError::not_found("upload"));
    };
    file_response(&upload, &uploads.file(principal.owner(), id)).await
}

/// `GET {path}/uploads/{id}?owner=&expires=&signature=` with no token: the upload a link
/// shows (see [`crate::uploads::Uploads::preview`]); 403 for a link that is altered,
/// expired or another daemon's, 404 when the upload is gone.
pub(super) async fn preview(app: &App, id: &str, query: &str) -> Result<Response<Body>, ApiError> {
    let uploads = uploads(app)?;
    match uploads.previewed(id, query).await {
        Ok(Some((upload, path))) => file_response(&upload, &path).await,
        Ok(None) => Err(ApiError::not_found("upload")),
        Err(error) => Err(ApiError::forbidden_link(error)),
    }
}

/// An upload's bytes, with its type, never to be run as a page; read from the file as they
/// are sent.
async fn file_response(
    upload: &crate::uploads::Upload,
    path: &std::path::Path,
) -> Result<Response<Body>, ApiError> {
    let file = tokio::fs::File::open(path)
        .await
        .map_err(|_| ApiError::not_found("upload"))?;
    let size = file
        .metadata()
        .await
        .map_err(|_| ApiError::not_found("upload"))?
        .len();
    let mut response = Response::new(crate::http::body::file_body(file));
    let headers = response.headers_mut();
    headers.insert(CONTENT_LENGTH, HeaderValue::from(size));
    if let Ok(value) = HeaderValue::from_str(&upload.content_type) {
        headers.insert(CONTENT_TYPE, value);
    }
    // Never rendered as anything but what it says it is, nor run as a page.
    headers.insert(
        "x-content-type-options",
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        "content-security-policy",
        HeaderValue::from_static("default-src 'none'; sandbox"),
    );
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("private, no-store"));
    Ok(response)
}

/// Removes upload `id`: 204, or 404 when `principal` has no such upload.
pub(super) async fn delete(
    app: &App,
    principal: &Principal,
    id: &str,
) -> Result<Response<Body>, ApiError> {
    if uploads(app)?.delete(principal.owner(), id).await {
        let mut response = Response::new(empty());
        *response.status_mut() = StatusCode::NO_CONTENT;
        Ok(response)
    } else {
        Err(ApiError::not_found("upload"))
    }
}

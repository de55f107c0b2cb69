//! The built-in operator console: one static page, its scripts (ES modules) and its style,
//! embedded in the binary (no build step, nothing downloaded). The page itself needs no token; it asks
//! for one and uses it for its API calls, which are authenticated like any other. A strict
//! content security policy allows only these files and calls to this origin, and the
//! script renders everything it shows as text.

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, REFERRER_POLICY, X_CONTENT_TYPE_OPTIONS};
use http::{HeaderValue, Response};

use crate::http::body::{Body, full};

const PAGE: &str = include_str!("console/index.html");
const SCRIPT: &str = include_str!("console/app.js");
const VIEW: &str = include_str!("console/view.js");
const THREAD: &str = include_str!("console/thread.js");
const WAITS: &str = include_str!("console/waits.js");
const STYLE: &str = include_str!("console/app.css");

const POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// The console's file `name` (`None`: the page), if there is one.
pub(super) fn asset(name: Option<&str>) -> Option<Response<Body>> {
    let (content, media) = match name {
        None => (PAGE, "text/html; charset=utf-8"),
        Some("app.js") => (SCRIPT, "text/javascript; charset=utf-8"),
        Some("view.js") => (VIEW, "text/javascript; charset=utf-8"),
        Some("thread.js") => (THREAD, "text/javascript; charset=utf-8"),
        Some("waits.js") => (WAITS, "text/javascript; charset=utf-8"),
        Some("app.css") => (STYLE, "text/css; charset=utf-8"),
        Some(_) => return None,
    };
    let mut response = Response::new(full(Bytes::from_static(content.as_bytes())));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(media));
    headers.insert("content-security-policy", HeaderValue::from_static(POLICY));
    headers.insert(X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Some(response)
}

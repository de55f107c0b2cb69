//! Who may call: bearer token (constant-time) or scoped token (JWT), the trusted principal
//! header, origin allow-list, CORS.
//!
//! No `Origin` header: no check (server-to-server callers such as a reverse proxy). With one,
//! it must be the daemon's own origin (a page it served itself: the console; its host and
//! port are the request's `Host`), equal an allowed origin (case-insensitive), or the list
//! must hold `*`. Allowing the daemon's own origin gives nothing away: every call still
//! needs the token, which a page of another origin cannot read.

use http::header::{
    ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE, AUTHORIZATION, ORIGIN, VARY,
};
use http::{HeaderMap, HeaderValue};
use subtle::ConstantTimeEq;

use crate::access::BearerToken;
use crate::access::jwt::{Signer, Verifier};
use crate::access::{Caps, Principal, Via, check_principal_name};
use crate::http::error::ApiError;

/// How requests are authenticated.
#[derive(Debug, Clone)]
pub enum Auth {
    /// Every authenticated route requires this token.
    Token(BearerToken),
    /// A token is required but none could be configured: every authenticated route fails
    /// closed with 500. Only reachable through the library API.
    Misconfigured,
}

/// How principals other than the operator are recognized.
#[derive(Debug)]
pub struct Access {
    /// Verifies scoped tokens.
    pub verifier: Verifier,
    /// Signs the tokens `POST {path}/tokens` mints (none: the route answers 404).
    pub signer: Option<Signer>,
    /// With the master token, this header names the principal to act for.
    pub trusted_header: Option<http::HeaderName>,
}

impl Default for Access {
    /// The master token only.
    fn default() -> Self {
        Access {
            verifier: Verifier::load(&[], None, None, std::time::Duration::ZERO)
                .unwrap_or_else(|_| unreachable!("no key files to read")),
            signer: None,
            trusted_header: None,
        }
    }
}

/// The allowed browser origins.
#[derive(Debug, Clone)]
pub struct OriginPolicy {
    allowed: Vec<String>,
    any: bool,
}

/// What the origin check decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OriginCheck {
    /// No `Origin` header.
    Absent,
    /// Allowed; echo this value in `Access-Control-Allow-Origin`.
    Allowed(HeaderValue),
    Forbidden,
}

impl OriginPolicy {
    pub fn new(allowed: &[String]) -> OriginPolicy {
        OriginPolicy {
            any: allowed.iter().any(|o| o == "*"),
            allowed: allowed
                .iter()
                .filter(|o| *o != "*")
                .map(|o| o.to_ascii_lowercase())
                .collect(),
        }
    }

    /// `authority`: the request target's (HTTP/2's `:authority`), used when there is no
    /// `Host` header.
    pub fn check(&self, headers: &HeaderMap, authority: Option<&str>) -> OriginCheck {
        let Some(origin) = headers.get(ORIGIN) else {
            return OriginCheck::Absent;
        };
        let Ok(text) = origin.to_str() else {
            return OriginCheck::Forbidden;
        };
        let normalized = text.trim().trim_end_matches('/').to_ascii_lowercase();
        let host = headers
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .or(authority);
        let same_origin = normalized
            .split_once("://")
            .zip(host)
            .is_some_and(|((_, origin), host)| origin.eq_ignore_ascii_case(host.trim()));
        if same_origin || self.any || self.allowed.contains(&normalized) {
            OriginCheck::Allowed(origin.clone())
        } else {
            OriginCheck::Forbidden
        }
    }
}

/// The refusal of a request whose origin [`OriginPolicy::check`] found `Forbidden`,
/// logged at info with the origin and the rule, since the browser shows its page only a
/// failed fetch.
pub fn refuse_origin(headers: &HeaderMap, method: &http::Method, path: &str) -> ApiError {
    // A client's value, shown only when it looks like an origin (and never too long).
    let origin = headers
        .get(ORIGIN)
        .and_then(|o| o.to_str().ok())
        .filter(|o| o.len() <= 200 && o.bytes().all(|b| b.is_ascii_graphic()))
        .unwrap_or("(unreadable)");
    tracing::info!(
        origin,
        %method,
        path,
        rule = "neither the daemon's own origin nor an --allowed-origin",
        "origin refused"
    );
    ApiError::forbidden_origin(origin)
}

/// Adds the CORS headers for an allowed origin to a response.
pub fn cors_headers(headers: &mut HeaderMap, origin: &OriginCheck) {
    if let OriginCheck::Allowed(origin) = origin {
        headers.insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
        headers.append(VARY, HeaderValue::from_static("origin"));
        headers.insert(
            ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static("agui-resume, retry-after"),
        );
    }
}

/// Lets a refused origin's page read a refusal (the `403 FORBIDDEN_ORIGIN` that says how
/// to allow it) and pass a preflight, never any other answer: a browser otherwise shows
/// the developer only "Failed to fetch".
pub fn refusal_cors_headers(
    response: &mut http::Response<crate::http::body::Body>,
    origin: HeaderValue,
) {
    let readable = response.status() == http::StatusCode::FORBIDDEN
        || response.status() == http::StatusCode::NO_CONTENT;
    if readable {
        response
            .headers_mut()
            .insert(ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        response
            .headers_mut()
            .append(VARY, HeaderValue::from_static("origin"));
    }
}

/// Adds the preflight answer headers.
pub fn preflight_headers(headers: &mut HeaderMap) {
    headers.insert(
        ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, POST, PATCH, DELETE, OPTIONS"),
    );
    headers.insert(
        ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static("Authorization, Content-Type, Accept, Last-Event-ID"),
    );
    headers.insert(ACCESS_CONTROL_MAX_AGE, HeaderValue::from_static("600"));
}

/// Who the request acts for: the operator (the master token), the principal the trusted
/// header names (with the master token), or the principal of a scoped token. The token is
/// `Authorization: Bearer T`, else `?token=T`.
pub fn authenticate(
    auth: &Auth,
    access: &Access,
    headers: &HeaderMap,
    query: Option<&str>,
) -> Result<Principal, ApiError> {
    let expected = match auth {
        Auth::Token(token) => token,
        Auth::Misconfigured => return Err(ApiError::auth_misconfigured()),
    };
    let Some(presented) = bearer_from_header(headers).or_else(|| token_from_query(query)) else {
        return Err(ApiError::unauthorized());
    };
    if constant_time_eq(presented.as_bytes(), expected.expose().as_bytes()) {
        let named = access.trusted_header.as_ref().and_then(|name| {
            let mut values = headers.get_all(name).iter();
            values
                .next()
                .map(|first| (name, first, values.next().is_some()))
        });
        return match named {
            None => Ok(Principal::operator()),
            Some((name, _, true)) => Err(ApiError::invalid_input(
                // A proxy that appends instead of replacing would let the client's own
                // value through: refused rather than guessed.
                format!("the {name} header must be given once"),
                Some(name.as_str().to_owned()),
            )),
            Some((name, value, false)) => {
                let principal = value
                    .to_str()
                    .ok()
                    .map(str::trim)
                    .filter(|p| check_principal_name(p).is_ok())
                    .ok_or_else(|| {
                        ApiError::invalid_input(
                            format!(
                                "the {name} header must name a principal: 1 to 256 \
                                 characters, no control characters, not `operator`"
                            ),
                            Some(name.as_str().to_owned()),
                        )
                    })?;
                Ok(Principal::scoped(principal, None, Caps::ALL).via(Via::TrustedHeader))
            }
        };
    }
    // Only something shaped like a JWT gets a specific answer; anything else is just a
    // wrong token.
    if presented.split('.').count() != 3 {
        return Err(ApiError::unauthorized());
    }
    match access.verifier.verify(&presented) {
        Ok(claims) => Ok(claims.principal()),
        Err(error) => Err(ApiError::unauthorized_because(error.to_string())),
    }
}

/// Whether a request presents `expected`: `Authorization: Bearer T` (the scheme in any
/// case), else the query parameter `token`; compared in constant time. Every listener
/// checks its secret with this.
pub fn presents_bearer(expected: &BearerToken, headers: &HeaderMap, query: Option<&str>) -> bool {
    let presented = bearer_from_header(headers).or_else(|| token_from_query(query));
    presented.is_some_and(|p| constant_time_eq(p.as_bytes(), expected.expose().as_bytes()))
}

fn bearer_from_header(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_owned())
}

fn token_from_query(query: Option<&str>) -> Option<String> {
    form_urlencoded::parse(query?.as_bytes())
        .find(|(k, _)| k == "token")
        .map(|(_, v)| v.into_owned())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    // The length is not secret (tokens we generate have a fixed length); the content is.
    a.len() == b.len() && bool::from(a.ct_eq(b))
}

/// A query string safe to log: the value of every `token` parameter (a bearer token) and
/// `signature` parameter (an upload link's) replaced.
pub fn scrub_query(query: &str) -> String {
    query
        .split('&')
        .map(|pair| {
            let key = pair.split('=').next().unwrap_or("");
            let decoded: String = form_urlencoded::parse(key.as_bytes())
                .map(|(k, _)| k.into_owned())
                .next()
                .unwrap_or_default();
            if decoded.eq_ignore_ascii_case("token") || decoded.eq_ignore_ascii_case("signature") {
                format!("{key}=[redacted]")
            } else {
                pair.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("&")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).expect("header"));
        }
        h
    }

    fn authenticate(
        auth: &Auth,
        headers: &HeaderMap,
        query: Option<&str>,
    ) -> Result<Principal, ApiError> {
        super::authenticate(auth, &Access::default(), headers, query)
    }

    #[test]
    fn token_from_header_or_query() {
        let auth = Auth::Token(BearerToken::new("abcdefghijklmnop").expect("token"));
        assert!(
            authenticate(
                &auth,
                &headers(&[("authorization", "Bearer abcdefghijklmnop")]),
                None
            )
            .is_ok()
        );
        assert!(
            authenticate(
                &auth,
                &headers(&[("authorization", "bearer abcdefghijklmnop")]),
                None
            )
            .is_ok()
        );
        assert!(authenticate(&auth, &headers(&[]), Some("a=1&token=abcdefghijklmnop")).is_ok());
        assert!(
            authenticate(
                &auth,
                &headers(&[("authorization", "Bearer abcdefghijklmnoq")]),
                None
            )
            .is_err()
        );
        assert!(
            authenticate(
                &auth,
                &headers(&[("authorization", "Basic abcdefghijklmnop")]),
                None
            )
            .is_err()
        );
        assert!(authenticate(&auth, &headers(&[]), None).is_err());
        assert!(authenticate(&auth, &headers(&[]), Some("token=ab")).is_err());
    }

    #[test]
    fn the_trusted_header_counts_only_with_the_master_token() {
        let auth = Auth::Token(BearerToken::new("abcdefghijklmnop").expect("token"));
        let access = Access {
            trusted_header: Some(http::HeaderName::from_static("x-user")),
            ..Access::default()
        };
        let as_alice = super::authenticate(
            &auth,
            &access,
            &headers(&[
                ("authorization", "Bearer abcdefghijklmnop"),
                ("x-user", "alice"),
            ]),
            None,
        )
        .expect("allowed");
        assert_eq!(as_alice.owner(), "alice");
        assert!(!as_alice.is_operator());
        assert_eq!(as_alice.authenticated(), Via::TrustedHeader);
        let imitation = super::authenticate(
            &auth,
            &access,
            &headers(&[
                ("authorization", "Bearer abcdefghijklmnop"),
                ("x-user", "operator"),
            ]),
            None,
        );
        assert_eq!(
            imitation.expect_err("refused").status,
            http::StatusCode::BAD_REQUEST
        );
        let operator = super::authenticate(
            &auth,
            &access,
            &headers(&[("authorization", "Bearer abcdefghijklmnop")]),
            None,
        )
        .expect("allowed");
        assert!(operator.is_operator());
        assert_eq!(operator.authenticated(), Via::Master);
        let wrong = super::authenticate(
            &auth,
            &access,
            &headers(&[
                ("authorization", "Bearer abcdefghijklmnoq"),
                ("x-user", "alice"),
            ]),
            None,
        );
        assert_eq!(
            wrong.expect_err("refused").status,
            http::StatusCode::UNAUTHORIZED
        );
        let empty = super::authenticate(
            &auth,
            &access,
            &headers(&[
                ("authorization", "Bearer abcdefghijklmnop"),
                ("x-user", " "),
            ]),
            None,
        );
        assert_eq!(
            empty.expect_err("refused").status,
            http::StatusCode::BAD_REQUEST
        );
    }

    #[test]
    fn misconfigured_auth_fails_closed() {
        let e =
            authenticate(&Auth::Misconfigured, &headers(&[]), Some("token=x")).expect_err("closed");
        assert_eq!(e.status, http::StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn origins() {
        let p = OriginPolicy::new(&["https://App.example".to_owned()]);
        assert_eq!(p.check(&headers(&[]), None), OriginCheck::Absent);
        assert!(matches!(
            p.check(&headers(&[("origin", "https://app.EXAMPLE")]), None),
            OriginCheck::Allowed(_)
        ));
        assert_eq!(
            p.check(&headers(&[("origin", "https://evil.example")]), None),
            OriginCheck::Forbidden
        );
        let any = OriginPolicy::new(&["*".to_owned()]);
        assert!(matches!(
            any.check(&headers(&[("origin", "https://x")]), None),
            OriginCheck::Allowed(_)
        ));
        let none = OriginPolicy::new(&[]);
        assert_eq!(
            none.check(&headers(&[("origin", "https://x")]), None),
            OriginCheck::Forbidden
        );
        // The daemon's own origin (its console): the same host and port as the request.
        assert!(matches!(
            none.check(
                &headers(&[
                    ("origin", "https://127.0.0.1:8443"),
                    ("host", "127.0.0.1:8443")
                ]),
                None
            ),
            OriginCheck::Allowed(_)
        ));
        assert_eq!(
            none.check(
                &headers(&[
                    ("origin", "https://127.0.0.1:9999"),
                    ("host", "127.0.0.1:8443")
                ]),
                None
            ),
            OriginCheck::Forbidden
        );
        // HTTP/2: no Host header, the request's authority.
        assert!(matches!(
            none.check(
                &headers(&[("origin", "https://127.0.0.1:8443")]),
                Some("127.0.0.1:8443")
            ),
            OriginCheck::Allowed(_)
        ));
    }

    #[test]
    fn query_token_is_scrubbed() {
        assert_eq!(
            scrub_query("a=1&token=s3cret&b=2"),
            "a=1&token=[redacted]&b=2"
        );
        assert_eq!(scrub_query("%74oken=s3cret"), "%74oken=[redacted]");
        assert_eq!(scrub_query("limit=5"), "limit=5");
        assert_eq!(
            scrub_query("owner=ab&expires=9&signature=c0de"),
            "owner=ab&expires=9&signature=[redacted]"
        );
    }
}

//! Forwarding as a layer (cluster): a request that may concern a thread another node owns
//! is read whole, served here, and sent to the owner when the runtime says the thread is
//! the owner's.

use http::{Request, Response, StatusCode};

use super::common::{Audit, read_request_body};
use super::route::Route;
use super::{App, serve};
use crate::access::Principal;
use crate::http::body::{Body, RequestBody};
use crate::http::error::ApiError;
use crate::http::transport::ConnInfo;
use crate::http::transport::forward::Forwarder;

/// A request that may concern a thread another node owns (cluster): read whole first, then
/// served here, or sent to the owner when the runtime says the thread is the owner's. An
/// owner that cannot be reached has died or is cut off: its lease lapses within its
/// lifetime, and the request is tried again once it has (this node then takes the thread
/// over), a few times at most.
pub(super) async fn forwarding(
    app: &App,
    forwarder: &Forwarder,
    route: Route,
    req: Request<RequestBody>,
    conn: ConnInfo,
    principal: Principal,
    audit: &mut Audit,
) -> Result<Response<Body>, ApiError> {
    let (parts, body) = req.into_parts();
    let body = read_request_body(body, &parts.headers, &conn).await?;
    let mut attempts = 0;
    loop {
        attempts += 1;
        let req = Request::from_parts(
            parts.clone(),
            RequestBody::Right(http_body_util::Full::new(body.clone())),
        );
        let error = match serve(app, route.clone(), req, conn, principal.clone(), audit).await {
            Err(error) if error.forward.is_some() => error,
            Err(error) if matches!(route, Route::Cancel(_)) && error.is_not_found() => {
                // A run is found by its id only where it runs: ask the other nodes, all at
                // once (each within the hop's bound).
                let peers = app.runtime.peers().await;
                let asked = peers.iter().map(|(address, cert)| {
                    forwarder.send(address, cert.as_deref(), &parts, body.clone())
                });
                for answer in futures_util::future::join_all(asked).await {
                    match answer {
                        Ok(response) if response.status() == StatusCode::ACCEPTED => {
                            return Ok(response);
                        }
                        Ok(_) => {}
                        Err(failure) => {
                            tracing::warn!(error = %failure, "cancel could not reach a node");
                        }
                    }
                }
                return Err(error);
            }
            answer => return answer,
        };
        let Some(owner) = error.forward.clone() else {
            return Err(error);
        };
        match forwarder
            .send(&owner.address, owner.cert.as_deref(), &parts, body.clone())
            .await
        {
            Ok(response) => {
                tracing::debug!(owner = %owner.node, "request sent to the thread's owner");
                return Ok(response);
            }
            Err(failure) if attempts < 3 => {
                tracing::warn!(owner = %owner.node, error = %failure, "thread owner unreachable; waiting for its lease to lapse");
                tokio::time::sleep(owner.expires_in + std::time::Duration::from_millis(100)).await;
            }
            Err(failure) => {
                tracing::warn!(owner = %owner.node, error = %failure, "thread owner unreachable");
                return Err(error);
            }
        }
    }
}

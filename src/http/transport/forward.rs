//! The internal hop of a cluster: a request for a thread another node owns is sent to that
//! node as it came (method, path and query, headers, the body already read), and its
//! answer (an event stream included) is streamed back as it arrives.
//!
//! The hop carries the client's own credentials (every node verifies the same tokens) and
//! [`FORWARDED_BY`], naming the node it came through: a request that arrives with it is
//! never sent on again, so a lease that moved meanwhile costs one `503 OWNER_UNAVAILABLE`
//! (retry), never a loop. Nodes reach each other at the address each advertises
//! (`--advertise-url`): plain HTTP, or HTTPS verified against the system's roots.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::{
    CONNECTION, CONTENT_LENGTH, HOST, ORIGIN, TE, TRAILER, TRANSFER_ENCODING, UPGRADE,
};
use http::{HeaderName, Request, Response, Uri};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::http::body::Body;

/// The header that marks a request sent on by another node.
pub const FORWARDED_BY: HeaderName = HeaderName::from_static("agui-forwarded-by");

/// The response header that names the node that served a request (cluster only).
pub const NODE_HEADER: HeaderName = HeaderName::from_static("agui-node");

/// How long the hop may take to connect to the owner.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Why a request could not be sent to the owner.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("bad owner address: {0}")]
    Address(String),
    #[error("owner unreachable: {0}")]
    Unreachable(#[from] hyper_util::client::legacy::Error),
    #[error("owner did not answer within {0:?}")]
    Timeout(Duration),
}

/// The client a node sends requests on with.
#[derive(Debug, Clone)]
pub struct Forwarder {
    /// For a node that published no certificate: plain HTTP, or HTTPS verified against the
    /// system's roots.
    client: HopClient,
    /// For a node that published its certificate: HTTPS accepting exactly that one, by
    /// certificate (DER).
    pinned: Arc<Mutex<HashMap<Vec<u8>, HopClient>>>,
    node: http::HeaderValue,
    /// How long the owner may take to answer (its headers; a stream then flows on).
    answer_within: Duration,
}

type HopClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

impl Forwarder {
    /// A client for node `node`, on the current tokio runtime; an owner that has not
    /// answered within `answer_within` (a stopped process still accepts connections) counts
    /// as unreachable.
    pub fn new(node: &str, answer_within: Duration) -> std::io::Result<Forwarder> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        // Without any system root certificate only plain HTTP and pinned peers work.
        let builder =
            match HttpsConnectorBuilder::new().with_provider_and_native_roots(provider.clone()) {
                Ok(builder) => builder,
                Err(_) => HttpsConnectorBuilder::new().with_tls_config(
                    rustls::ClientConfig::builder_with_provider(provider)
                        .with_safe_default_protocol_versions()
                        .map_err(std::io::Error::other)?
                        .with_root_certificates(rustls::RootCertStore::empty())
                        .with_no_client_auth(),
                ),
            };
        Ok(Forwarder {
            client: hop_client(builder),
            pinned: Arc::default(),
            node: http::HeaderValue::from_str(node).map_err(std::io::Error::other)?,
            answer_within,
        })
    }

    /// The client for a peer that serves `cert` (made once per certificate).
    fn pinned(&self, cert: &[u8]) -> std::io::Result<HopClient> {
        let mut pinned = self.pinned.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(client) = pinned.get(cert) {
            return Ok(client.clone());
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = Pinned {
            cert: cert.to_vec(),
            algorithms: provider.signature_verification_algorithms,
        };
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(std::io::Error::other)?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_no_client_auth();
        let client = hop_client(HttpsConnectorBuilder::new().with_tls_config(tls));
        pinned.insert(cert.to_vec(), client.clone());
        Ok(client)
    }

    /// This node's id, as a header value.
    pub fn node(&self) -> &http::HeaderValue {
        &self.node
    }

    /// Sends the request (`parts` and its body, already read) to `address` and streams its
    /// answer back.
    pub async fn send(
        &self,
        address: &str,
        cert: Option<&[u8]>,
        parts: &http::request::Parts,
        body: Bytes,
    ) -> Result<Response<Body>, ForwardError> {
        let client = match cert {
            Some(cert) if !cert.is_empty() => self
                .pinned(cert)
                .map_err(|e| ForwardError::Address(e.to_string()))?,
            _ => self.client.clone(),
        };
        let target = parts
            .uri
            .path_and_query()
            .map_or("/", http::uri::PathAndQuery::as_str);
        let uri: Uri = format!("{}{target}", address.trim_end_matches('/'))
            .parse()
            .map_err(|_| ForwardError::Address(address.to_owned()))?;
        let mut request = Request::builder()
            .method(parts.method.clone())
            .uri(uri)
            .body(Full::new(body))
            .map_err(|e| ForwardError::Address(e.to_string()))?;
        let headers = request.headers_mut();
        for (name, value) in &parts.headers {
            // The origin was checked by this node, against the same policy; the hop is a
            // request of this node's own, not a browser's.
            if !hop_by_hop(name) && *name != HOST && *name != ORIGIN {
                headers.append(name.clone(), value.clone());
            }
        }
        headers.insert(FORWARDED_BY, self.node.clone());
        let response = tokio::time::timeout(self.answer_within, client.request(request))
            .await
            .map_err(|_| ForwardError::Timeout(self.answer_within))??;
        let (mut parts, incoming) = response.into_parts();
        let names: Vec<HeaderName> = parts.headers.keys().cloned().collect();
        for name in names {
            if hop_by_hop(&name) || name == CONTENT_LENGTH {
                parts.headers.remove(&name);
            }
        }
        // The owner's body as it arrives; an error mid-way ends it (the client sees a cut
        // stream and reattaches, as after any network failure).
        let stream = futures_util::stream::unfold(incoming, |mut incoming| async move {
            match incoming.frame().await {
                Some(Ok(frame)) => Some((Ok::<_, Infallible>(frame), incoming)),
                Some(Err(error)) => {
                    tracing::warn!(%error, "forwarded response ended early");
                    None
                }
                None => None,
            }
        });
        let body: Body = StreamBody::new(stream).boxed_unsync();
        Ok(Response::from_parts(parts, body))
    }
}

/// Headers that describe one connection, not the request.
pub(super) fn hop_by_hop(name: &HeaderName) -> bool {
    *name == CONNECTION
        || *name == TE
        || *name == TRAILER
        || *name == TRANSFER_ENCODING
        || *name == UPGRADE
        || name.as_str() == "keep-alive"
        || name.as_str() == "proxy-connection"
        || name.as_str() == "proxy-authorization"
}

/// The connector's HTTP side: bounded connect, no Nagle, `https` URLs allowed.
fn hop_client(
    builder: HttpsConnectorBuilder<hyper_rustls::builderstates::WantsSchemes>,
) -> HopClient {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(CONNECT_TIMEOUT));
    http.set_nodelay(true);
    http.enforce_http(false);
    let connector = builder.https_or_http().enable_http1().wrap_connector(http);
    Client::builder(TokioExecutor::new()).build(connector)
}

/// Accepts exactly one certificate, the one the peer published in the cluster's database
/// (whoever issued it, names aside: the database is what says who the peer is), and checks
/// the handshake's signatures against it as usual.
#[derive(Debug)]
struct Pinned {
    cert: Vec<u8>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if end_entity.as_ref() == self.cert.as_slice() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

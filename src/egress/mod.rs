//! The ways out of an agent's network namespace to other hosts, decided by the daemon: the
//! **egress proxy** (HTTP `CONNECT` and plain HTTP, by name: [`Egress`]) and the **model
//! relays** (a model API reached with the operator's key added outside the sandbox:
//! [`Relay`]). An agent's forwarder hands each connection to the daemon (`confine::forward`,
//! `agent/acp/forward.rs`); the HTTP of both is served by a [`Gateway`] the HTTP layer lends
//! (`http/transport/egress.rs`). Names are resolved here, by the daemon, never by the agent:
//! an address reached is one the daemon chose, after the rules and the address checks.

use std::collections::BTreeMap;
use std::fmt;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

mod address;
mod rule;
pub mod usage;

pub use address::is_public;
pub use rule::Rule;
pub use usage::{ModelUsage, UsageTap};

/// How long a name may take to resolve.
const LOOKUP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// `[agents.egress]` as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EgressConfig {
    /// `host`, `*.host` (its subdomains), `host:port`, `*` (any host); no port: any port.
    pub allow: Vec<String>,
    /// The same forms; a host denied is denied whatever allows it.
    pub deny: Vec<String>,
    /// `name = "ip:port"`: where a name goes instead of what DNS says (as curl's
    /// `--resolve`); such an address counts as listed explicitly.
    pub resolve: BTreeMap<String, String>,
}

/// An agent's egress rules, checked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Egress {
    pub allow: Vec<Rule>,
    pub deny: Vec<Rule>,
    /// Lower-case names to their fixed addresses.
    pub resolve: BTreeMap<String, SocketAddr>,
}

impl Egress {
    /// Checks `config`: each rule's form, each `resolve` address. The error names the entry.
    pub fn new(config: &EgressConfig) -> Result<Egress, String> {
        let rules = |list: &[String], key: &str| {
            list.iter()
                .map(|text| Rule::parse(text).map_err(|e| format!("egress.{key}: {text:?}: {e}")))
                .collect::<Result<Vec<Rule>, String>>()
        };
        let mut resolve = BTreeMap::new();
        for (name, address) in &config.resolve {
            let address: SocketAddr = address.parse().map_err(|_| {
                format!(
                    "egress.resolve.{name}: {address:?} is not an ip:port (e.g. \"127.0.0.1:8080\")"
                )
            })?;
            resolve.insert(name.to_ascii_lowercase(), address);
        }
        Ok(Egress {
            allow: rules(&config.allow, "allow")?,
            deny: rules(&config.deny, "deny")?,
            resolve,
        })
    }

    /// The rules' verdict on `host:port` (`host` lower case, no brackets): a deny rule
    /// that matches wins; then an allow rule; else denied as unlisted.
    pub fn decide(&self, host: &str, port: u16) -> Verdict {
        if let Some(rule) = self.deny.iter().find(|r| r.matches(host, port)) {
            return Verdict::Denied(format!("denied by egress.deny {:?}", rule.text()));
        }
        match self.allow.iter().find(|r| r.matches(host, port)) {
            Some(rule) => Verdict::Allowed(format!("allowed by egress.allow {:?}", rule.text())),
            None => Verdict::Denied(format!("{host}:{port} is not in egress.allow")),
        }
    }

    /// Where an allowed `host:port` goes: its `resolve` entry, or (an address given
    /// literally in an allow rule) itself, or what DNS says, each address checked: a
    /// loopback, private, link-local or otherwise non-public address is refused unless it
    /// was listed explicitly. The error says why, for the 403.
    pub async fn addresses(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
        if let Some(address) = self.resolve.get(host) {
            return Ok(vec![*address]);
        }
        if let Ok(ip) = host.parse::<IpAddr>() {
            let listed = self.allow.iter().any(|r| r.names_address(ip));
            let local = address::local_addresses().contains(&ip.to_canonical());
            if listed || (is_public(ip) && !local) {
                return Ok(vec![SocketAddr::new(ip, port)]);
            }
            return Err(format!(
                "{ip} is not a public address (list it in egress.allow to reach it)"
            ));
        }
        let lookup = tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((host, port)));
        let found: Vec<SocketAddr> = lookup
            .await
            .map_err(|_| format!("{host} did not resolve within {LOOKUP_TIMEOUT:?}"))?
            .map_err(|e| format!("{host} does not resolve: {e}"))?
            .collect();
        let local = address::local_addresses();
        let denied = |ip: IpAddr| self.deny.iter().any(|r| r.names_address(ip));
        let public: Vec<SocketAddr> = found
            .iter()
            .copied()
            .filter(|a| {
                is_public(a.ip()) && !local.contains(&a.ip().to_canonical()) && !denied(a.ip())
            })
            .collect();
        if public.is_empty() {
            let shown = found
                .first()
                .map_or("nothing".to_owned(), |a| a.ip().to_string());
            return Err(format!(
                "{host} resolves to {shown}, not a public address (give it in egress.resolve to reach it)"
            ));
        }
        Ok(public)
    }
}

/// `host` as the rules see it: lower case, without a trailing dot, an address in its
/// canonical form (an IPv4-mapped IPv6 address as IPv4). A numeric host that is no address
/// in dotted or IPv6 form (`16909060`, `0x01020304`, `1.2.3`: resolvers read them as
/// addresses, the rules would not) is refused.
pub fn canonical_host(host: &str) -> Result<String, String> {
    let host = host.strip_suffix('.').unwrap_or(host).to_ascii_lowercase();
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(ip.to_canonical().to_string());
    }
    let last = host.rsplit('.').next().unwrap_or("");
    let numeric =
        !last.is_empty() && (last.bytes().all(|b| b.is_ascii_digit()) || last.starts_with("0x"));
    if numeric || host.is_empty() {
        return Err(format!(
            "{host:?} is not a host name or an address in its usual form"
        ));
    }
    Ok(host)
}

/// The rules' verdict, with the reason shown to the agent and logged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allowed(String),
    Denied(String),
}

/// `[[agents.relay]]` as written.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelayConfig {
    /// Where requests go: `https://api.anthropic.com` (a path is a prefix).
    pub upstream: String,
    /// The credential header the relay sets: `x-api-key`, or `authorization` (then
    /// `Bearer {secret}`).
    pub header: String,
    /// The file holding the key (its first line).
    pub secret_file: PathBuf,
    /// Set in the agent's environment to the relay's address in its sandbox.
    pub base_url_env: String,
    /// Set in the agent's environment to a placeholder, so the agent starts.
    pub placeholder_env: Option<String>,
}

/// What an agent's environment holds in a relay's `placeholder_env`.
pub const PLACEHOLDER: &str = "agui-serve-relay-adds-the-key";

/// A model relay, checked, with its key.
#[derive(Clone)]
pub struct Relay {
    pub upstream: http::Uri,
    pub header: http::HeaderName,
    /// The header's value (marked sensitive), never shown.
    pub value: http::HeaderValue,
    pub base_url_env: String,
    pub placeholder_env: Option<String>,
    /// The upstream's host (for `/info` and `check-config`).
    pub host: String,
    /// The file the key was read from: kept from every agent, as the daemon's other
    /// secret files are.
    pub secret_file: std::path::PathBuf,
}

impl Relay {
    /// Checks `config` and reads its key. The error names the setting, never the key.
    pub fn new(config: &RelayConfig) -> Result<Relay, String> {
        let upstream: http::Uri = config
            .upstream
            .parse()
            .map_err(|_| format!("relay.upstream {:?} is not a URL", config.upstream))?;
        let scheme_ok = matches!(upstream.scheme_str(), Some("https" | "http"));
        let Some(host) = upstream.host().filter(|_| scheme_ok).map(str::to_owned) else {
            return Err(format!(
                "relay.upstream {:?} needs http:// or https:// and a host",
                config.upstream
            ));
        };
        if upstream.query().is_some() {
            return Err(format!(
                "relay.upstream {:?} may not have a query",
                config.upstream
            ));
        }
        let header = http::HeaderName::from_bytes(config.header.to_ascii_lowercase().as_bytes())
            .map_err(|_| format!("relay.header {:?} is not a header name", config.header))?;
        let text = std::fs::read_to_string(&config.secret_file)
            .map_err(|e| format!("relay.secret_file {}: {e}", config.secret_file.display()))?;
        let secret = text.lines().next().unwrap_or("").trim();
        if secret.is_empty() {
            return Err(format!(
                "relay.secret_file {} is empty",
                config.secret_file.display()
            ));
        }
        let shown = if header == http::header::AUTHORIZATION {
            format!("Bearer {secret}")
        } else {
            secret.to_owned()
        };
        let mut value = http::HeaderValue::from_str(&shown).map_err(|_| {
            format!(
                "relay.secret_file {} holds characters a header cannot carry",
                config.secret_file.display()
            )
        })?;
        value.set_sensitive(true);
        for name in std::iter::once(&config.base_url_env).chain(&config.placeholder_env) {
            if name.is_empty() || name.contains('=') {
                return Err(format!(
                    "relay: {name:?} is not an environment variable name"
                ));
            }
        }
        Ok(Relay {
            upstream,
            header,
            value,
            base_url_env: config.base_url_env.clone(),
            placeholder_env: config.placeholder_env.clone(),
            host,
            secret_file: config.secret_file.clone(),
        })
    }
}

impl fmt::Debug for Relay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Relay")
            .field("upstream", &self.upstream)
            .field("header", &self.header)
            .field("base_url_env", &self.base_url_env)
            .field("placeholder_env", &self.placeholder_env)
            .finish_non_exhaustive()
    }
}

impl PartialEq for Relay {
    fn eq(&self, other: &Relay) -> bool {
        self.upstream == other.upstream
            && self.header == other.header
            && self.value == other.value
            && self.base_url_env == other.base_url_env
            && self.placeholder_env == other.placeholder_env
    }
}

/// Whose connection it is: for the log, the metrics and the fleet.
#[derive(Debug, Clone, Default)]
pub struct Who {
    pub agent: String,
    pub principal: String,
    /// The thread, where the process is a thread's own.
    pub thread: Option<String>,
}

/// One decision of the egress proxy, as logged (with [`Who`]) and counted.
#[derive(Debug, Clone, Serialize)]
pub struct Decision {
    pub host: String,
    pub port: u16,
    pub allowed: bool,
    /// The rule that decided, or why it was refused.
    pub rule: String,
    /// Bytes both ways (0 for a refusal; filled in when an allowed connection ends).
    pub bytes: u64,
}

/// Where decisions and model usage go: the agent's counters, the metrics, the run.
pub trait Exits: Send + Sync + 'static {
    /// Who the connections are from.
    fn who(&self) -> &Who;
    /// A decision of the proxy (a refusal as it is made; an allowed connection when it
    /// ends, with its bytes).
    fn decided(&self, decision: Decision);
    /// Usage a relay read in a model's answer, as it streams.
    fn used(&self, usage: ModelUsage);
}

/// A connection from an agent, as the forwarder hands it over.
pub type Conn = tokio::net::UnixStream;

/// A future the gateway serves a connection in.
pub type Serving = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// The HTTP of the ways out (lent by the HTTP layer).
pub trait Gateway: std::fmt::Debug + Send + Sync + 'static {
    /// Serves the egress proxy on `conn` under `rules`.
    fn proxy(&self, conn: Conn, rules: Arc<Egress>, exits: Arc<dyn Exits>) -> Serving;
    /// Serves `relay` on `conn`.
    fn relay(&self, conn: Conn, relay: Arc<Relay>, exits: Arc<dyn Exits>) -> Serving;
}

/// An agent's decisions counted, for its status (`GET {path}/agents`, the fleet).
#[derive(Debug, Default)]
pub struct Counters {
    allowed: AtomicU64,
    denied: AtomicU64,
    last_denied: std::sync::Mutex<Option<Denied>>,
}

/// The last refusal an agent met: what and why, not whose.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Denied {
    pub host: String,
    pub port: u16,
    pub rule: String,
    /// Milliseconds since the epoch.
    pub at_ms: u64,
}

/// [`Counters`] as shown.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EgressCount {
    pub allowed: u64,
    pub denied: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_denied: Option<Denied>,
}

impl EgressCount {
    pub fn is_none(&self) -> bool {
        self.allowed == 0 && self.denied == 0
    }
}

impl Counters {
    pub fn count(&self, decision: &Decision, at_ms: u64) {
        if decision.allowed {
            self.allowed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.denied.fetch_add(1, Ordering::Relaxed);
        *crate::sync::lock(&self.last_denied) = Some(Denied {
            host: decision.host.clone(),
            port: decision.port,
            rule: decision.rule.clone(),
            at_ms,
        });
    }

    pub fn shown(&self) -> EgressCount {
        EgressCount {
            allowed: self.allowed.load(Ordering::Relaxed),
            denied: self.denied.load(Ordering::Relaxed),
            last_denied: crate::sync::lock(&self.last_denied).clone(),
        }
    }
}

#[cfg(test)]
mod tests;

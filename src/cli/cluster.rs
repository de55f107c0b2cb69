//! The store and, when it is PostgreSQL, the cluster settings: this node's name, how the
//! other nodes reach it, how long its hold on a thread lasts.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::cluster::ClusterConfig;
use crate::config::{ConfigError, TlsMode, parse_duration};

use super::file::FileServer;
use super::flags::ServeArgs;

impl ServeArgs {
    /// The cluster settings when the store is PostgreSQL (`None`: the embedded SQLite).
    pub(super) fn resolve_cluster(
        &self,
        server: &FileServer,
        host: IpAddr,
        port: u16,
        tls: &TlsMode,
    ) -> Result<Option<ClusterConfig>, ConfigError> {
        let Some(url) = self.postgres_url(server)? else {
            return Ok(None);
        };
        let node_name = self.node_name(server)?;
        let advertise = self.advertise_url(server, host, port, tls)?;
        let lease_ttl = self.lease_ttl(server)?;
        Ok(Some(ClusterConfig {
            url,
            node_name,
            advertise,
            lease_ttl,
            cert: None,
        }))
    }

    /// The PostgreSQL connection string (`None`: the embedded SQLite, which takes no
    /// `advertise_url`).
    fn postgres_url(&self, server: &FileServer) -> Result<Option<String>, ConfigError> {
        let store = self.store.clone().or_else(|| server.store.clone());
        match store.as_deref().map(str::trim) {
            None | Some("sqlite") | Some("") => {
                if self.advertise_url.is_some() || server.advertise_url.is_some() {
                    return Err(ConfigError::new(
                        "advertise_url needs a PostgreSQL store (--store postgres://...)",
                    ));
                }
                Ok(None)
            }
            Some(url)
                if url.starts_with("postgres://")
                    || url.starts_with("postgresql://")
                    || url.contains("host=")
                    || url.contains("dbname=") =>
            {
                Ok(Some(url.to_owned()))
            }
            Some(_) => Err(ConfigError::new(
                "store must be `sqlite` or a PostgreSQL connection string \
                 (postgres://... or host=... dbname=...)",
            )),
        }
    }

    /// This node's name in the cluster [default: node].
    fn node_name(&self, server: &FileServer) -> Result<String, ConfigError> {
        let node_name = self
            .node_id
            .clone()
            .or_else(|| server.node_id.clone())
            .unwrap_or_else(|| "node".to_owned());
        if node_name.is_empty()
            || node_name.len() > 64
            || !node_name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(ConfigError::new(
                "node_id must be 1 to 64 ASCII letters, digits, `-`, `_` or `.`",
            ));
        }
        Ok(node_name)
    }

    /// How the other nodes reach this one: the given URL, else this listener's scheme, host
    /// and port (a wildcard host cannot be reached).
    fn advertise_url(
        &self,
        server: &FileServer,
        host: IpAddr,
        port: u16,
        tls: &TlsMode,
    ) -> Result<String, ConfigError> {
        match self
            .advertise_url
            .clone()
            .or_else(|| server.advertise_url.clone())
        {
            Some(url) => {
                let parsed: http::Uri = url
                    .parse()
                    .map_err(|_| ConfigError::new(format!("advertise_url {url:?} is not a URL")))?;
                if !matches!(parsed.scheme_str(), Some("http" | "https"))
                    || parsed.host().is_none()
                    || parsed.path().len() > 1
                {
                    return Err(ConfigError::new(
                        "advertise_url must be http(s)://HOST[:PORT], with no path",
                    ));
                }
                Ok(url.trim_end_matches('/').to_owned())
            }
            None if host.is_unspecified() => Err(ConfigError::new(
                "a cluster node listening on a wildcard address needs --advertise-url \
                 (how the other nodes reach it)",
            )),
            None => {
                let scheme = if matches!(tls, TlsMode::Off) {
                    "http"
                } else {
                    "https"
                };
                Ok(format!("{scheme}://{}", SocketAddr::new(host, port)))
            }
        }
    }

    /// How long a node's hold on a thread lasts without renewal: 1s to 10m [default: 10s].
    fn lease_ttl(&self, server: &FileServer) -> Result<Duration, ConfigError> {
        let lease_ttl = match self.lease_ttl.as_deref().or(server.lease_ttl.as_deref()) {
            Some(text) => {
                parse_duration(text).map_err(|e| ConfigError::new(format!("lease_ttl: {e}")))?
            }
            None => Duration::from_secs(10),
        };
        if lease_ttl < Duration::from_secs(1) || lease_ttl > Duration::from_secs(600) {
            return Err(ConfigError::new("lease_ttl must be between 1s and 10m"));
        }
        Ok(lease_ttl)
    }
}

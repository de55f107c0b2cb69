//! `[auth]` and its flags: the keys that verify scoped tokens, the claims they must carry,
//! the trusted principal header, and what one principal may hold.

use std::time::Duration;

use crate::access::jwt::{KeyConfig, KeySource, Verifier, parse_algorithm};
use crate::config::{AccessConfig, ConfigError, parse_duration};
use crate::runtime::FleetLimits;

use super::file::{FileAuth, FileKey};
use super::flags::ServeArgs;

impl ServeArgs {
    /// The access settings of `[auth]` and its flags.
    pub(super) fn resolve_access(
        &self,
        file: &FileAuth,
        max_concurrent_runs: usize,
    ) -> Result<AccessConfig, ConfigError> {
        let keys = self.keys(file)?;
        let leeway = leeway(file)?;
        let audience = self.jwt_audience.clone().or_else(|| file.audience.clone());
        // Every key file is read once here, so a bad one is a startup error.
        Verifier::load(&keys, audience.clone(), file.issuer.clone(), leeway)
            .map_err(|e| ConfigError::new(format!("auth key: {e}")))?;
        let trusted_principal_header = self.trusted_principal_header(file)?;
        let max_runs_per_principal = self
            .max_runs_per_principal
            .or(file.max_runs_per_principal)
            .unwrap_or(crate::config::DEFAULT_MAX_RUNS_PER_PRINCIPAL.min(max_concurrent_runs));
        if max_runs_per_principal == 0 {
            return Err(ConfigError::new(
                "max_runs_per_principal must be at least 1",
            ));
        }
        let fleet_streams = self.fleet_streams(file)?;
        Ok(AccessConfig {
            keys,
            audience,
            issuer: file.issuer.clone(),
            leeway,
            trusted_principal_header,
            max_runs_per_principal,
            fleet_streams,
        })
    }

    /// The keys: the file's `[[auth.keys]]`, then `--jwt-secret-file` (HS256), then
    /// `--jwt-jwks-file`.
    fn keys(&self, file: &FileAuth) -> Result<Vec<KeyConfig>, ConfigError> {
        let mut keys = Vec::new();
        for (i, key) in file.keys.iter().enumerate() {
            keys.push(file_key(i, key)?);
        }
        for path in &self.jwt_secret_file {
            keys.push(KeyConfig {
                kid: None,
                alg: Some(jsonwebtoken::Algorithm::HS256),
                source: KeySource::Secret(path.clone()),
            });
        }
        for path in &self.jwt_jwks_file {
            keys.push(KeyConfig {
                kid: None,
                alg: None,
                source: KeySource::Jwks(path.clone()),
            });
        }
        Ok(keys)
    }

    /// The header that names the principal the master token acts for, if any.
    fn trusted_principal_header(
        &self,
        file: &FileAuth,
    ) -> Result<Option<http::HeaderName>, ConfigError> {
        match self
            .trusted_principal_header
            .as_ref()
            .or(file.trusted_principal_header.as_ref())
        {
            Some(name) => Ok(Some(
                http::HeaderName::from_bytes(name.trim().as_bytes()).map_err(|_| {
                    ConfigError::new(format!(
                        "trusted_principal_header: {name:?} is not a header name"
                    ))
                })?,
            )),
            None => Ok(None),
        }
    }

    /// How many fleet streams may be open, in all and per principal.
    fn fleet_streams(&self, file: &FileAuth) -> Result<FleetLimits, ConfigError> {
        let defaults = FleetLimits::default();
        let fleet_streams = FleetLimits {
            total: self
                .max_fleet_streams
                .or(file.max_fleet_streams)
                .unwrap_or(defaults.total),
            per_principal: self
                .max_fleet_streams_per_principal
                .or(file.max_fleet_streams_per_principal)
                .unwrap_or(defaults.per_principal),
        };
        if fleet_streams.total == 0 || fleet_streams.per_principal == 0 {
            return Err(ConfigError::new(
                "max_fleet_streams and max_fleet_streams_per_principal must be at least 1",
            ));
        }
        Ok(fleet_streams)
    }
}

/// One `[[auth.keys]]` entry: exactly one source, and its algorithm pinned (a JWKS's keys
/// carry their own).
fn file_key(i: usize, key: &FileKey) -> Result<KeyConfig, ConfigError> {
    let at = |e: String| ConfigError::new(format!("auth.keys[{i}]: {e}"));
    let alg = key
        .alg
        .as_deref()
        .map(parse_algorithm)
        .transpose()
        .map_err(at)?;
    let source = match (&key.secret_file, &key.public_key_file, &key.jwks_file) {
        (Some(p), None, None) => KeySource::Secret(p.clone()),
        (None, Some(p), None) => KeySource::PublicKey(p.clone()),
        (None, None, Some(p)) => KeySource::Jwks(p.clone()),
        _ => {
            return Err(at(
                "give exactly one of secret_file, public_key_file, jwks_file".into(),
            ));
        }
    };
    if alg.is_none() && !matches!(source, KeySource::Jwks(_)) {
        return Err(at(
            "`alg` is required (each key's algorithm is pinned)".into()
        ));
    }
    Ok(KeyConfig {
        kid: key.kid.clone(),
        alg,
        source,
    })
}

/// The clock skew allowed on `exp` and `nbf`: at most 1h [default: 30s].
fn leeway(file: &FileAuth) -> Result<Duration, ConfigError> {
    let leeway = match &file.leeway {
        Some(text) => {
            parse_duration(text).map_err(|e| ConfigError::new(format!("auth.leeway: {e}")))?
        }
        None => Duration::from_secs(30),
    };
    if leeway > Duration::from_secs(3600) {
        return Err(ConfigError::new("auth.leeway must be at most 1h"));
    }
    Ok(leeway)
}

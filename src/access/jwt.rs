//! Scoped tokens: JWTs verified with configured keys, and minted with one.
//!
//! Each key pins its algorithm; a token is tried only against keys whose algorithm equals
//! its header's `alg` (and whose `kid` equals its `kid` when both have one), so an RS256
//! public key is never used as an HMAC secret and `alg:none` never parses. Several keys may
//! be configured at once for rotation. Required claims: `sub` and `exp`; `nbf` and `aud`
//! (when an audience is configured) are checked, with a small leeway for clock skew.
//! Optional claims: `agents` (names the token may use) and `capabilities` (`run`, `read`,
//! `approve`); absent, they grant all.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

use super::{Caps, Principal, check_principal_name};

/// The key id of the daemon's own signing key (kept in the data directory).
pub const LOCAL_KID: &str = "agui-serve-local";

/// The file in the data directory holding the daemon's own signing secret.
pub const LOCAL_KEY_FILE: &str = "token-signing.key";

/// The daemon's own HMAC secret: read from [`LOCAL_KEY_FILE`] in `data_dir` (made readable
/// by this user only, whatever its mode was), or generated (32 random bytes, hex) into a new
/// file only this user can read. It signs minted tokens
/// when no HMAC key is configured, and survives restarts, so minted tokens do too.
pub fn local_secret(data_dir: &Path) -> Result<Vec<u8>, String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = data_dir.join(LOCAL_KEY_FILE);
    let shown = path.display();
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
    {
        Ok(mut file) => {
            let mut bytes = [0u8; 32];
            getrandom::fill(&mut bytes).map_err(|e| format!("no random source: {e}"))?;
            let text = crate::hex::encode(&bytes);
            file.write_all(text.as_bytes())
                .and_then(|()| file.sync_all())
                .map_err(|e| format!("cannot write {shown}: {e}"))?;
            Ok(text.into_bytes())
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| format!("cannot make {shown} private: {e}"))?;
            let text =
                std::fs::read_to_string(&path).map_err(|e| format!("cannot read {shown}: {e}"))?;
            let text = text.trim();
            if text.len() < 64 {
                return Err(format!(
                    "{shown} holds no usable secret (delete it to have one generated; tokens it signed stop working)"
                ));
            }
            Ok(text.as_bytes().to_vec())
        }
        Err(e) => Err(format!("cannot create {shown}: {e}")),
    }
}

/// The claims of a scoped token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    // Defaulted so that a token without them is refused as lacking a required claim
    // (validation names it), not as malformed.
    #[serde(default)]
    pub sub: String,
    /// RFC 7519 NumericDates, a fraction allowed (taken down to its second); numeric only:
    /// a string is refused, never skipped.
    #[serde(default, deserialize_with = "numeric_date")]
    pub exp: u64,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "optional_numeric_date"
    )]
    pub iat: Option<u64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "optional_numeric_date"
    )]
    pub nbf: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iss: Option<String>,
    /// A string or an array of strings (RFC 7519); checked by the verifier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aud: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agents: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Vec<String>>,
    /// What the principal may spend per day (UTC), over the configured
    /// `[budgets.principal]`: `{"tokens"?, "wall_time"? (seconds), "tool_calls"?}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<crate::budget::Limits>,
}

/// An RFC 7519 NumericDate: whole seconds, or seconds with a fraction (taken down).
fn numeric_date<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    let value = serde_json::Number::deserialize(deserializer)?;
    if let Some(whole) = value.as_u64() {
        return Ok(whole);
    }
    match value.as_f64() {
        Some(seconds) if seconds.is_finite() && (0.0..u64::MAX as f64).contains(&seconds) => {
            Ok(seconds.floor() as u64)
        }
        _ => Err(serde::de::Error::custom(
            "a NumericDate is a non-negative number of seconds",
        )),
    }
}

fn optional_numeric_date<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<u64>, D::Error> {
    numeric_date(deserializer).map(Some)
}

impl Claims {
    /// The principal the claims name.
    pub fn principal(&self) -> Principal {
        let caps = self
            .capabilities
            .as_deref()
            .map_or(Caps::ALL, Caps::from_names);
        Principal::scoped(&self.sub, self.agents.clone(), caps).with_budget(self.budget)
    }
}

/// Why a token was refused. The message says what to fix; it never echoes the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error(
        "the bearer token is neither the daemon's token nor a well-formed JWT with an accepted algorithm"
    )]
    Malformed,
    #[error("no configured key matches the token's algorithm and key id")]
    UnknownKey,
    #[error("the token's signature does not verify")]
    BadSignature,
    #[error("the token has expired")]
    Expired,
    #[error("the token is not valid yet (nbf)")]
    NotYetValid,
    #[error("the token's audience is not this daemon's")]
    WrongAudience,
    #[error("the token's issuer is not accepted")]
    WrongIssuer,
    #[error("the token lacks the required claim `{0}`")]
    MissingClaim(String),
    #[error("the token's `sub` {0}")]
    BadSubject(&'static str),
    #[error("the token names critical header parameters (`crit`) this daemon does not understand")]
    CriticalHeader,
}

/// Where one configured key comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// An HMAC secret (the file's bytes, one trailing newline trimmed).
    Secret(PathBuf),
    /// A PEM public key (RSA, EC or Ed25519, matching the pinned algorithm).
    PublicKey(PathBuf),
    /// A JWKS document; each key's `alg` is required and pinned.
    Jwks(PathBuf),
}

/// One configured key, as the configuration names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyConfig {
    pub kid: Option<String>,
    /// Pinned algorithm (`None` only for a JWKS, whose keys carry their own).
    pub alg: Option<Algorithm>,
    pub source: KeySource,
}

struct VerifyKey {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
}

/// Verifies scoped tokens.
pub struct Verifier {
    keys: Vec<VerifyKey>,
    audience: Option<String>,
    issuer: Option<String>,
    leeway: Duration,
}

impl fmt::Debug for Verifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys: Vec<String> = self
            .keys
            .iter()
            .map(|k| format!("{:?}/{}", k.alg, k.kid.as_deref().unwrap_or("-")))
            .collect();
        f.debug_struct("Verifier")
            .field("keys", &keys)
            .field("audience", &self.audience)
            .field("issuer", &self.issuer)
            .field("leeway", &self.leeway)
            .finish()
    }
}

/// Signs the tokens `POST {path}/tokens` mints.
pub struct Signer {
    kid: Option<String>,
    alg: Algorithm,
    key: EncodingKey,
    /// `aud` and `iss` of minted tokens: the ones verification requires.
    audience: Option<String>,
    issuer: Option<String>,
}

impl fmt::Debug for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Signer")
            .field("kid", &self.kid)
            .field("alg", &self.alg)
            .finish_non_exhaustive()
    }
}

/// Parses a pinned algorithm name (`HS256`, `RS256`, `ES256`, `EdDSA`, ...).
pub fn parse_algorithm(name: &str) -> Result<Algorithm, String> {
    name.parse::<Algorithm>()
        .map_err(|_| format!("unknown JWT algorithm {name:?} (`none` is never accepted)"))
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// An HMAC secret from a file: its bytes, one trailing newline trimmed; at least 32 bytes.
fn read_secret(path: &Path) -> Result<Vec<u8>, String> {
    let mut bytes = read(path)?;
    if bytes.ends_with(b"\n") {
        bytes.pop();
        if bytes.ends_with(b"\r") {
            bytes.pop();
        }
    }
    if bytes.len() < 32 {
        return Err(format!(
            "{}: an HMAC secret must be at least 32 bytes",
            path.display()
        ));
    }
    Ok(bytes)
}

fn is_hmac(alg: Algorithm) -> bool {
    matches!(alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512)
}

/// One configured key as it verifies: its algorithm pinned, and its key read from its file
/// (a JWKS gives one per usable key).
fn load_key(config: &KeyConfig) -> Result<Vec<VerifyKey>, String> {
    match (&config.source, config.alg) {
        (KeySource::Secret(path), Some(alg)) if is_hmac(alg) => Ok(vec![VerifyKey {
            kid: config.kid.clone(),
            alg,
            key: DecodingKey::from_secret(&read_secret(path)?),
        }]),
        (KeySource::Secret(path), _) => Err(format!(
            "{}: a secret key needs an HMAC alg (HS256, HS384, HS512)",
            path.display()
        )),
        (KeySource::PublicKey(path), Some(alg)) => Ok(vec![VerifyKey {
            kid: config.kid.clone(),
            alg,
            key: public_key(path, alg)?,
        }]),
        (KeySource::PublicKey(path), None) => {
            Err(format!("{}: a public key needs its alg", path.display()))
        }
        (KeySource::Jwks(path), _) => jwks_keys(path),
    }
}

/// A PEM public key of the family `alg` names (RSA, EC or Ed25519).
fn public_key(path: &Path, alg: Algorithm) -> Result<DecodingKey, String> {
    let pem = read(path)?;
    match alg {
        Algorithm::RS256
        | Algorithm::RS384
        | Algorithm::RS512
        | Algorithm::PS256
        | Algorithm::PS384
        | Algorithm::PS512 => DecodingKey::from_rsa_pem(&pem),
        Algorithm::ES256 | Algorithm::ES384 => DecodingKey::from_ec_pem(&pem),
        Algorithm::EdDSA => DecodingKey::from_ed_pem(&pem),
        _ => {
            return Err(format!(
                "{}: a public key needs an RS*, PS*, ES* or EdDSA alg",
                path.display()
            ));
        }
    }
    .map_err(|e| format!("{}: not a {alg:?} public key: {e}", path.display()))
}

/// The signature keys of a JWKS document, each with its own pinned `alg`.
fn jwks_keys(path: &Path) -> Result<Vec<VerifyKey>, String> {
    let set: JwkSet = serde_json::from_slice(&read(path)?)
        .map_err(|e| format!("{}: not a JWKS document: {e}", path.display()))?;
    let mut keys = Vec::new();
    for jwk in &set.keys {
        keys.extend(jwk_key(path, jwk)?);
    }
    Ok(keys)
}

/// One key of a JWKS document (`None`: an encryption key, or not a signature algorithm).
fn jwk_key(path: &Path, jwk: &Jwk) -> Result<Option<VerifyKey>, String> {
    let kid = jwk.common.key_id.clone();
    let named = kid.as_deref().unwrap_or("(no kid)");
    // Encryption keys and short shared secrets verify nothing here.
    if matches!(
        jwk.common.public_key_use,
        Some(jsonwebtoken::jwk::PublicKeyUse::Encryption)
    ) {
        tracing::info!(kid = named, "JWKS: an encryption key; not used");
        return Ok(None);
    }
    if let jsonwebtoken::jwk::AlgorithmParameters::OctetKey(oct) = &jwk.algorithm
        && oct.value.len() < 43
    {
        return Err(format!(
            "{}: key {named}: an HMAC secret must be at least 32 bytes",
            path.display()
        ));
    }
    let alg = jwk
        .common
        .key_algorithm
        .and_then(|a| serde_json::to_value(a).ok())
        .and_then(|v| v.as_str().map(str::to_owned))
        .ok_or_else(|| {
            format!(
                "{}: key {named} has no `alg` (each key's algorithm is pinned)",
                path.display()
            )
        })?;
    let Ok(alg) = parse_algorithm(&alg) else {
        tracing::info!(kid = named, alg, "JWKS: not a signature key; not used");
        return Ok(None);
    };
    let key =
        DecodingKey::from_jwk(jwk).map_err(|e| format!("{}: key {named}: {e}", path.display()))?;
    Ok(Some(VerifyKey { kid, alg, key }))
}

impl Verifier {
    /// Loads every configured key (file errors name the file).
    pub fn load(
        configs: &[KeyConfig],
        audience: Option<String>,
        issuer: Option<String>,
        leeway: Duration,
    ) -> Result<Verifier, String> {
        let mut keys = Vec::new();
        for config in configs {
            keys.extend(load_key(config)?);
        }
        Ok(Verifier {
            keys,
            audience,
            issuer,
            leeway,
        })
    }

    /// Also accepts tokens signed with the daemon's own HMAC key.
    pub fn with_local_key(mut self, secret: &[u8]) -> Verifier {
        self.keys.push(VerifyKey {
            kid: Some(LOCAL_KID.to_owned()),
            alg: Algorithm::HS256,
            key: DecodingKey::from_secret(secret),
        });
        self
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn audience(&self) -> Option<&str> {
        self.audience.as_deref()
    }

    /// Verifies `token` and returns its claims.
    pub fn verify(&self, token: &str) -> Result<Claims, TokenError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| TokenError::Malformed)?;
        refuse_critical(token)?;
        let candidates = self.keys.iter().filter(|k| {
            k.alg == header.alg
                && match (&k.kid, &header.kid) {
                    (Some(ours), Some(theirs)) => ours == theirs,
                    _ => true,
                }
        });
        let mut tried = false;
        for key in candidates {
            tried = true;
            match jsonwebtoken::decode::<Claims>(token, &key.key, &self.validation(key.alg)) {
                Ok(data) => {
                    let claims = data.claims;
                    check_principal_name(&claims.sub).map_err(TokenError::BadSubject)?;
                    return Ok(claims);
                }
                // Another key with the same algorithm may be the one (rotation); a key of
                // the wrong family for its pinned algorithm verifies nothing.
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::InvalidSignature
                            | ErrorKind::InvalidAlgorithm
                            | ErrorKind::InvalidKeyFormat
                            | ErrorKind::InvalidRsaKey(_)
                            | ErrorKind::InvalidEcdsaKey
                    ) =>
                {
                    continue;
                }
                Err(e) => return Err(classify(e.kind())),
            }
        }
        Err(if tried {
            TokenError::BadSignature
        } else {
            TokenError::UnknownKey
        })
    }

    fn validation(&self, alg: Algorithm) -> Validation {
        let mut validation = Validation::new(alg);
        validation.set_required_spec_claims(&["exp", "sub"]);
        validation.leeway = self.leeway.as_secs();
        validation.validate_nbf = true;
        // With no audience configured, a token meant for some audience is still refused
        // (it was issued for another service); one without `aud` is accepted.
        if let Some(audience) = &self.audience {
            validation.set_audience(&[audience]);
            validation.required_spec_claims.insert("aud".to_owned());
        }
        if let Some(issuer) = &self.issuer {
            validation.set_issuer(&[issuer]);
            validation.required_spec_claims.insert("iss".to_owned());
        }
        validation
    }
}

/// Refuses a token whose header has `crit`: this daemon understands no JWS extension, and
/// RFC 7515 (4.1.11) says a recipient that does not understand one must refuse the token.
fn refuse_critical(token: &str) -> Result<(), TokenError> {
    use base64::Engine as _;
    let segment = token.split('.').next().unwrap_or_default();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(segment)
        .map_err(|_| TokenError::Malformed)?;
    let header: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|_| TokenError::Malformed)?;
    match header.get("crit") {
        Some(_) => Err(TokenError::CriticalHeader),
        None => Ok(()),
    }
}

fn classify(kind: &ErrorKind) -> TokenError {
    match kind {
        ErrorKind::ExpiredSignature => TokenError::Expired,
        ErrorKind::ImmatureSignature => TokenError::NotYetValid,
        ErrorKind::InvalidAudience => TokenError::WrongAudience,
        ErrorKind::InvalidIssuer => TokenError::WrongIssuer,
        ErrorKind::MissingRequiredClaim(claim) => TokenError::MissingClaim(claim.clone()),
        ErrorKind::InvalidSignature => TokenError::BadSignature,
        _ => TokenError::Malformed,
    }
}

impl Signer {
    /// Signs with an HMAC secret; minted tokens carry `audience` and `issuer`.
    pub fn hmac(kid: Option<String>, alg: Algorithm, secret: &[u8]) -> Signer {
        Signer {
            kid,
            alg,
            key: EncodingKey::from_secret(secret),
            audience: None,
            issuer: None,
        }
    }

    /// Minted tokens carry this `aud` and `iss` (those verification requires).
    pub fn claiming(mut self, audience: Option<String>, issuer: Option<String>) -> Signer {
        self.audience = audience;
        self.issuer = issuer;
        self
    }

    /// The configured key that signs minted tokens: the first HMAC secret, if any.
    pub fn from_config(configs: &[KeyConfig]) -> Result<Option<Signer>, String> {
        for config in configs {
            if let (KeySource::Secret(path), Some(alg)) = (&config.source, config.alg)
                && is_hmac(alg)
            {
                let secret = read_secret(path)?;
                return Ok(Some(Signer::hmac(config.kid.clone(), alg, &secret)));
            }
        }
        Ok(None)
    }

    /// A token for `sub`, valid for `ttl` from now; its expiry (seconds since the epoch).
    pub fn mint(
        &self,
        sub: &str,
        ttl: Duration,
        agents: Option<Vec<String>>,
        capabilities: Option<Vec<String>>,
        budget: Option<crate::budget::Limits>,
    ) -> Result<(String, u64), String> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let exp = now + ttl.as_secs();
        let claims = Claims {
            sub: sub.to_owned(),
            exp,
            iat: Some(now),
            nbf: None,
            iss: self.issuer.clone(),
            aud: self.audience.clone().map(serde_json::Value::String),
            agents,
            capabilities,
            budget,
        };
        let mut header = Header::new(self.alg);
        header.kid = self.kid.clone();
        jsonwebtoken::encode(&header, &claims, &self.key)
            .map(|token| (token, exp))
            .map_err(|e| format!("signing failed: {e}"))
    }
}

#[cfg(test)]
mod tests;

use super::*;

const SECRET: &[u8] = b"0123456789abcdef0123456789abcdef";

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

fn sign(alg: Algorithm, kid: Option<&str>, secret: &[u8], claims: &serde_json::Value) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, &EncodingKey::from_secret(secret)).expect("sign")
}

fn verifier(audience: Option<&str>) -> Verifier {
    Verifier::load(
        &[],
        audience.map(str::to_owned),
        None,
        Duration::from_secs(5),
    )
    .expect("verifier")
    .with_local_key(SECRET)
}

#[test]
fn minted_tokens_verify_and_name_their_principal() {
    let signer = Signer::hmac(Some(LOCAL_KID.into()), Algorithm::HS256, SECRET)
        .claiming(Some("aud1".into()), None);
    let (token, exp) = signer
        .mint(
            "alice",
            Duration::from_secs(60),
            Some(vec!["demo".into()]),
            Some(vec!["read".into()]),
            Some(crate::budget::Limits {
                tokens: Some(500),
                ..Default::default()
            }),
        )
        .expect("mint");
    assert!(exp >= now() + 59);
    let claims = verifier(Some("aud1")).verify(&token).expect("verifies");
    let principal = claims.principal();
    assert_eq!(principal.owner(), "alice");
    assert_eq!(principal.budget().and_then(|b| b.tokens), Some(500));
    assert!(principal.may_use("demo") && !principal.may_use("other"));
    assert!(principal.can(crate::access::Capability::Read));
    assert!(!principal.can(crate::access::Capability::Run));
    assert_eq!(
        verifier(Some("aud2")).verify(&token),
        Err(TokenError::WrongAudience)
    );
}

#[test]
fn a_configured_issuer_is_required() {
    let v = Verifier::load(
        &[],
        None,
        Some("https://login".into()),
        Duration::from_secs(5),
    )
    .expect("verifier")
    .with_local_key(SECRET);
    let t = now();
    let none = serde_json::json!({"sub": "a", "exp": t + 60});
    assert_eq!(
        v.verify(&sign(Algorithm::HS256, None, SECRET, &none)),
        Err(TokenError::MissingClaim("iss".into()))
    );
    let other = serde_json::json!({"sub": "a", "exp": t + 60, "iss": "https://evil"});
    assert_eq!(
        v.verify(&sign(Algorithm::HS256, None, SECRET, &other)),
        Err(TokenError::WrongIssuer)
    );
    let right = serde_json::json!({"sub": "a", "exp": t + 60, "iss": "https://login"});
    assert!(
        v.verify(&sign(Algorithm::HS256, None, SECRET, &right))
            .is_ok()
    );
}

#[test]
fn refusals_are_told_apart() {
    let v = verifier(None);
    let t = now();
    let ok = serde_json::json!({"sub": "a", "exp": t + 60});
    assert!(v.verify(&sign(Algorithm::HS256, None, SECRET, &ok)).is_ok());
    let expired = serde_json::json!({"sub": "a", "exp": t - 60});
    assert_eq!(
        v.verify(&sign(Algorithm::HS256, None, SECRET, &expired)),
        Err(TokenError::Expired)
    );
    let early = serde_json::json!({"sub": "a", "exp": t + 600, "nbf": t + 300});
    assert_eq!(
        v.verify(&sign(Algorithm::HS256, None, SECRET, &early)),
        Err(TokenError::NotYetValid)
    );
    let wrong = b"ffffffffffffffffffffffffffffffff";
    assert_eq!(
        v.verify(&sign(Algorithm::HS256, None, wrong, &ok)),
        Err(TokenError::BadSignature)
    );
    assert_eq!(
        v.verify(&sign(Algorithm::HS512, None, SECRET, &ok)),
        Err(TokenError::UnknownKey)
    );
    assert_eq!(
        v.verify(&sign(Algorithm::HS256, Some("other"), SECRET, &ok)),
        Err(TokenError::UnknownKey)
    );
    let no_exp = serde_json::json!({"sub": "a"});
    assert_eq!(
        v.verify(&sign(Algorithm::HS256, None, SECRET, &no_exp)),
        Err(TokenError::MissingClaim("exp".into()))
    );
    let bad_sub = serde_json::json!({"sub": "", "exp": t + 60});
    assert!(matches!(
        v.verify(&sign(Algorithm::HS256, None, SECRET, &bad_sub)),
        Err(TokenError::BadSubject(_))
    ));
    // alg:none: an unsigned token with a valid payload.
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let none = format!(
        "{}.{}.",
        b64.encode(br#"{"alg":"none","typ":"JWT"}"#),
        b64.encode(ok.to_string())
    );
    assert_eq!(v.verify(&none), Err(TokenError::Malformed));
    assert_eq!(v.verify("not-a-jwt"), Err(TokenError::Malformed));
    // A string nbf is not a date to skip; it is refused.
    let string_nbf = serde_json::json!({"sub": "a", "exp": t + 600, "nbf": "later"});
    assert_eq!(
        v.verify(&sign(Algorithm::HS256, None, SECRET, &string_nbf)),
        Err(TokenError::Malformed)
    );
    // An unknown critical header parameter is refused (RFC 7515).
    let key = EncodingKey::from_secret(SECRET);
    let body = b64.encode(ok.to_string());
    let header = b64.encode(br#"{"alg":"HS256","typ":"JWT","crit":["exp-ext"],"exp-ext":1}"#);
    let signed = format!("{header}.{body}");
    let signature =
        jsonwebtoken::crypto::sign(signed.as_bytes(), &key, Algorithm::HS256).expect("sign");
    let crit = format!("{signed}.{signature}");
    assert_eq!(v.verify(&crit), Err(TokenError::CriticalHeader));
    // The same token without `crit` verifies: the refusal is the header's.
    let header = b64.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
    let signed = format!("{header}.{body}");
    let signature =
        jsonwebtoken::crypto::sign(signed.as_bytes(), &key, Algorithm::HS256).expect("sign");
    assert!(v.verify(&format!("{signed}.{signature}")).is_ok());
}

#[test]
fn the_local_secret_is_kept_private_and_reused() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("agui-jwt-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("dir");
    let first = local_secret(&dir).expect("generated");
    let path = dir.join(LOCAL_KEY_FILE);
    let mode = |p: &Path| std::fs::metadata(p).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    assert_eq!(local_secret(&dir).expect("read"), first);
    assert_eq!(
        mode(&path),
        0o600,
        "an existing key file is made private again"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn algorithms_parse_and_none_is_refused() {
    assert_eq!(parse_algorithm("RS256"), Ok(Algorithm::RS256));
    assert!(parse_algorithm("none").is_err());
}

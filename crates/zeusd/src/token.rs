//! Bearer tokens: HS256 JWTs (`header.claims.signature`, base64url without padding) with the
//! claims `sub`, `scopes` (API group names) and an optional `exp` (Unix seconds).
//!
//! The signature is checked with HMAC-SHA256's constant-time comparison before anything in
//! the token is believed; only `alg: HS256` is accepted (never `none`).

use std::path::Path;

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::Sha256;

use crate::api::Group;

type HmacSha256 = Hmac<Sha256>;

/// The claims of a token.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Claims {
    pub sub: String,
    pub scopes: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exp: Option<u64>,
}

impl Claims {
    pub fn to_json(&self) -> Value {
        let mut v = json!({"sub": self.sub, "scopes": self.scopes});
        if let Some(exp) = self.exp {
            v["exp"] = json!(exp);
        }
        v
    }
}

/// Who made the request: the verified claims, or `None` when auth is off. Every request
/// that passes the gate (`auth::gate`) carries one in its extensions.
#[derive(Clone, Debug)]
pub struct Identity(pub Option<Claims>);

/// Why a token was refused (401).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("missing Authorization: Bearer token")]
    Missing,
    #[error("malformed token: {0}")]
    Malformed(&'static str),
    #[error("bad token signature")]
    BadSignature,
    #[error("token expired")]
    Expired,
}

/// The HS256 key.
#[derive(Clone)]
pub struct Signer {
    key: Vec<u8>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Signer(..)")
    }
}

impl Signer {
    pub fn new(key: Vec<u8>) -> Result<Signer, String> {
        if key.len() < 16 {
            return Err(format!(
                "signing key is {} bytes: use at least 16 (e.g. `head -c 32 /dev/urandom | base64 > KEY`)",
                key.len()
            ));
        }
        Ok(Signer { key })
    }

    /// Read the key file: its bytes with one trailing newline stripped.
    pub fn from_file(path: &Path) -> Result<Signer, String> {
        let mut key = std::fs::read(path)
            .map_err(|e| format!("cannot read signing key {}: {e}", path.display()))?;
        use std::os::unix::fs::PermissionsExt;
        if let Ok(m) = std::fs::metadata(path) {
            let mode = m.permissions().mode();
            if mode & 0o077 != 0 {
                eprintln!(
                    "zeusd: warning: signing key {} is readable by other users (mode {:o}): \
                     anyone who reads it can issue tokens; chmod 600 it",
                    path.display(),
                    mode & 0o777
                );
            }
        }
        if key.last() == Some(&b'\n') {
            key.pop();
            if key.last() == Some(&b'\r') {
                key.pop();
            }
        }
        Signer::new(key).map_err(|e| format!("{}: {e}", path.display()))
    }

    fn mac(&self) -> HmacSha256 {
        HmacSha256::new_from_slice(&self.key).expect("HMAC takes keys of any length")
    }

    pub fn issue(&self, claims: &Claims) -> String {
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
        let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).expect("claims serialize"));
        let signing_input = format!("{header}.{body}");
        let mut mac = self.mac();
        mac.update(signing_input.as_bytes());
        let sig = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
        format!("{signing_input}.{sig}")
    }

    /// Check a token's signature, algorithm and expiry at `now` (Unix seconds).
    pub fn verify(&self, token: &str, now: u64) -> Result<Claims, TokenError> {
        let mut parts = token.split('.');
        let (Some(h), Some(b), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(TokenError::Malformed("expected three dot-separated parts"));
        };
        let sig = URL_SAFE_NO_PAD
            .decode(s)
            .map_err(|_| TokenError::Malformed("signature is not base64url"))?;
        let mut mac = self.mac();
        mac.update(h.as_bytes());
        mac.update(b".");
        mac.update(b.as_bytes());
        mac.verify_slice(&sig)
            .map_err(|_| TokenError::BadSignature)?;
        // Signed by us from here on.
        let header: Value = URL_SAFE_NO_PAD
            .decode(h)
            .ok()
            .and_then(|v| serde_json::from_slice(&v).ok())
            .ok_or(TokenError::Malformed("header is not base64url JSON"))?;
        if header.get("alg").and_then(Value::as_str) != Some("HS256") {
            return Err(TokenError::Malformed("alg must be HS256"));
        }
        let claims: Claims = URL_SAFE_NO_PAD
            .decode(b)
            .ok()
            .and_then(|v| serde_json::from_slice(&v).ok())
            .ok_or(TokenError::Malformed(
                "claims are not base64url JSON with sub and scopes",
            ))?;
        if claims.exp.is_some_and(|exp| exp <= now) {
            return Err(TokenError::Expired);
        }
        // As upstream zeusd does: a scope this daemon does not know, or an audience (a token
        // minted for some other service), is refused rather than ignored.
        if claims
            .scopes
            .iter()
            .any(|sc| Group::from_name(sc).is_none())
        {
            return Err(TokenError::Malformed("a scope this daemon does not know"));
        }
        let raw: Option<Value> = URL_SAFE_NO_PAD
            .decode(b)
            .ok()
            .and_then(|v| serde_json::from_slice(&v).ok());
        if raw.as_ref().is_some_and(|v| v.get("aud").is_some()) {
            return Err(TokenError::Malformed(
                "an aud claim (a token for another service)",
            ));
        }
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer() -> Signer {
        Signer::new(b"0123456789abcdef0123".to_vec()).unwrap()
    }

    fn claims(exp: Option<u64>) -> Claims {
        Claims {
            sub: "alice".into(),
            scopes: vec!["gpu-read".into()],
            exp,
        }
    }

    #[test]
    fn round_trip_and_expiry() {
        let s = signer();
        let t = s.issue(&claims(Some(100)));
        assert_eq!(s.verify(&t, 99), Ok(claims(Some(100))));
        assert_eq!(s.verify(&t, 100), Err(TokenError::Expired));
        let t = s.issue(&claims(None));
        assert_eq!(s.verify(&t, u64::MAX), Ok(claims(None)));
    }

    /// A token over any JSON claims, signed with `s`'s key.
    fn sign_raw(s: &Signer, claims: &Value) -> String {
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"HS256","typ":"JWT"}"#);
        let body = URL_SAFE_NO_PAD.encode(serde_json::to_vec(claims).unwrap());
        let input = format!("{header}.{body}");
        let mut mac = s.mac();
        mac.update(input.as_bytes());
        let sig = URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes());
        format!("{input}.{sig}")
    }

    /// As upstream zeusd: unknown scopes and audiences are refused, not ignored.
    #[test]
    fn unknown_scopes_and_audiences_are_refused() {
        let s = signer();
        let unknown = sign_raw(&s, &json!({"sub": "a", "scopes": ["gpu-read", "root"]}));
        assert!(matches!(
            s.verify(&unknown, 0),
            Err(TokenError::Malformed(_))
        ));
        let aud = sign_raw(
            &s,
            &json!({"sub": "a", "scopes": ["gpu-read"], "aud": "other"}),
        );
        assert!(matches!(s.verify(&aud, 0), Err(TokenError::Malformed(_))));
        let fine = sign_raw(&s, &json!({"sub": "a", "scopes": ["gpu-read"]}));
        assert!(s.verify(&fine, 0).is_ok());
    }

    #[test]
    fn tampering_and_other_keys_fail() {
        let s = signer();
        let t = s.issue(&claims(None));
        let other = Signer::new(b"another key of 16+ bytes".to_vec()).unwrap();
        assert_eq!(other.verify(&t, 0), Err(TokenError::BadSignature));
        // Swap in claims with more scopes, keep the signature.
        let forged = URL_SAFE_NO_PAD.encode(br#"{"sub":"alice","scopes":["gpu-control"]}"#);
        let mut parts: Vec<&str> = t.split('.').collect();
        parts[1] = &forged;
        assert_eq!(s.verify(&parts.join("."), 0), Err(TokenError::BadSignature));
        assert!(matches!(s.verify("a.b", 0), Err(TokenError::Malformed(_))));
        // alg none with an empty signature.
        let none = format!(
            "{}.{}.",
            URL_SAFE_NO_PAD.encode(br#"{"alg":"none"}"#),
            URL_SAFE_NO_PAD.encode(br#"{"sub":"x","scopes":["gpu-control"]}"#)
        );
        assert_eq!(s.verify(&none, 0), Err(TokenError::BadSignature));
    }

    #[test]
    fn short_keys_are_refused() {
        assert!(Signer::new(b"short".to_vec()).is_err());
    }
}

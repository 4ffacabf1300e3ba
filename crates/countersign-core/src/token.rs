//! Bearer tokens: stored only as SHA-256 hashes and compared in constant time.
//!
//! A token is `cs_` followed by 43 base64url characters (32 random bytes). SHA-256 is
//! enough at rest (rather than a slow password hash) because the secret has 256 bits
//! of entropy: there is nothing to guess.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::principal::{Principal, Role};
use crate::time::Timestamp;

pub const TOKEN_PREFIX: &str = "cs_";

/// A token as stored: never the secret, only its hash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Public handle for listing and revoking, e.g. `tok_3f9d0e5b1a2c`.
    pub id: String,
    pub name: String,
    pub role: Role,
    /// Lowercase hex SHA-256 of the token.
    pub hash: String,
    pub created_at: Timestamp,
    pub revoked_at: Option<Timestamp>,
}

impl TokenRecord {
    pub fn principal(&self) -> Principal {
        Principal::from_token(&self.name, self.role)
    }

    pub fn is_active(&self) -> bool {
        self.revoked_at.is_none()
    }
}

/// Formats 32 random bytes as a token.
pub fn format_token(secret: [u8; 32]) -> String {
    format!("{TOKEN_PREFIX}{}", URL_SAFE_NO_PAD.encode(secret))
}

/// The stored form of a presented token.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// Whether `token` hashes to `stored_hash`, compared in constant time.
pub fn token_matches(token: &str, stored_hash: &str) -> bool {
    let presented = hash_token(token);
    presented.as_bytes().ct_eq(stored_hash.as_bytes()).into()
}

/// A token name: what the holder is called in proofs, so kept short and printable.
pub fn validate_token_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err("a token name must be 1 to 64 characters".into());
    }
    if !name
        .chars()
        .all(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | '.' | '@' | ' '))
    {
        return Err(format!(
            "token name {name:?} may only contain letters, digits, spaces and - _ . @"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_through_their_hash() {
        let token = format_token([7; 32]);
        assert!(token.starts_with("cs_"));
        assert_eq!(token.len(), 3 + 43);
        let stored = hash_token(&token);
        assert!(token_matches(&token, &stored));
        assert!(!token_matches(&format_token([8; 32]), &stored));
        assert!(!token_matches("", &stored));
    }

    #[test]
    fn names_are_checked() {
        assert!(validate_token_name("alice@example.com").is_ok());
        assert!(validate_token_name("").is_err());
        assert!(validate_token_name("bad\nname").is_err());
    }
}

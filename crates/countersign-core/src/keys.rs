//! Signing keys and their publication as a JWKS (RFC 7517) of OKP / Ed25519 keys
//! (RFC 8037), each named by its RFC 7638 thumbprint.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::CoreError;

/// An Ed25519 public key as a JWK.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Jwk {
    pub kty: String,
    pub crv: String,
    /// The public key, base64url without padding.
    pub x: String,
    pub kid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alg: Option<String>,
    #[serde(default, rename = "use", skip_serializing_if = "Option::is_none")]
    pub use_: Option<String>,
}

impl Jwk {
    pub fn from_verifying_key(key: &VerifyingKey) -> Self {
        let x = URL_SAFE_NO_PAD.encode(key.as_bytes());
        Self {
            kid: thumbprint(&x),
            kty: "OKP".into(),
            crv: "Ed25519".into(),
            x,
            alg: Some("EdDSA".into()),
            use_: Some("sig".into()),
        }
    }

    /// The Ed25519 key, when this JWK is a well-formed OKP / Ed25519 key.
    pub fn verifying_key(&self) -> Result<VerifyingKey, CoreError> {
        if self.kty != "OKP" || self.crv != "Ed25519" {
            return Err(CoreError::invalid(
                "jwk",
                format!(
                    "key {} is {}/{}, expected OKP/Ed25519",
                    self.kid, self.kty, self.crv
                ),
            ));
        }
        let bytes = URL_SAFE_NO_PAD
            .decode(self.x.trim_end_matches('='))
            .map_err(|e| {
                CoreError::invalid("jwk", format!("key {}: x is not base64url: {e}", self.kid))
            })?;
        let bytes: [u8; 32] = bytes.try_into().map_err(|_| {
            CoreError::invalid("jwk", format!("key {}: x is not 32 bytes", self.kid))
        })?;
        VerifyingKey::from_bytes(&bytes)
            .map_err(|e| CoreError::invalid("jwk", format!("key {}: {e}", self.kid)))
    }
}

/// RFC 7638 thumbprint of an Ed25519 OKP key: base64url(SHA-256 of the canonical
/// `{"crv":"Ed25519","kty":"OKP","x":...}`), members in lexicographic order, no spaces.
pub fn thumbprint(x: &str) -> String {
    let canonical = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{x}"}}"#);
    URL_SAFE_NO_PAD.encode(Sha256::digest(canonical.as_bytes()))
}

/// A JSON Web Key Set.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Jwks {
    pub keys: Vec<Jwk>,
}

impl Jwks {
    pub fn find(&self, kid: &str) -> Option<&Jwk> {
        self.keys.iter().find(|k| k.kid == kid)
    }
}

/// A private signing key with its key id.
#[derive(Clone)]
pub struct Signer {
    key: SigningKey,
    kid: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl Signer {
    /// A signer from a 32-byte Ed25519 seed (the caller supplies the randomness).
    pub fn from_seed(seed: [u8; 32]) -> Self {
        let key = SigningKey::from_bytes(&seed);
        let kid = Jwk::from_verifying_key(&key.verifying_key()).kid;
        Self { key, kid }
    }

    pub fn kid(&self) -> &str {
        &self.kid
    }

    pub fn seed(&self) -> [u8; 32] {
        self.key.to_bytes()
    }

    pub fn jwk(&self) -> Jwk {
        Jwk::from_verifying_key(&self.key.verifying_key())
    }

    pub fn sign(&self, message: &[u8]) -> [u8; 64] {
        self.key.sign(message).to_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc8037_example_thumbprint() {
        // RFC 8037 appendix A.3: the thumbprint of the example Ed25519 public key.
        assert_eq!(
            thumbprint("11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"),
            "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"
        );
    }

    #[test]
    fn rfc8037_example_key_pair() {
        // RFC 8037 appendix A.1/A.2: seed d and its public key x.
        let d = URL_SAFE_NO_PAD
            .decode("nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A")
            .unwrap();
        let signer = Signer::from_seed(d.try_into().unwrap());
        let jwk = signer.jwk();
        assert_eq!(jwk.x, "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo");
        assert_eq!(signer.kid(), "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k");
        assert!(jwk.verifying_key().is_ok());
    }

    #[test]
    fn rejects_other_key_types() {
        let mut jwk = Signer::from_seed([7; 32]).jwk();
        jwk.crv = "P-256".into();
        assert!(jwk.verifying_key().is_err());
    }
}

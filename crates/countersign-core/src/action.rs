//! The action an agent asks to perform, and its digest: the value a proof binds.
//!
//! `action_digest = "sha256:" + hex(SHA-256(RFC 8785 canonical JSON of the action))`,
//! where the action is `{"description": string, "details": {string: string}}`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What the agent wants to do: a human-readable description and string-valued details
/// (amounts and ids are strings, so no precision is lost in JSON numbers).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Action {
    pub description: String,
    #[serde(default)]
    pub details: BTreeMap<String, String>,
}

impl Action {
    pub fn new(description: impl Into<String>, details: BTreeMap<String, String>) -> Self {
        Self {
            description: description.into(),
            details,
        }
    }

    /// The RFC 8785 (JCS) canonical JSON bytes of this action.
    pub fn canonical_json(&self) -> Vec<u8> {
        // An object of strings always canonicalizes; the fallback keeps this infallible
        // without a panic path and can never be reached.
        crate::jcs::to_vec(self).unwrap_or_default()
    }

    pub fn digest(&self) -> ActionDigest {
        ActionDigest::of_canonical(&self.canonical_json())
    }
}

/// `sha256:<64 lowercase hex digits>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ActionDigest(String);

impl ActionDigest {
    pub fn of_canonical(canonical: &[u8]) -> Self {
        Self(format!("sha256:{}", hex::encode(Sha256::digest(canonical))))
    }

    /// Parses and normalizes a digest string; `None` when it is not `sha256:` + 64 hex.
    pub fn parse(text: &str) -> Option<Self> {
        let hex_part = text.strip_prefix("sha256:")?;
        if hex_part.len() == 64 && hex_part.bytes().all(|b| b.is_ascii_hexdigit()) {
            Some(Self(format!("sha256:{}", hex_part.to_ascii_lowercase())))
        } else {
            None
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ActionDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Vectors {
        vectors: Vec<Vector>,
    }

    #[derive(Deserialize)]
    struct Vector {
        action: Action,
        canonical_json: String,
        action_digest: String,
    }

    #[test]
    fn matches_known_answers() {
        let vectors: Vectors =
            serde_json::from_str(include_str!("../../../testdata/action-digest.json")).unwrap();
        assert!(vectors.vectors.len() >= 4);
        for v in vectors.vectors {
            assert_eq!(
                String::from_utf8(v.action.canonical_json()).unwrap(),
                v.canonical_json
            );
            assert_eq!(v.action.digest().as_str(), v.action_digest);
        }
    }

    #[test]
    fn detail_order_does_not_change_the_digest_but_values_do() {
        let a: Action =
            serde_json::from_str(r#"{"description":"d","details":{"b":"2","a":"1"}}"#).unwrap();
        let b: Action =
            serde_json::from_str(r#"{"description":"d","details":{"a":"1","b":"2"}}"#).unwrap();
        let c: Action =
            serde_json::from_str(r#"{"description":"d","details":{"a":"1","b":"3"}}"#).unwrap();
        assert_eq!(a.digest(), b.digest());
        assert_ne!(a.digest(), c.digest());
    }

    #[test]
    fn parses_digests_strictly() {
        let good = "sha256:CA0F009325BF217CFF42BAAD628505A58A30544630274413F083A7743B810954";
        assert_eq!(
            ActionDigest::parse(good).unwrap().as_str(),
            good.to_ascii_lowercase().replace("SHA256", "sha256")
        );
        assert!(ActionDigest::parse("sha256:abc").is_none());
        assert!(ActionDigest::parse("md5:ca0f").is_none());
    }
}

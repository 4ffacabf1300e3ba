//! Anchored keys: which public keys a verifier may trust.
//!
//! A key is trusted when it can be traced: it is one of the verifier's roots (the key
//! files in a data directory, or a JWKS the auditor pinned), or a trusted key endorsed
//! it in a signed statement that is an entry of the log (`key_endorsed`). A key that is
//! merely written somewhere (a database row, a bundle's own `jwks.json`) is not trusted:
//! whoever can write there could have put it there. Trust only flows from an endorser to
//! the key it endorses, never back.
//!
//! The endorsement is a DSSE signature (payload type [`ENDORSEMENT_PAYLOAD_TYPE`]) over
//! the RFC 8785 JSON `{"endorser": <kid>, "key": <JWK>, "type": "countersign.key-endorsement/v1"}`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};

use crate::event::{Event, EventKind, LogEntry};
use crate::keys::{Jwk, Jwks, Signer, thumbprint};
use crate::proof::pae;
use crate::time::Timestamp;

pub const ENDORSEMENT_PAYLOAD_TYPE: &str = "application/vnd.countersign.key-endorsement+json";
pub const ENDORSEMENT_TYPE: &str = "countersign.key-endorsement/v1";
/// The subject of every `key_endorsed` entry, so they can be found without reading the
/// whole log.
pub const KEYS_SUBJECT: &str = "keys";

/// One key vouching for another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endorsement {
    /// The endorsed public key.
    pub key: Jwk,
    /// The key id of the endorsing key.
    pub endorser: String,
    /// Standard base64 of the Ed25519 signature over the statement's DSSE encoding.
    pub signature: String,
}

/// A published key is exactly what countersign publishes: Ed25519, named by its
/// thumbprint, for signatures.
pub fn check_published_key(key: &Jwk) -> Result<(), String> {
    key.verifying_key().map_err(|e| e.to_string())?;
    if key.kid != thumbprint(&key.x) {
        return Err(format!(
            "key {} is not named by its RFC 7638 thumbprint",
            key.kid
        ));
    }
    if key.alg.as_deref() != Some("EdDSA") || key.use_.as_deref() != Some("sig") {
        return Err(format!("key {} is not an EdDSA signing key", key.kid));
    }
    Ok(())
}

fn statement(key: &Jwk, endorser: &str) -> Vec<u8> {
    let value = json!({"type": ENDORSEMENT_TYPE, "endorser": endorser, "key": key});
    crate::jcs::to_vec(&value).unwrap_or_default()
}

impl Endorsement {
    /// `endorser` vouches for `key`.
    pub fn sign(key: &Jwk, endorser: &Signer) -> Self {
        let body = statement(key, endorser.kid());
        let sig = endorser.sign(&pae(ENDORSEMENT_PAYLOAD_TYPE, &body));
        Self {
            key: key.clone(),
            endorser: endorser.kid().to_string(),
            signature: STANDARD.encode(sig),
        }
    }

    /// Whether the signature is `endorser`'s (and `endorser` is the key it names).
    pub fn verify(&self, endorser: &Jwk) -> bool {
        if endorser.kid != self.endorser || check_published_key(&self.key).is_err() {
            return false;
        }
        let Ok(public) = endorser.verifying_key() else {
            return false;
        };
        let Some(sig) = STANDARD
            .decode(&self.signature)
            .ok()
            .and_then(|b| <[u8; 64]>::try_from(b).ok())
        else {
            return false;
        };
        let body = statement(&self.key, &self.endorser);
        public
            .verify_strict(
                &pae(ENDORSEMENT_PAYLOAD_TYPE, &body),
                &ed25519_dalek::Signature::from_bytes(&sig),
            )
            .is_ok()
    }

    /// The log event that records it.
    pub fn event(&self, at: Timestamp, actor: Option<String>) -> Event {
        let mut event = Event::system(
            EventKind::KeyEndorsed,
            at,
            actor,
            json!({
                "kid": self.key.kid,
                "key": self.key,
                "endorser": self.endorser,
                "signature": self.signature,
            }),
        );
        event.subject = Some(KEYS_SUBJECT.to_string());
        event
    }

    /// The endorsement a `key_endorsed` entry records (unverified), if it is one.
    pub fn from_entry(entry: &LogEntry) -> Option<Self> {
        if entry.kind != EventKind::KeyEndorsed {
            return None;
        }
        let key: Jwk = serde_json::from_value(entry.data.get("key")?.clone()).ok()?;
        if entry.data.get("kid").and_then(Value::as_str) != Some(key.kid.as_str()) {
            return None;
        }
        Some(Self {
            key,
            endorser: entry.data.get("endorser")?.as_str()?.to_string(),
            signature: entry.data.get("signature")?.as_str()?.to_string(),
        })
    }
}

/// The keys traceable from `roots` through `endorsements` (in any order): the roots
/// first, then each endorsed key in the order it became trusted. An endorsement whose
/// endorser is not trusted, or whose signature does not verify, adds nothing.
pub fn trusted(roots: &Jwks, endorsements: &[Endorsement]) -> Jwks {
    let mut keys: Vec<Jwk> = Vec::new();
    for key in &roots.keys {
        if keys.iter().all(|k| k.kid != key.kid) {
            keys.push(key.clone());
        }
    }
    loop {
        let before = keys.len();
        for e in endorsements {
            if keys.iter().any(|k| k.kid == e.key.kid) {
                continue;
            }
            if let Some(endorser) = keys.iter().find(|k| k.kid == e.endorser)
                && e.verify(endorser)
            {
                keys.push(e.key.clone());
            }
        }
        if keys.len() == before {
            break;
        }
    }
    Jwks { keys }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer(n: u8) -> Signer {
        Signer::from_seed([n; 32])
    }

    #[test]
    fn trust_follows_endorsements_from_the_roots_only() {
        let (a, b, c, x) = (signer(1), signer(2), signer(3), signer(4));
        let roots = Jwks {
            keys: vec![a.jwk()],
        };
        // a -> b -> c, given out of order; x endorses itself and is endorsed by nobody.
        let endorsements = vec![
            Endorsement::sign(&c.jwk(), &b),
            Endorsement::sign(&b.jwk(), &a),
            Endorsement::sign(&x.jwk(), &x),
        ];
        let kids: Vec<String> = trusted(&roots, &endorsements)
            .keys
            .into_iter()
            .map(|k| k.kid)
            .collect();
        assert_eq!(kids, vec![a.kid(), b.kid(), c.kid()]);
        // Trust does not flow back: from c's point of view, a and b are not trusted.
        let from_c = trusted(
            &Jwks {
                keys: vec![c.jwk()],
            },
            &endorsements,
        );
        assert_eq!(from_c.keys.len(), 1);
    }

    #[test]
    fn a_forged_or_altered_endorsement_adds_nothing() {
        let (a, b, x) = (signer(1), signer(2), signer(4));
        let roots = Jwks {
            keys: vec![a.jwk()],
        };
        // Signed by x but claiming to be a's.
        let mut forged = Endorsement::sign(&x.jwk(), &x);
        forged.endorser = a.kid().to_string();
        // a's endorsement of b, with the key swapped for x.
        let mut swapped = Endorsement::sign(&b.jwk(), &a);
        swapped.key = x.jwk();
        let mut garbage = Endorsement::sign(&b.jwk(), &a);
        garbage.signature = "not base64".into();
        assert_eq!(trusted(&roots, &[forged, swapped, garbage]).keys.len(), 1);
    }

    #[test]
    fn an_endorsement_round_trips_through_its_log_entry() {
        let (a, b) = (signer(1), signer(2));
        let e = Endorsement::sign(&b.jwk(), &a);
        let sealed = e
            .event(Timestamp::parse("2026-12-01T00:00:00Z").unwrap(), None)
            .seal([0; 32]);
        assert_eq!(sealed.entry.subject.as_deref(), Some(KEYS_SUBJECT));
        let back = Endorsement::from_entry(&sealed.entry).unwrap();
        assert_eq!(back, e);
        assert!(back.verify(&a.jwk()));
        assert!(!back.verify(&b.jwk()));
    }
}

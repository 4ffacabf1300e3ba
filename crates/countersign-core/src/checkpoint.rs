//! Signed checkpoints in the C2SP tlog-checkpoint format: a signed note whose text is
//!
//! ```text
//! <origin>
//! <tree size, decimal>
//! <root hash, standard base64>
//! ```
//!
//! followed by a blank line and one signature line per signer,
//! `— <key name> <base64(key id || Ed25519 signature)>` (U+2014 EM DASH), where the
//! signature covers the note text including its final newline, the key name is the log's
//! origin, and the 4-byte key id is the start of SHA-256(name || 0x0A || 0x01 || public
//! key), per C2SP signed-note.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ed25519_dalek::Signature;
use sha2::{Digest, Sha256};

use crate::keys::{Jwk, Jwks, Signer};
use crate::merkle::Hash;

const DASH: &str = "\u{2014} ";
const ED25519_ALG: u8 = 0x01;

/// A signature line of a note: the key name and the base64-decoded key id and signature.
pub type NoteSignature = (String, Vec<u8>);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub origin: String,
    pub size: u64,
    pub root: Hash,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    #[error("malformed checkpoint: {0}")]
    Malformed(String),
    #[error("checkpoint origin is {found:?}, expected {expected:?}")]
    WrongOrigin { found: String, expected: String },
    #[error("no signature on the checkpoint is by a known key of {origin:?}")]
    UnknownKey { origin: String },
    #[error("the checkpoint signature by key {kid} does not verify: the checkpoint was altered")]
    BadSignature { kid: String },
}

/// The C2SP key id of an Ed25519 key under `name`.
pub fn key_id(name: &str, public_key: &[u8; 32]) -> [u8; 4] {
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update(b"\n");
    h.update([ED25519_ALG]);
    h.update(public_key);
    let digest = h.finalize();
    [digest[0], digest[1], digest[2], digest[3]]
}

/// The C2SP verifier key string, `<name>+<hex key id>+<base64(0x01 || public key)>`,
/// which note tooling (e.g. Go's golang.org/x/mod/sumdb/note) accepts.
pub fn verifier_key(name: &str, jwk: &Jwk) -> Option<String> {
    let key = jwk.verifying_key().ok()?;
    let mut encoded = vec![ED25519_ALG];
    encoded.extend_from_slice(key.as_bytes());
    Some(format!(
        "{name}+{}+{}",
        hex::encode(key_id(name, key.as_bytes())),
        STANDARD.encode(encoded)
    ))
}

impl Checkpoint {
    /// The note text that is signed.
    pub fn body(&self) -> String {
        format!(
            "{}\n{}\n{}\n",
            self.origin,
            self.size,
            STANDARD.encode(self.root)
        )
    }

    /// The signed note, signed by `signer` under the origin as key name.
    pub fn sign(&self, signer: &Signer) -> String {
        let body = self.body();
        let jwk = signer.jwk();
        let public = jwk
            .verifying_key()
            .map(|k| *k.as_bytes())
            .unwrap_or([0; 32]);
        let mut blob = key_id(&self.origin, &public).to_vec();
        blob.extend_from_slice(&signer.sign(body.as_bytes()));
        format!("{body}\n{DASH}{} {}\n", self.origin, STANDARD.encode(blob))
    }

    /// Parses a signed note without checking signatures.
    pub fn parse(note: &str) -> Result<(Self, Vec<NoteSignature>), CheckpointError> {
        let malformed = |m: &str| CheckpointError::Malformed(m.to_string());
        let (body, signatures) = note
            .split_once("\n\n")
            .ok_or_else(|| malformed("no blank line between the text and its signatures"))?;
        let body = format!("{body}\n");
        let mut lines = body.lines();
        let origin = lines
            .next()
            .filter(|l| !l.is_empty())
            .ok_or_else(|| malformed("no origin line"))?;
        let size_line = lines.next().ok_or_else(|| malformed("no tree size line"))?;
        if size_line.is_empty()
            || !size_line.bytes().all(|b| b.is_ascii_digit())
            || (size_line.len() > 1 && size_line.starts_with('0'))
        {
            return Err(malformed("the tree size is not a decimal number"));
        }
        let size: u64 = size_line
            .parse()
            .map_err(|_| malformed("the tree size is too large"))?;
        let root_line = lines.next().ok_or_else(|| malformed("no root hash line"))?;
        let root: Hash = STANDARD
            .decode(root_line)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| malformed("the root hash is not 32 bytes of standard base64"))?;
        if lines.next().is_some() {
            return Err(malformed("unexpected lines after the root hash"));
        }
        if note.chars().any(|c| c.is_control() && c != '\n') {
            return Err(malformed("control characters"));
        }
        let mut sigs = Vec::new();
        if !signatures.ends_with('\n') {
            return Err(malformed("the signature block does not end with a newline"));
        }
        for line in signatures.lines() {
            let rest = line
                .strip_prefix(DASH)
                .ok_or_else(|| malformed("a signature line does not start with an em dash"))?;
            let (name, blob) = rest
                .split_once(' ')
                .ok_or_else(|| malformed("a signature line has no signature"))?;
            let blob = STANDARD
                .decode(blob)
                .map_err(|_| malformed("a signature is not standard base64"))?;
            if blob.len() < 5 {
                return Err(malformed("a signature is too short"));
            }
            sigs.push((name.to_string(), blob));
        }
        if sigs.is_empty() {
            return Err(malformed("the note has no signature"));
        }
        Ok((
            Self {
                origin: origin.to_string(),
                size,
                root,
            },
            sigs,
        ))
    }

    /// Parses a signed note and verifies that a key in `jwks` signed it under its
    /// origin; when `origin` is given, the checkpoint must be of that log.
    pub fn verify(note: &str, jwks: &Jwks, origin: Option<&str>) -> Result<Self, CheckpointError> {
        let (checkpoint, signatures) = Self::parse(note)?;
        if let Some(expected) = origin
            && expected != checkpoint.origin
        {
            return Err(CheckpointError::WrongOrigin {
                found: checkpoint.origin,
                expected: expected.to_string(),
            });
        }
        let body = checkpoint.body();
        let keys: Vec<_> = jwks
            .keys
            .iter()
            .filter_map(|jwk| jwk.verifying_key().ok().map(|k| (jwk, k)))
            .collect();
        for (name, blob) in &signatures {
            if *name != checkpoint.origin {
                continue;
            }
            let (id, sig) = blob.split_at(4);
            for (jwk, key) in &keys {
                if key_id(name, key.as_bytes()) != id {
                    continue;
                }
                let Ok(sig) = Signature::from_slice(sig) else {
                    return Err(CheckpointError::BadSignature {
                        kid: jwk.kid.clone(),
                    });
                };
                return match key.verify_strict(body.as_bytes(), &sig) {
                    Ok(()) => Ok(checkpoint),
                    Err(_) => Err(CheckpointError::BadSignature {
                        kid: jwk.kid.clone(),
                    }),
                };
            }
        }
        Err(CheckpointError::UnknownKey {
            origin: checkpoint.origin,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::merkle::leaf_hash;

    fn signer() -> Signer {
        Signer::from_seed([3; 32])
    }

    fn jwks() -> Jwks {
        Jwks {
            keys: vec![signer().jwk()],
        }
    }

    fn checkpoint() -> Checkpoint {
        Checkpoint {
            origin: "countersign/test-log".into(),
            size: 42,
            root: leaf_hash(b"root"),
        }
    }

    #[test]
    fn signs_and_verifies_in_the_c2sp_layout() {
        let note = checkpoint().sign(&signer());
        let lines: Vec<&str> = note.split('\n').collect();
        assert_eq!(lines[0], "countersign/test-log");
        assert_eq!(lines[1], "42");
        assert_eq!(lines[2], STANDARD.encode(leaf_hash(b"root")));
        assert_eq!(lines[3], "");
        assert!(lines[4].starts_with("\u{2014} countersign/test-log "));
        assert!(note.ends_with('\n'));
        let verified = Checkpoint::verify(&note, &jwks(), Some("countersign/test-log")).unwrap();
        assert_eq!(verified, checkpoint());
    }

    #[test]
    fn every_altered_byte_is_refused() {
        let note = checkpoint().sign(&signer());
        let bytes = note.as_bytes();
        for i in 0..bytes.len() {
            let mut altered = bytes.to_vec();
            altered[i] ^= 0x01;
            let Ok(text) = String::from_utf8(altered) else {
                continue;
            };
            assert!(
                Checkpoint::verify(&text, &jwks(), Some("countersign/test-log")).is_err(),
                "byte {i} altered and still valid:\n{text}"
            );
        }
    }

    #[test]
    fn wrong_origin_unknown_key_and_no_signature() {
        let note = checkpoint().sign(&signer());
        assert!(matches!(
            Checkpoint::verify(&note, &jwks(), Some("other/log")),
            Err(CheckpointError::WrongOrigin { .. })
        ));
        let other = Jwks {
            keys: vec![Signer::from_seed([4; 32]).jwk()],
        };
        assert!(matches!(
            Checkpoint::verify(&note, &other, None),
            Err(CheckpointError::UnknownKey { .. })
        ));
        let unsigned = checkpoint().body();
        assert!(Checkpoint::verify(&unsigned, &jwks(), None).is_err());
    }

    #[test]
    fn verifier_key_matches_the_note_key_id() {
        let vkey = verifier_key("countersign/test-log", &signer().jwk()).unwrap();
        let parts: Vec<&str> = vkey.split('+').collect();
        assert_eq!(parts[0], "countersign/test-log");
        let note = checkpoint().sign(&signer());
        let sig_line = note.lines().last().unwrap();
        let blob = STANDARD
            .decode(sig_line.rsplit(' ').next().unwrap())
            .unwrap();
        assert_eq!(hex::encode(&blob[..4]), parts[1]);
    }
}

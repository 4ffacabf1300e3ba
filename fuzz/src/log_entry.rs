//! Log entries: `LogEntry` parsing and its canonical re-encoding (the Merkle leaf),
//! payload openings, and the streaming log verifier.
//!
//! Invariants: an entry that parses re-encodes to non-empty bytes that parse to an
//! entry that re-encodes to the same bytes (canonical form is a fixpoint, so every
//! entry countersign writes is accepted by the bundle and log verifiers); entries in
//! canonical form re-encode to themselves; the re-encoding is RFC 8785 of the JSON
//! value (and, where the independent writer can say, the same as it); the log verifier
//! flags an entry exactly when it is not canonical; openings never panic.

use countersign_core::event::{LogEntry, PayloadOpening};
use countersign_core::logcheck::LogVerifier;
use serde_json::Value;

use crate::fixtures::{ORIGIN, jwks};

pub fn run(data: &[u8]) {
    if let Ok(opening) = serde_json::from_slice::<PayloadOpening>(data) {
        if let Some(commitment) = opening.commitment() {
            assert!(commitment.starts_with("sha256:") && commitment.len() == 71);
            assert_eq!(opening.salt.len(), 64);
        }
    }

    let parsed = serde_json::from_slice::<LogEntry>(data);
    let mut verifier = LogVerifier::new(&[], jwks(), ORIGIN);
    verifier.push(data);
    let report = verifier.finish();
    assert_eq!(report.entries, 1);

    let Ok(entry) = parsed else {
        assert!(!report.valid(), "an unparseable entry passed the log verifier");
        return;
    };
    check_entry(&entry);
    let canonical = entry.to_bytes();
    assert_eq!(
        report.valid(),
        canonical == data,
        "the log verifier disagrees with the canonical form: {:?}",
        report.problems
    );
}

/// Checks an entry's canonical form (also used for entries the core creates).
pub fn check_entry(entry: &LogEntry) {
    let bytes = entry.to_bytes();
    assert!(!bytes.is_empty(), "an entry did not canonicalize: {entry:?}");
    let again: LogEntry = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "the canonical form does not parse back ({e}): {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    assert_eq!(
        String::from_utf8_lossy(&again.to_bytes()),
        String::from_utf8_lossy(&bytes),
        "the canonical form is not a fixpoint"
    );

    let value: Value = serde_json::from_slice(&bytes).unwrap();
    let recanonical = serde_json_canonicalizer::to_vec(&value).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&recanonical),
        String::from_utf8_lossy(&bytes),
        "the entry's bytes are not RFC 8785 of its own JSON"
    );
    if let Some(independent) = crate::jcs::to_vec(&value) {
        assert_eq!(
            String::from_utf8_lossy(&independent),
            String::from_utf8_lossy(&bytes),
            "the entry's bytes differ from an independent RFC 8785 writer"
        );
    }
}

//! The action digest: `Action` parsing, its RFC 8785 canonical JSON and digest, and
//! `ActionDigest::parse`.
//!
//! Input: a mode byte, then either JSON for an `Action` (mode even) or raw bytes that
//! `arbitrary` turns into an action's strings (mode odd, to reach names and values JSON
//! mutation finds slowly, e.g. characters beyond U+FFFF next to U+E000..U+FFFF).
//!
//! Invariants: the canonical JSON is never empty (its fallback "can never be reached"),
//! equals an independent JCS writer's output (`crate::jcs`), parses back to the same
//! action, and is a fixpoint; the digest is `sha256:` + 64 lowercase hex of it; a
//! parsed digest string is normal and parses to itself.

use std::collections::BTreeMap;

use arbitrary::{Arbitrary, Unstructured};
use countersign_core::{Action, ActionDigest};
use sha2::{Digest, Sha256};

pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if let Ok(text) = std::str::from_utf8(rest) {
        check_digest_string(text);
    }
    let action = if mode % 2 == 0 {
        match serde_json::from_slice::<Action>(rest) {
            Ok(action) => action,
            Err(_) => return,
        }
    } else {
        let mut u = Unstructured::new(rest);
        let Ok(description) = String::arbitrary(&mut u) else {
            return;
        };
        let Ok(details) = BTreeMap::<String, String>::arbitrary(&mut u) else {
            return;
        };
        Action::new(description, details)
    };
    check_action(&action);
}

pub fn check_action(action: &Action) {
    let canonical = action.canonical_json();
    assert!(!canonical.is_empty(), "an action did not canonicalize");

    let value = serde_json::to_value(action).unwrap();
    let independent = crate::jcs::to_vec(&value).expect("an action has no numbers");
    assert_eq!(
        String::from_utf8_lossy(&canonical),
        String::from_utf8_lossy(&independent),
        "canonical JSON differs from an independent RFC 8785 writer"
    );

    let reparsed: Action = serde_json::from_slice(&canonical)
        .unwrap_or_else(|e| panic!("canonical JSON does not parse back: {e}"));
    assert_eq!(&reparsed, action, "canonical JSON parses to another action");
    assert_eq!(reparsed.canonical_json(), canonical, "not a fixpoint");

    let digest = action.digest();
    let expected = format!("sha256:{}", hex::encode(Sha256::digest(&canonical)));
    assert_eq!(digest.as_str(), expected);
    assert_eq!(ActionDigest::parse(digest.as_str()), Some(digest.clone()));
    // The digest as JSON is its string.
    assert_eq!(
        serde_json::to_value(&digest).unwrap(),
        serde_json::Value::String(expected)
    );
}

fn check_digest_string(text: &str) {
    if let Some(digest) = ActionDigest::parse(text) {
        let s = digest.as_str();
        assert_eq!(s.len(), 7 + 64, "{s:?}");
        assert!(s.starts_with("sha256:"));
        assert!(
            s[7..]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "{s:?} is not lowercase hex"
        );
        assert!(text.eq_ignore_ascii_case(s), "{text:?} parsed to {s:?}");
        assert_eq!(ActionDigest::parse(s).as_ref(), Some(&digest));
    }
}

//! The evidence-bundle verifier on arbitrary bytes (a ZIP or not), with the bundle's own
//! keys and with pinned keys.
//!
//! Invariants: no panic; `valid` exactly when there are no reasons; a valid bundle has
//! a subject, an origin, a tree size and at least one event.

use countersign_core::bundle::{self, BundleReport};

use crate::fixtures::signer_jwks;

pub fn run(data: &[u8]) {
    check(&bundle::verify(data, None));
    check(&bundle::verify(data, Some(&signer_jwks())));
}

pub fn check(report: &BundleReport) {
    assert_eq!(report.valid, report.reasons.is_empty(), "{report:?}");
    if report.valid {
        assert!(report.subject.is_some(), "{report:?}");
        assert!(report.log_origin.is_some(), "{report:?}");
        assert!(report.tree_size.is_some(), "{report:?}");
        assert!(!report.events.is_empty(), "{report:?}");
    }
}

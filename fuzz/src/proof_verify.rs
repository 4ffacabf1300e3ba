//! Proof verification: `Envelope` parsing and `proof::verify` against a fixed JWKS.
//!
//! Input: a flags byte, then bytes whose meaning the low bit picks:
//! - 0: the JSON of a DSSE envelope, as a client would send it;
//! - 1: a statement's bytes, which the harness signs with the trusted key, so the
//!   fuzzer gets past the signature and explores the statement checks.
//!
//! Invariants: `valid` exactly when there are no reasons; a valid report names the key
//! and has the statement; an envelope written back as JSON parses to itself; with a
//! real signature no signature problem is reported; and validity of a signed payload is
//! exactly what the statement says (type, digest, approved, unexpired, for the action).

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use countersign_core::proof::{self, PAYLOAD_TYPE, STATEMENT_TYPE};
use countersign_core::{Envelope, ProblemCode, Statement, Timestamp, Verdict, VerifyOptions};

use crate::fixtures::{jwks, signer, t0};

pub fn run(data: &[u8]) {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    // Bits 1-3 pick the verifier's clock: unset, or hours around t0.
    let now = match (flags >> 1) & 7 {
        0 => None,
        n => Timestamp::from_millis(t0().millis() + (i64::from(n) - 4) * 3_600_000),
    };
    if flags & 1 == 0 {
        let Ok(envelope) = serde_json::from_slice::<Envelope>(rest) else {
            return;
        };
        let json = serde_json::to_vec(&envelope).unwrap();
        assert_eq!(
            serde_json::from_slice::<Envelope>(&json).unwrap(),
            envelope,
            "an envelope does not round-trip"
        );
        let _ = envelope.unverified_statement();
        let report = check(&envelope, now, flags);
        let _ = report;
    } else {
        let mut envelope = Envelope::sign(PAYLOAD_TYPE, rest, &signer());
        if flags & 0x10 != 0 {
            // DSSE's keyid is a hint: without one, every published key is tried.
            envelope.signatures[0].keyid.clear();
        }
        let report = check(&envelope, now, flags);
        for reason in &report.reasons {
            assert!(
                !matches!(
                    reason.code,
                    ProblemCode::BadSignature
                        | ProblemCode::UnknownKey
                        | ProblemCode::MalformedEnvelope
                        | ProblemCode::WrongPayloadType
                ),
                "a real signature was refused: {reason:?}"
            );
        }
        let expected = serde_json::from_slice::<Statement>(rest).ok().map(|s| {
            s.statement_type == STATEMENT_TYPE
                && s.action.digest() == s.action_digest
                && s.decision == Verdict::Approved
                && now.is_none_or(|now| now < s.valid_until)
        });
        match expected {
            None => assert!(!report.valid && report.statement.is_none()),
            Some(valid) => assert_eq!(
                report.valid, valid,
                "validity disagrees with the statement: {:?}",
                report.reasons
            ),
        }
        if report.valid {
            assert_eq!(report.keyid.as_deref(), Some(signer().kid()));
        }
    }
}

fn check(envelope: &Envelope, now: Option<Timestamp>, flags: u8) -> countersign_core::VerifyReport {
    let report = proof::verify(
        envelope,
        jwks(),
        &VerifyOptions {
            now,
            expected_action: None,
            used: None,
        },
    );
    assert_eq!(report.valid, report.reasons.is_empty(), "{report:?}");
    if report.valid {
        assert!(report.keyid.is_some() && report.statement.is_some());
        // The signature covers the payload exactly.
        let body = STANDARD.decode(&envelope.payload).unwrap();
        assert_eq!(
            serde_json::from_slice::<Statement>(&body).ok(),
            report.statement
        );
    }
    // Against the statement's own action, nothing new is wrong; against another,
    // the mismatch is reported.
    if let Some(statement) = &report.statement {
        let same = proof::verify(
            envelope,
            jwks(),
            &VerifyOptions {
                now,
                expected_action: Some(&statement.action),
                used: None,
            },
        );
        let digest_ok = statement.action.digest() == statement.action_digest;
        assert_eq!(
            same.reasons.iter().any(|r| r.code == ProblemCode::ActionMismatch),
            !digest_ok,
            "{:?}",
            same.reasons
        );
        if flags & 0x20 != 0 {
            let mut other = statement.action.clone();
            other.description.push('!');
            let different = proof::verify(
                envelope,
                jwks(),
                &VerifyOptions {
                    now,
                    expected_action: Some(&other),
                    used: Some((t0(), "tool".into())),
                },
            );
            assert!(!different.valid);
            assert!(
                different
                    .reasons
                    .iter()
                    .any(|r| r.code == ProblemCode::AlreadyUsed)
            );
        }
    }
    report
}

//! Checkpoints: `Checkpoint::parse` and `Checkpoint::verify` on arbitrary notes, and
//! sign-then-verify on arbitrary checkpoints.
//!
//! Input: a mode byte, then
//! - even: the note's bytes (UTF-8, or nothing is checked);
//! - odd: `arbitrary` bytes for an origin, a size, a root and extra signature lines.
//!
//! Invariants: a parsed note's signed text is exactly the note's text (so no two notes
//! share a signature: the parser is not malleable); what `verify` accepts, `parse`
//! reads the same; and a checkpoint that countersign signs under an origin its config
//! accepts (non-empty, no whitespace, no '+') verifies, also with other parties'
//! cosignature lines (C2SP signed notes), and not under another key or origin.

use arbitrary::{Arbitrary, Unstructured};
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use countersign_core::checkpoint::{Checkpoint, CheckpointError};
use countersign_core::{Jwks, merkle::Hash};

use crate::fixtures::{jwks, other_signer, signer};

pub fn run(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode % 2 == 0 {
        if let Ok(note) = std::str::from_utf8(rest) {
            check_note(note);
        }
    } else {
        sign_and_verify(rest);
    }
}

pub fn check_note(note: &str) {
    let parsed = Checkpoint::parse(note);
    if let Ok((checkpoint, signatures)) = &parsed {
        let signed = format!("{}\n", checkpoint.body());
        assert!(
            note.starts_with(&signed),
            "the signed text {:?} is not the note's text {note:?}",
            checkpoint.body()
        );
        assert!(!signatures.is_empty());
        assert!(signatures.iter().all(|(_, blob)| blob.len() >= 5));
    }
    for origin in [None, Some("countersign/fuzz")] {
        if let Ok(verified) = Checkpoint::verify(note, jwks(), origin) {
            let (checkpoint, _) = parsed.clone().expect("verify accepted what parse refused");
            assert_eq!(verified, checkpoint);
            if let Some(origin) = origin {
                assert_eq!(verified.origin, origin);
            }
        }
    }
}

#[derive(Debug, Arbitrary)]
struct Signed {
    origin: String,
    size: u64,
    root: Hash,
    cosigners: Vec<(String, Vec<u8>)>,
    cosign_first: bool,
}

fn sign_and_verify(data: &[u8]) {
    let Ok(input) = Signed::arbitrary(&mut Unstructured::new(data)) else {
        return;
    };
    let checkpoint = Checkpoint {
        origin: input.origin.clone(),
        size: input.size,
        root: input.root,
    };
    let note = checkpoint.sign(&signer());
    check_note(&note);
    let configurable = !input.origin.is_empty()
        && !input
            .origin
            .chars()
            .any(|c| c.is_whitespace() || c == '+' || c.is_control());
    let verified = Checkpoint::verify(&note, jwks(), Some(&input.origin));
    if configurable {
        assert_eq!(
            verified.as_ref(),
            Ok(&checkpoint),
            "countersign's own checkpoint does not verify: {note:?}"
        );
        // Not under another key alone, nor for another log.
        let others = Jwks {
            keys: vec![other_signer().jwk()],
        };
        assert!(matches!(
            Checkpoint::verify(&note, &others, None),
            Err(CheckpointError::UnknownKey { .. })
        ));
        assert!(matches!(
            Checkpoint::verify(&note, jwks(), Some(&format!("{}x", input.origin))),
            Err(CheckpointError::WrongOrigin { .. })
        ));

        // Cosignatures by other keys (well-formed lines) do not change the outcome.
        let lines: Vec<String> = input
            .cosigners
            .iter()
            .take(4)
            .filter(|(name, blob)| {
                !name.is_empty()
                    && !name.chars().any(|c| c.is_whitespace() || c.is_control())
                    && blob.len() >= 5
            })
            .map(|(name, blob)| format!("\u{2014} {name} {}\n", STANDARD.encode(blob)))
            .collect();
        if !lines.is_empty() {
            let (body, own) = note.split_once("\n\n").unwrap();
            let extra = lines.concat();
            let cosigned = if input.cosign_first {
                format!("{body}\n\n{extra}{own}")
            } else {
                format!("{body}\n\n{own}{extra}")
            };
            check_note(&cosigned);
            // A cosigner line under our origin with a key id that is not ours is
            // skipped; one whose first four bytes happen to be our key id is a bad
            // signature by our key, which is also a refusal, so only require success
            // when no line claims our key name.
            let claims_ours = input
                .cosigners
                .iter()
                .take(4)
                .any(|(name, _)| *name == input.origin);
            if !claims_ours || !input.cosign_first {
                assert_eq!(
                    Checkpoint::verify(&cosigned, jwks(), Some(&input.origin)).as_ref(),
                    Ok(&checkpoint),
                    "a cosignature made the checkpoint fail: {cosigned:?}"
                );
            }
        }
    }
}

//! Proofs: a DSSE v1 envelope (secure-systems-lab) whose payload is a decision statement,
//! signed with Ed25519 over the DSSE pre-authentication encoding, and their verification.
//!
//! ```text
//! {"payloadType": "application/vnd.countersign.decision+json",
//!  "payload": base64(statement JSON bytes),
//!  "signatures": [{"keyid": kid, "sig": base64(Ed25519(PAE(payloadType, payload)))}]}
//! PAE(type, body) = "DSSEv1" SP len(type) SP type SP len(body) SP body
//! ```
//! base64 is RFC 4648 standard with padding; lengths are ASCII decimal byte counts.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use ed25519_dalek::Signature;
use serde::{Deserialize, Serialize};

use crate::action::{Action, ActionDigest};
use crate::decision::{Decision, Verdict};
use crate::keys::{Jwks, Signer};
use crate::principal::{Approver, Requester};
use crate::quorum::Quorum;
use crate::request::ApprovalRequest;
use crate::time::Timestamp;

pub const PAYLOAD_TYPE: &str = "application/vnd.countersign.decision+json";
pub const STATEMENT_TYPE: &str = "countersign.decision/v1";

/// How a decision was authorized. Only a person's decision is `human`; a policy or a
/// fallback says so, so no one can mistake it for a human approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuthorizationType {
    Human,
    Policy,
    Fallback,
    /// A standing grant a person gave earlier (`grant`: its id and maker).
    Grant,
}

/// The rule behind a decision no person made: the policy's id and the digest of the whole
/// policy set it belonged to (docs/policies.md), so the decision traces to its exact text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyRef {
    pub id: String,
    /// `sha256:<hex>`: the policy set, as logged in `policy_set_loaded`.
    pub policy_set: String,
}

/// The signed statement: everything a verifier needs to know about one decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Statement {
    #[serde(rename = "type")]
    pub statement_type: String,
    pub request_id: String,
    pub decision: Verdict,
    pub authorization_type: AuthorizationType,
    pub action: Action,
    pub action_digest: ActionDigest,
    pub requested_by: Requester,
    pub approvers: Vec<Approver>,
    pub comment: Option<String>,
    pub fields: BTreeMap<String, String>,
    pub requested_at: Timestamp,
    pub decided_at: Timestamp,
    pub valid_until: Timestamp,
    pub nonce: String,
    /// For `policy` and `fallback` decisions: the policy that made it. Absent for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyRef>,
    /// For a request that needed more than one approval, or approvers from a group: how
    /// many and from which. Absent otherwise, so a one-approver statement is unchanged.
    /// Each approver then names the account it counted as.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quorum: Option<Quorum>,
    /// For `grant` decisions: the standing grant and the person who gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<crate::grant::GrantRef>,
}

impl Statement {
    pub fn for_decision(request: &ApprovalRequest, decision: &Decision) -> Self {
        Self {
            statement_type: STATEMENT_TYPE.to_string(),
            request_id: request.id.clone(),
            decision: decision.decision,
            authorization_type: decision.authorization_type,
            action: request.action.clone(),
            action_digest: request.action_digest.clone(),
            requested_by: request.requested_by.clone(),
            approvers: decision.approvers.clone(),
            comment: decision.comment.clone(),
            fields: decision.fields.clone(),
            requested_at: request.requested_at,
            decided_at: decision.decided_at,
            valid_until: decision.valid_until,
            nonce: decision.nonce.clone(),
            policy: decision.policy.clone(),
            grant: decision.grant.clone(),
            // A rule's decision names no person, so no quorum of them either.
            quorum: request
                .quorum
                .clone()
                .filter(|_| decision.authorization_type == AuthorizationType::Human),
        }
    }
}

/// A DSSE v1 envelope.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    pub payload: String,
    pub signatures: Vec<EnvelopeSignature>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvelopeSignature {
    #[serde(default)]
    pub keyid: String,
    pub sig: String,
}

/// DSSE's pre-authentication encoding.
pub fn pae(payload_type: &str, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload_type.len() + body.len() + 32);
    out.extend_from_slice(b"DSSEv1 ");
    out.extend_from_slice(payload_type.len().to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(payload_type.as_bytes());
    out.push(b' ');
    out.extend_from_slice(body.len().to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(body);
    out
}

impl Envelope {
    pub fn sign_statement(statement: &Statement, signer: &Signer) -> Self {
        // A statement of strings, maps and enums always serializes.
        let body = serde_json::to_vec(statement).unwrap_or_default();
        Self::sign(PAYLOAD_TYPE, &body, signer)
    }

    pub fn sign(payload_type: &str, body: &[u8], signer: &Signer) -> Self {
        let sig = signer.sign(&pae(payload_type, body));
        Self {
            payload_type: payload_type.to_string(),
            payload: STANDARD.encode(body),
            signatures: vec![EnvelopeSignature {
                keyid: signer.kid().to_string(),
                sig: STANDARD.encode(sig),
            }],
        }
    }

    /// The statement inside, read without checking the signature: for display only.
    pub fn unverified_statement(&self) -> Option<Statement> {
        let body = STANDARD.decode(&self.payload).ok()?;
        serde_json::from_slice(&body).ok()
    }
}

/// Why a proof did not verify. The code is stable; the message is for people.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProblemCode {
    MalformedEnvelope,
    WrongPayloadType,
    UnknownKey,
    BadSignature,
    MalformedStatement,
    DigestMismatch,
    NotApproved,
    Expired,
    AlreadyUsed,
    ActionMismatch,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    pub code: ProblemCode,
    pub message: String,
}

impl Problem {
    fn new(code: ProblemCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// What a verifier knows beyond the proof itself.
#[derive(Debug, Clone, Default)]
pub struct VerifyOptions<'a> {
    /// The time to judge validity at; `None` skips the expiry check.
    pub now: Option<Timestamp>,
    /// The action about to be performed; its digest must match the proof's.
    pub expected_action: Option<&'a Action>,
    /// When the approval was already used, and by what (known only to the server).
    pub used: Option<(Timestamp, String)>,
}

/// The outcome of verifying a proof: `valid`, every reason it is not, and the statement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VerifyReport {
    pub valid: bool,
    pub reasons: Vec<Problem>,
    /// The key that produced a valid signature.
    pub keyid: Option<String>,
    pub statement: Option<Statement>,
    /// Whether the proof was checked against the action about to run. When it was not,
    /// `valid` speaks for the signature, key and state only: see [`UNBOUND_WARNING`].
    #[serde(default)]
    pub bound: bool,
}

/// What a verification without the action does not say.
pub const UNBOUND_WARNING: &str = "the action was not checked: this proof approves the action it names, which may not be the one about to run; give the action (action_description and action_details) to bind the check to it, or redeem the proof (POST /api/v1/proofs/redeem, redeem_proof) to consume it for exactly that action";

impl VerifyReport {
    /// The warning to show beside `valid` when the action was not checked.
    pub fn warning(&self) -> Option<&'static str> {
        (!self.bound).then_some(UNBOUND_WARNING)
    }
}

/// Verifies `envelope` against the published keys. Checks, in order: the envelope's
/// shape and payload type, an Ed25519 signature by a key in `jwks`, the statement's
/// shape and internal digest, that it is an approval, that it is still valid, that it
/// was not used, and that it is for `expected_action`.
pub fn verify(envelope: &Envelope, jwks: &Jwks, options: &VerifyOptions<'_>) -> VerifyReport {
    let mut reasons = Vec::new();
    let bound = options.expected_action.is_some();
    let fail = |reasons: Vec<Problem>| VerifyReport {
        valid: false,
        reasons,
        keyid: None,
        statement: None,
        bound,
    };
    if envelope.payload_type != PAYLOAD_TYPE {
        return fail(vec![Problem::new(
            ProblemCode::WrongPayloadType,
            format!(
                "payloadType is {:?}, expected {PAYLOAD_TYPE:?}",
                envelope.payload_type
            ),
        )]);
    }
    let body = match STANDARD.decode(&envelope.payload) {
        Ok(body) => body,
        Err(e) => {
            return fail(vec![Problem::new(
                ProblemCode::MalformedEnvelope,
                format!("payload is not standard padded base64: {e}"),
            )]);
        }
    };
    let keyid = check_signatures(envelope, &body, jwks, &mut reasons);

    let statement: Statement = match serde_json::from_slice(&body) {
        Ok(s) => s,
        Err(e) => {
            reasons.push(Problem::new(
                ProblemCode::MalformedStatement,
                format!("payload is not a countersign decision statement: {e}"),
            ));
            return fail(reasons);
        }
    };
    if statement.statement_type != STATEMENT_TYPE {
        reasons.push(Problem::new(
            ProblemCode::MalformedStatement,
            format!(
                "statement type is {:?}, expected {STATEMENT_TYPE:?}",
                statement.statement_type
            ),
        ));
    }
    let recomputed = statement.action.digest();
    if recomputed != statement.action_digest {
        reasons.push(Problem::new(
            ProblemCode::DigestMismatch,
            format!(
                "the statement's action hashes to {recomputed}, but it claims {}",
                statement.action_digest
            ),
        ));
    }
    if statement.decision != Verdict::Approved {
        reasons.push(Problem::new(
            ProblemCode::NotApproved,
            format!(
                "request {} was {}, not approved",
                statement.request_id,
                statement.decision.as_str()
            ),
        ));
    }
    if let Some(now) = options.now
        && now >= statement.valid_until
    {
        reasons.push(Problem::new(
            ProblemCode::Expired,
            format!(
                "the approval was valid until {} and has expired (it is now {now})",
                statement.valid_until
            ),
        ));
    }
    if let Some((used_at, tool)) = &options.used {
        reasons.push(Problem::new(
            ProblemCode::AlreadyUsed,
            format!("the approval was already used at {used_at} ({tool}); it is single use"),
        ));
    }
    if let Some(expected) = options.expected_action {
        let expected_digest = expected.digest();
        if expected_digest != statement.action_digest {
            reasons.push(Problem::new(
                ProblemCode::ActionMismatch,
                format!(
                    "the proof approves {} but the given action is {expected_digest}",
                    statement.action_digest
                ),
            ));
        }
    }
    VerifyReport {
        valid: reasons.is_empty(),
        reasons,
        keyid,
        statement: Some(statement),
        bound,
    }
}

/// Returns the kid of the first valid signature; records why when there is none.
fn check_signatures(
    envelope: &Envelope,
    body: &[u8],
    jwks: &Jwks,
    reasons: &mut Vec<Problem>,
) -> Option<String> {
    if envelope.signatures.is_empty() {
        reasons.push(Problem::new(
            ProblemCode::MalformedEnvelope,
            "the envelope has no signatures",
        ));
        return None;
    }
    let message = pae(&envelope.payload_type, body);
    let mut known_key = false;
    for signature in &envelope.signatures {
        // DSSE's keyid is a hint; without one every published key is tried.
        let candidates: Vec<_> = if signature.keyid.is_empty() {
            jwks.keys.iter().collect()
        } else {
            jwks.find(&signature.keyid).into_iter().collect()
        };
        let keys: Vec<_> = candidates
            .into_iter()
            .filter_map(|jwk| jwk.verifying_key().ok().map(|key| (jwk, key)))
            .collect();
        known_key |= !keys.is_empty();
        let Some(sig) = STANDARD
            .decode(&signature.sig)
            .ok()
            .and_then(|bytes| Signature::from_slice(&bytes).ok())
        else {
            continue;
        };
        for (jwk, key) in keys {
            if key.verify_strict(&message, &sig).is_ok() {
                return Some(jwk.kid.clone());
            }
        }
    }
    if known_key {
        reasons.push(Problem::new(
            ProblemCode::BadSignature,
            "the signature does not match the payload: the proof was altered or not signed by this key",
        ));
    } else {
        let kids: Vec<_> = envelope
            .signatures
            .iter()
            .map(|s| s.keyid.as_str())
            .collect();
        reasons.push(Problem::new(
            ProblemCode::UnknownKey,
            format!(
                "no published key matches the signature's keyid {kids:?}; fetch the issuer's current JWKS"
            ),
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::*;

    fn jwks() -> Jwks {
        Jwks {
            keys: vec![signer().jwk()],
        }
    }

    fn approved_proof() -> (ApprovalRequest, Envelope) {
        let req = decide(&pending(), Verdict::Approved, t0()).request;
        let proof = req.proof.clone().unwrap();
        (req, proof)
    }

    fn codes(report: &VerifyReport) -> Vec<ProblemCode> {
        report.reasons.iter().map(|p| p.code).collect()
    }

    #[test]
    fn pae_matches_the_dsse_spec_example() {
        // From the DSSE v1 protocol document.
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world".to_vec()
        );
    }

    #[test]
    fn a_fresh_approval_verifies_for_its_action() {
        let (req, proof) = approved_proof();
        let report = verify(
            &proof,
            &jwks(),
            &VerifyOptions {
                now: Some(t0()),
                expected_action: Some(&req.action),
                used: None,
            },
        );
        assert!(report.valid, "{:?}", report.reasons);
        assert_eq!(report.keyid.as_deref(), Some(signer().kid()));
        let statement = report.statement.unwrap();
        assert_eq!(statement.statement_type, STATEMENT_TYPE);
        assert_eq!(statement.fields["po_number"], "PO-7");
        assert_eq!(statement.approvers[0].display_name, "alice");
    }

    #[test]
    fn every_flipped_payload_or_signature_byte_is_caught() {
        let (_, proof) = approved_proof();
        let body = STANDARD.decode(&proof.payload).unwrap();
        for i in 0..body.len() {
            let mut tampered = body.clone();
            tampered[i] ^= 0x01;
            let env = Envelope {
                payload: STANDARD.encode(&tampered),
                ..proof.clone()
            };
            assert!(
                !verify(&env, &jwks(), &VerifyOptions::default()).valid,
                "payload byte {i}"
            );
        }
        let sig = STANDARD.decode(&proof.signatures[0].sig).unwrap();
        for i in 0..sig.len() {
            let mut tampered = sig.clone();
            tampered[i] ^= 0x80;
            let mut env = proof.clone();
            env.signatures[0].sig = STANDARD.encode(&tampered);
            let report = verify(&env, &jwks(), &VerifyOptions::default());
            assert!(!report.valid, "signature byte {i}");
            assert!(codes(&report).contains(&ProblemCode::BadSignature));
        }
    }

    #[test]
    fn another_action_does_not_verify() {
        let (req, proof) = approved_proof();
        let mut other = req.action.clone();
        other.details.insert("amount".into(), "99999".into());
        let report = verify(
            &proof,
            &jwks(),
            &VerifyOptions {
                expected_action: Some(&other),
                ..VerifyOptions::default()
            },
        );
        assert_eq!(codes(&report), vec![ProblemCode::ActionMismatch]);
    }

    #[test]
    fn expired_used_and_rejected_are_reported_with_reasons() {
        let (_, proof) = approved_proof();
        let statement = proof.unverified_statement().unwrap();
        let report = verify(
            &proof,
            &jwks(),
            &VerifyOptions {
                now: Some(statement.valid_until),
                expected_action: None,
                used: Some((t0(), "pay".into())),
            },
        );
        assert_eq!(
            codes(&report),
            vec![ProblemCode::Expired, ProblemCode::AlreadyUsed]
        );

        let rejected = decide(&pending(), Verdict::Rejected, t0())
            .request
            .proof
            .unwrap();
        let report = verify(&rejected, &jwks(), &VerifyOptions::default());
        assert_eq!(codes(&report), vec![ProblemCode::NotApproved]);
    }

    #[test]
    fn unknown_keys_and_wrong_types_are_named() {
        let (_, proof) = approved_proof();
        let other_keys = Jwks {
            keys: vec![Signer::from_seed([9; 32]).jwk()],
        };
        let report = verify(&proof, &other_keys, &VerifyOptions::default());
        assert_eq!(codes(&report), vec![ProblemCode::UnknownKey]);

        let env = Envelope {
            payload_type: "application/json".into(),
            ..proof.clone()
        };
        assert_eq!(
            codes(&verify(&env, &jwks(), &VerifyOptions::default())),
            vec![ProblemCode::WrongPayloadType]
        );
        let env = Envelope {
            signatures: vec![],
            ..proof
        };
        assert_eq!(
            codes(&verify(&env, &jwks(), &VerifyOptions::default())),
            vec![ProblemCode::MalformedEnvelope]
        );
    }

    #[test]
    fn a_signed_statement_with_a_false_digest_is_caught() {
        let (req, _) = approved_proof();
        let mut statement = Statement::for_decision(&req, req.decision.as_ref().unwrap());
        statement.action_digest =
            ActionDigest::parse(&format!("sha256:{}", "0".repeat(64))).unwrap();
        let env = Envelope::sign_statement(&statement, &signer());
        assert_eq!(
            codes(&verify(&env, &jwks(), &VerifyOptions::default())),
            vec![ProblemCode::DigestMismatch]
        );
    }

    #[test]
    fn payload_is_standard_base64_with_padding() {
        let (_, proof) = approved_proof();
        assert!(proof.payload.len() % 4 == 0);
        assert!(!proof.payload.contains('-') && !proof.payload.contains('_'));
        let unpadded = Envelope {
            payload: proof.payload.trim_end_matches('=').to_string(),
            ..proof.clone()
        };
        if unpadded.payload != proof.payload {
            assert!(!verify(&unpadded, &jwks(), &VerifyOptions::default()).valid);
        }
    }
}

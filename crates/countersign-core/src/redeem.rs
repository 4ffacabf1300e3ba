//! Redemption: how the party that carries out an approved action (an executor service)
//! enforces single use and the action itself. Verifying a proof says it is genuine;
//! redeeming it also consumes the approval, for exactly the action about to run, once.
//! `record_action` (the requester saying it acts) and a redemption are the same one
//! use: whichever comes first wins the request's compare-and-swap, the other is refused.

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::action::Action;
use crate::error::{CoreError, NotUsable};
use crate::event::{Event, EventKind};
use crate::principal::Principal;
use crate::proof::{ProblemCode, Statement, VerifyReport};
use crate::request::{ApprovalRequest, Transition};
use crate::scope::Scope;
use crate::time::Timestamp;

/// A proof redeemed for its action: the approval's one use.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Redemption {
    /// The executor that redeemed it (a principal id).
    pub redeemed_by: String,
    pub redeemed_at: Timestamp,
}

/// The problems that make a proof no proof at all (not this server's signature, not a
/// statement), as opposed to a genuine proof that cannot be used (rejected, expired,
/// used, for another action), which the request's own state decides.
const NOT_GENUINE: [ProblemCode; 6] = [
    ProblemCode::MalformedEnvelope,
    ProblemCode::WrongPayloadType,
    ProblemCode::UnknownKey,
    ProblemCode::BadSignature,
    ProblemCode::MalformedStatement,
    ProblemCode::DigestMismatch,
];

/// The statement of a genuine proof (signed by a trusted key, well formed), or why the
/// proof is not one.
pub fn genuine_statement(report: VerifyReport) -> Result<Statement, CoreError> {
    let problems: Vec<String> = report
        .reasons
        .iter()
        .filter(|p| NOT_GENUINE.contains(&p.code))
        .map(|p| p.message.clone())
        .collect();
    match report.statement {
        Some(statement) if problems.is_empty() => Ok(statement),
        _ => Err(CoreError::NotUsable(NotUsable::InvalidProof {
            reasons: if problems.is_empty() {
                "the proof could not be read".into()
            } else {
                problems.join("; ")
            },
        })),
    }
}

impl ApprovalRequest {
    /// Consumes the approval the genuine proof `statement` carries, for `action`, by the
    /// executor `by`. Refused, with the reason, unless `by` may redeem, the proof is this
    /// request's decision, `action` is exactly the approved one, and the approval is
    /// still usable (approved, unused, before `valid_until`).
    pub fn redeem(
        &self,
        statement: &Statement,
        action: &Action,
        by: &Principal,
        now: Timestamp,
    ) -> Result<Transition, CoreError> {
        if !by.may(Scope::Redeem) {
            return Err(CoreError::Forbidden(format!(
                "{} may not redeem proofs: that needs an executor token (countersign token create --role executor)",
                by.id
            )));
        }
        let same_decision = statement.request_id == self.id
            && self
                .decision
                .as_ref()
                .is_some_and(|d| d.nonce == statement.nonce);
        if !same_decision {
            return Err(CoreError::NotUsable(NotUsable::InvalidProof {
                reasons: format!(
                    "the proof is not the decision recorded for request {}",
                    statement.request_id
                ),
            }));
        }
        let given = action.digest();
        if given != self.action_digest {
            return Err(CoreError::NotUsable(NotUsable::ActionMismatch {
                request_id: self.id.clone(),
                approved: self.action_digest.to_string(),
                given: given.to_string(),
            }));
        }
        self.check_usable(now).map_err(CoreError::NotUsable)?;
        let request = Self {
            version: self.version + 1,
            redemption: Some(Redemption {
                redeemed_by: by.id.clone(),
                redeemed_at: now,
            }),
            ..self.clone()
        };
        Ok(Transition {
            event: Event::about(
                EventKind::ProofRedeemed,
                &request,
                now,
                Some(by.id.clone()),
                json!({"action_digest": self.action_digest, "nonce": statement.nonce}),
                None,
            ),
            request,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::proof::{VerifyOptions, verify};
    use crate::testutil::*;
    use crate::{Envelope, Jwks, Limits, Role, Verdict};

    fn executor() -> Principal {
        Principal::from_token("payments", Role::Executor)
    }

    fn statement_of(request: &ApprovalRequest) -> Statement {
        request
            .proof
            .as_ref()
            .and_then(Envelope::unverified_statement)
            .unwrap()
    }

    #[test]
    fn redeems_once_for_exactly_the_approved_action() {
        let approved = decide(&pending(), Verdict::Approved, t0()).request;
        let statement = statement_of(&approved);
        let action = approved.action.clone();
        let t = approved
            .redeem(&statement, &action, &executor(), t0())
            .unwrap();
        assert_eq!(t.event.kind(), "proof_redeemed");
        assert_eq!(t.event.actor.as_deref(), Some("token:payments"));
        assert_eq!(t.event.data["nonce"], json!(statement.nonce));
        assert_eq!(t.request.version, approved.version + 1);
        let used = t.request;
        let again = used
            .redeem(&statement, &action, &executor(), t0())
            .unwrap_err();
        assert!(
            matches!(again, CoreError::NotUsable(NotUsable::AlreadyUsed { .. })),
            "{again}"
        );
        // Redeemed and recorded are one use, in either order.
        let limits = Limits::default();
        let err = used
            .record_action("pay".into(), BTreeMap::new(), &agent(), t0(), &limits)
            .unwrap_err();
        assert!(
            err.to_string().contains("redeemed by token:payments"),
            "{err}"
        );
        let recorded = approved
            .record_action("pay".into(), BTreeMap::new(), &agent(), t0(), &limits)
            .unwrap()
            .request;
        assert!(matches!(
            recorded.redeem(&statement, &action, &executor(), t0()),
            Err(CoreError::NotUsable(NotUsable::AlreadyUsed { .. }))
        ));
    }

    #[test]
    fn refuses_with_the_reason() {
        let approved = decide(&pending(), Verdict::Approved, t0()).request;
        let statement = statement_of(&approved);
        let mut other = approved.action.clone();
        other.details.insert("amount".into(), "99999".into());
        let err = approved
            .redeem(&statement, &other, &executor(), t0())
            .unwrap_err();
        assert!(
            matches!(err, CoreError::NotUsable(NotUsable::ActionMismatch { .. })),
            "{err}"
        );
        let late = t0().plus_seconds(approved.valid_for_seconds);
        let err = approved
            .redeem(&statement, &approved.action, &executor(), late)
            .unwrap_err();
        assert!(matches!(
            err,
            CoreError::NotUsable(NotUsable::ValidityExpired { .. })
        ));
        for who in [agent(), approver()] {
            assert!(matches!(
                approved.redeem(&statement, &approved.action, &who, t0()),
                Err(CoreError::Forbidden(_))
            ));
        }
        let rejected = decide(&pending(), Verdict::Rejected, t0()).request;
        let err = rejected
            .redeem(
                &statement_of(&rejected),
                &rejected.action,
                &executor(),
                t0(),
            )
            .unwrap_err();
        assert!(matches!(
            err,
            CoreError::NotUsable(NotUsable::NotApproved { .. })
        ));
        // Another decision's proof (another nonce) does not redeem this one.
        let mut foreign = statement.clone();
        foreign.nonce = "another".into();
        assert!(matches!(
            approved.redeem(&foreign, &approved.action, &executor(), t0()),
            Err(CoreError::NotUsable(NotUsable::InvalidProof { .. }))
        ));
    }

    #[test]
    fn only_genuine_proofs_have_a_statement() {
        let approved = decide(&pending(), Verdict::Approved, t0()).request;
        let proof = approved.proof.clone().unwrap();
        let options = VerifyOptions::default();
        let trusted = Jwks {
            keys: vec![signer().jwk()],
        };
        let report = verify(&proof, &trusted, &options);
        assert!(genuine_statement(report).is_ok());
        let unknown = verify(&proof, &Jwks { keys: Vec::new() }, &options);
        let err = genuine_statement(unknown).unwrap_err();
        assert!(
            matches!(err, CoreError::NotUsable(NotUsable::InvalidProof { .. })),
            "{err}"
        );
    }
}

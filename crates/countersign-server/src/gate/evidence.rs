//! What happens around a decision that is not the decision: verifying and redeeming
//! proofs, recording outcomes, reviews and autonomous decisions, exporting and verifying
//! evidence bundles, and rotating the signing key. Each record is a log event like the
//! rest.

use std::collections::BTreeMap;

use countersign_core::bundle::{BundleReport, Mode};
use countersign_core::evidence::{
    DecisionRecordInput, OutcomeStatus, ReviewVerdict, Reviewer, decision_record,
};
use countersign_core::proof::{self, Statement, VerifyOptions};
use countersign_core::redeem::genuine_statement;
use countersign_core::{
    Action, ApprovalRequest, Envelope, Event, EventKind, Principal, ProblemCode, Scope,
    VerifyReport,
};

use super::Gate;

/// A turn of the evidence-verification lane ([`Gate::evidence_turn`]).
pub struct EvidenceTurn {
    _permit: tokio::sync::OwnedSemaphorePermit,
}
use crate::error::GateError;
use crate::ids::{new_id, new_salt};

/// Who may record reviews, as the operator configured it (`[review]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewerSettings {
    /// The one principal whose reviews are accepted: `token:<name>` or `user:<username>`.
    pub principal: String,
    /// What every review shows as its reviewer (the older `reviewer_id` and
    /// `reviewer_name`); by default the reviewer principal itself.
    pub label: Option<Reviewer>,
}

/// A proof redeemed: the request, now used, and the verified statement.
#[derive(Debug, Clone)]
pub struct Redeemed {
    pub request: ApprovalRequest,
    pub statement: Statement,
}

impl Gate {
    /// Verifies a proof against the published keys; when it names a request this
    /// server knows, also reports whether its approval was already used (recorded or
    /// redeemed).
    pub async fn verify_proof(
        &self,
        envelope: &Envelope,
        action: Option<&Action>,
    ) -> Result<VerifyReport, GateError> {
        let statement = envelope.unverified_statement();
        let used = match &statement {
            Some(s) => self
                .store
                .get_request(&s.request_id)
                .await?
                .filter(|r| r.action_digest == s.action_digest)
                .and_then(|r| r.used()),
            None => None,
        };
        let options = VerifyOptions {
            now: Some(self.now()),
            expected_action: action,
            used,
        };
        let mut report = proof::verify(envelope, &self.jwks().await?, &options);
        if report
            .reasons
            .iter()
            .any(|r| r.code == ProblemCode::UnknownKey)
        {
            // Another process may have rotated the key since we loaded it.
            if self.keys.reload().is_ok() {
                report = proof::verify(envelope, &self.jwks().await?, &options);
            }
        }
        Ok(report)
    }

    /// Records what came of the approved action (once, by the requester, after
    /// `record_action`).
    pub async fn record_outcome(
        &self,
        who: &Principal,
        id: &str,
        status: OutcomeStatus,
        summary: Option<String>,
        details: BTreeMap<String, String>,
    ) -> Result<ApprovalRequest, GateError> {
        self.get(who, id).await?;
        self.transition(id, |request, now| {
            Ok(request.record_outcome(
                status,
                summary.clone(),
                details.clone(),
                who,
                now,
                self.limits(),
            )?)
        })
        .await
    }

    /// Consumes the approval `envelope` proves, for exactly `action`, as the executor
    /// `who`: once, and only while the approval is usable. A second redemption, another
    /// action, a proof that is not genuine, rejected, expired or already used (by
    /// `record_action` too) is refused with the reason.
    pub async fn redeem_proof(
        &self,
        who: &Principal,
        envelope: &Envelope,
        action: &Action,
    ) -> Result<Redeemed, GateError> {
        if !who.may(Scope::Redeem) {
            return Err(GateError::Forbidden(format!(
                "{} may not redeem proofs: that needs an executor token",
                who.id
            )));
        }
        // The signature, key and shape only: the request's state says the rest.
        let report = self.verify_proof(envelope, None).await?;
        let statement = genuine_statement(report)?;
        let id = statement.request_id.clone();
        if self.store.get_request(&id).await?.is_none() {
            return Err(GateError::NotFound(format!(
                "request {id}: the proof is signed by this server's key but names a request it does not have, so it cannot be redeemed here"
            )));
        }
        let request = self
            .transition(&id, |request, now| {
                Ok(request.redeem(&statement, action, who, now)?)
            })
            .await?;
        Ok(Redeemed { request, statement })
    }

    /// Whether `who` is the reviewer the operator named.
    pub fn is_reviewer(&self, who: &Principal) -> bool {
        self.settings
            .reviewer
            .as_ref()
            .is_some_and(|r| r.principal == who.id && who.may(Scope::Evidence))
    }

    /// Records a review by the operator-configured reviewer, once per request; refused
    /// to everyone else. Off unless configured. The reviewer may review any request.
    pub async fn record_review(
        &self,
        who: &Principal,
        id: &str,
        verdict: ReviewVerdict,
        notes: Option<String>,
    ) -> Result<ApprovalRequest, GateError> {
        let settings = self.settings.reviewer.as_ref().ok_or_else(|| {
            GateError::Forbidden(
                "record_review is off on this server (an operator turns it on by naming the reviewer: [review] reviewer in the config)".into(),
            )
        })?;
        if !self.is_reviewer(who) {
            return Err(GateError::Forbidden(format!(
                "only the reviewer the operator named in [review] reviewer may record reviews, and {} is not that reviewer",
                who.id
            )));
        }
        let reviewer = settings.label.clone().unwrap_or_else(|| Reviewer {
            id: who.id.clone(),
            display_name: who.display_name.clone(),
        });
        self.load(id).await?;
        self.transition(id, |request, now| {
            Ok(
                request.record_review(
                    &reviewer,
                    verdict,
                    notes.clone(),
                    who,
                    now,
                    self.limits(),
                )?,
            )
        })
        .await
    }

    /// Records a decision an agent or system made on its own, under a new subject id;
    /// returns the id and the entry's log index.
    pub async fn record_decision(
        &self,
        who: &Principal,
        input: DecisionRecordInput,
    ) -> Result<(String, u64), GateError> {
        let now = self.now();
        if let Some(related) = &input.related_request {
            self.get(who, related).await?;
        }
        let id = new_id("dec", now)?;
        let event = decision_record(&id, input, who, now, self.limits())?;
        let seq = self.store.append_event(&event.seal(new_salt()?)).await?;
        self.feed.poke();
        // Sequence numbers start at 1; the log's index is one less.
        Ok((id, seq.saturating_sub(1)))
    }

    /// An evidence bundle for a request (`req_...`) or a recorded decision (`dec_...`).
    pub async fn evidence(
        &self,
        who: &Principal,
        subject: &str,
        mode: Mode,
    ) -> Result<Vec<u8>, GateError> {
        if mode == Mode::Full && !self.settings.raw_payload_export {
            return Err(GateError::Forbidden(
                "raw payload export is off on this server: export a redacted bundle, or an operator sets [evidence] raw_payload_export = true".into(),
            ));
        }
        let decisions = if subject.starts_with("dec_") {
            let events = self.store.events_of_subject(subject).await?;
            let first = events
                .first()
                .ok_or_else(|| GateError::NotFound(subject.to_string()))?;
            if !who.role.may_decide() && first.entry.actor.as_deref() != Some(who.id.as_str()) {
                return Err(GateError::NotFound(subject.to_string()));
            }
            Vec::new()
        } else {
            self.get(who, subject).await?.proof.into_iter().collect()
        };
        self.log.bundle(subject, mode, decisions).await
    }

    /// Starts signing with a new key (the old one stays published) and logs it, with the
    /// old key's endorsement of the new one.
    pub async fn rotate_key(&self, actor: &Principal) -> Result<(String, String), GateError> {
        let before = self.keys.signer();
        let (old, new) = self
            .keys
            .rotate(self.now())
            .map_err(|e| GateError::internal("could not rotate the signing key", e))?;
        crate::keyring::publish(&*self.store, &self.keys).await?;
        let event = Event::system(
            EventKind::KeyRotated,
            self.now(),
            Some(actor.id.clone()),
            serde_json::json!({"old_kid": old, "new_kid": new}),
        );
        self.store.append_event(&event.seal(new_salt()?)).await?;
        let endorsement =
            countersign_core::anchor::Endorsement::sign(&self.keys.signer().jwk(), &before)
                .event(self.now(), Some(actor.id.clone()));
        self.store
            .append_event(&endorsement.seal(new_salt()?))
            .await?;
        self.feed.poke();
        Ok((old, new))
    }

    /// A turn to verify a bundle, to take before reading an upload: an upload past the
    /// lane's turns and queue is refused (`unavailable`, "busy") before its bytes are
    /// read, so a flood of uploads costs neither memory nor the async workers' time.
    pub async fn evidence_turn(&self) -> Result<EvidenceTurn, GateError> {
        Ok(EvidenceTurn {
            _permit: self.admission.verify.enter().await?,
        })
    }

    /// Verifies an uploaded bundle against this server's published keys, reading no
    /// more of it than a real bundle of its size holds (`ReadLimits::upload`), on a
    /// blocking thread, a few at a time: beyond that the caller is told the server is
    /// busy (`unavailable`).
    pub async fn verify_evidence(&self, zip: Vec<u8>) -> Result<BundleReport, GateError> {
        let turn = self.evidence_turn().await?;
        self.verify_evidence_in(turn, zip).await
    }

    /// [`Gate::verify_evidence`] in a turn already taken.
    pub async fn verify_evidence_in(
        &self,
        turn: EvidenceTurn,
        zip: Vec<u8>,
    ) -> Result<BundleReport, GateError> {
        let jwks = self.jwks().await?;
        let report = tokio::task::spawn_blocking(move || {
            let limits = countersign_core::bundle::ReadLimits::upload(zip.len());
            countersign_core::bundle::verify_within(&zip, Some(&jwks), &limits)
        })
        .await
        .map_err(|e| GateError::internal("verifying the bundle", e));
        drop(turn);
        report
    }
}

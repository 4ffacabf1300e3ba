//! Deciding a request: who may, what the decision records, and the signed proof it yields.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::CoreError;
use crate::event::Event;
use crate::grant::GrantRef;
use crate::keys::Signer;
use crate::principal::{Approver, Channel, Principal};
use crate::proof::{AuthorizationType, Envelope, PolicyRef, Statement};
use crate::quorum::{DecisionAccounts, Vote};
use crate::request::{ApprovalRequest, Limits, Status, Transition, validate_map};
use crate::time::Timestamp;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Approved,
    Rejected,
}

impl Verdict {
    pub fn as_str(&self) -> &'static str {
        match self {
            Verdict::Approved => "approved",
            Verdict::Rejected => "rejected",
        }
    }

    pub fn status(&self) -> Status {
        match self {
            Verdict::Approved => Status::Approved,
            Verdict::Rejected => Status::Rejected,
        }
    }
}

impl std::str::FromStr for Verdict {
    type Err = CoreError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "approved" | "approve" => Ok(Verdict::Approved),
            "rejected" | "reject" => Ok(Verdict::Rejected),
            other => Err(CoreError::invalid(
                "decision",
                format!("{other:?} is not \"approved\" or \"rejected\""),
            )),
        }
    }
}

/// What the approver submits. Who they are comes from authentication, not from here.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DecisionInput {
    pub comment: Option<String>,
    /// Structured reply fields (e.g. a PO number), carried into the signed proof.
    pub fields: BTreeMap<String, String>,
}

/// A recorded decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub decision: Verdict,
    pub authorization_type: AuthorizationType,
    pub approvers: Vec<Approver>,
    pub comment: Option<String>,
    pub fields: BTreeMap<String, String>,
    pub decided_at: Timestamp,
    pub valid_until: Timestamp,
    pub nonce: String,
    /// The policy behind a `policy` or `fallback` decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<PolicyRef>,
    /// The standing grant behind a `grant` decision, and its maker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<GrantRef>,
}

/// Evidence that an approved action was carried out. Its presence consumes the approval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActionRecord {
    pub tool: String,
    pub details: BTreeMap<String, String>,
    pub recorded_by: String,
    pub recorded_at: Timestamp,
}

impl ApprovalRequest {
    /// A human decision on this request, signed. Returns the next state of the request,
    /// which carries the decision and its proof. `nonce` must be fresh randomness.
    ///
    /// The decider counts as its own account and in no group
    /// ([`DecisionAccounts::unmapped`]); [`decide_as`](Self::decide_as) takes the
    /// accounts the server mapped.
    #[allow(clippy::too_many_arguments)]
    pub fn decide(
        &self,
        verdict: Verdict,
        input: DecisionInput,
        by: &Principal,
        channel: Channel,
        now: Timestamp,
        nonce: String,
        signer: &Signer,
        limits: &Limits,
    ) -> Result<Transition, CoreError> {
        let accounts = DecisionAccounts::unmapped(self, by);
        self.decide_as(
            verdict, input, by, &accounts, channel, now, nonce, signer, limits,
        )
    }

    /// A human decision by `by`, who counts as `accounts.decider`. For a request without
    /// a quorum this is the final, signed decision. For one with a quorum, an approval
    /// short of it is recorded and the request stays pending (no proof yet, `nonce` and
    /// `signer` unused); the last approval and any rejection are final (quorum.rs).
    #[allow(clippy::too_many_arguments)]
    pub fn decide_as(
        &self,
        verdict: Verdict,
        input: DecisionInput,
        by: &Principal,
        accounts: &DecisionAccounts,
        channel: Channel,
        now: Timestamp,
        nonce: String,
        signer: &Signer,
        limits: &Limits,
    ) -> Result<Transition, CoreError> {
        if !by.role.may_decide() {
            return Err(CoreError::Forbidden(format!(
                "{} is an agent credential and may not decide requests",
                by.id
            )));
        }
        if let Some(err) = self.closed_error(now) {
            return Err(err);
        }
        // The requester never counts, whichever identity of its account decides.
        if by.id == self.requested_by.id || accounts.decider == accounts.requester {
            return Err(CoreError::SelfApproval {
                request_id: self.id.clone(),
                principal: if by.id == accounts.decider {
                    by.id.clone()
                } else {
                    format!("{} (account {})", by.id, accounts.decider)
                },
            });
        }
        let comment = match input.comment.map(|c| c.trim().to_string()) {
            Some(c) if c.len() > limits.max_comment_bytes => {
                return Err(CoreError::invalid(
                    "comment",
                    format!("longer than {} bytes", limits.max_comment_bytes),
                ));
            }
            Some(c) if c.is_empty() => None,
            other => other,
        };
        validate_map("fields", &input.fields, limits.max_fields, limits)?;
        if let Some(quorum) = &self.quorum {
            let vote = Vote {
                verdict,
                comment,
                fields: input.fields,
                approver: Approver {
                    account: Some(accounts.decider.clone()),
                    ..by.as_approver(channel)
                },
                eligible: accounts.eligible,
                at: now,
            };
            return self.vote(quorum, vote, nonce, signer, limits);
        }
        if verdict == Verdict::Approved {
            self.check_fields(&input.fields)?;
        }
        let decision = self.by_people(
            verdict,
            vec![by.as_approver(channel)],
            comment,
            input.fields,
            now,
            nonce,
        );
        Ok(self.signed(decision, signer))
    }

    /// A decision people made at `at` (`approvers` in the order they decided), valid for
    /// the request's `valid_for_seconds` from then.
    pub(crate) fn by_people(
        &self,
        verdict: Verdict,
        approvers: Vec<Approver>,
        comment: Option<String>,
        fields: BTreeMap<String, String>,
        at: Timestamp,
        nonce: String,
    ) -> Decision {
        Decision {
            decision: verdict,
            authorization_type: AuthorizationType::Human,
            approvers,
            comment,
            fields,
            decided_at: at,
            valid_until: at.plus_seconds(self.valid_for_seconds),
            nonce,
            policy: None,
            grant: None,
        }
    }

    /// A decision no person made at `now` (a rule's or a grant's): no approver, comment
    /// or fields; valid for the request's `valid_for_seconds`. The caller names the policy
    /// or the grant behind it.
    pub(crate) fn by_no_person(
        &self,
        verdict: Verdict,
        kind: AuthorizationType,
        now: Timestamp,
        nonce: String,
    ) -> Decision {
        Decision {
            decision: verdict,
            authorization_type: kind,
            approvers: Vec::new(),
            comment: None,
            fields: BTreeMap::new(),
            decided_at: now,
            valid_until: now.plus_seconds(self.valid_for_seconds),
            nonce,
            policy: None,
            grant: None,
        }
    }

    /// Refuses an approval whose reply fields leave out one the request asks for.
    pub(crate) fn check_fields(&self, fields: &BTreeMap<String, String>) -> Result<(), CoreError> {
        let missing: Vec<&str> = self
            .requested_fields
            .iter()
            .filter(|f| fields.get(*f).is_none_or(|v| v.trim().is_empty()))
            .map(String::as_str)
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(CoreError::invalid(
            "fields",
            format!(
                "the request asks for {} to approve it; fill in {}",
                self.requested_fields.join(", "),
                missing.join(", ")
            ),
        ))
    }

    /// A decision made by a rule, signed: `kind` is `Policy` (a policy decided at once)
    /// or `Fallback` (what a policy says a timeout becomes). No person is named; the
    /// statement names the policy. A pending request only (a fallback is taken when the
    /// request is past its expiry, so expiry does not close it here).
    pub fn decide_by_rule(
        &self,
        verdict: Verdict,
        kind: AuthorizationType,
        policy: PolicyRef,
        now: Timestamp,
        nonce: String,
        signer: &Signer,
    ) -> Result<Transition, CoreError> {
        if matches!(kind, AuthorizationType::Human | AuthorizationType::Grant) {
            return Err(CoreError::invalid(
                "authorization_type",
                "a rule's decision is policy or fallback, never human or grant",
            ));
        }
        if self.status != Status::Pending {
            return Err(self
                .closed_error(now)
                .unwrap_or_else(|| CoreError::invalid("status", "request is not pending")));
        }
        if verdict == Verdict::Approved && !self.requested_fields.is_empty() {
            return Err(CoreError::invalid(
                "fields",
                format!(
                    "the request asks for {} to approve it, which only a person can give",
                    self.requested_fields.join(", ")
                ),
            ));
        }
        let decision = Decision {
            policy: Some(policy),
            ..self.by_no_person(verdict, kind, now, nonce)
        };
        Ok(self.signed(decision, signer))
    }

    /// The next state of the request, carrying `decision` and its signed proof.
    pub(crate) fn signed(&self, decision: Decision, signer: &Signer) -> Transition {
        let statement = Statement::for_decision(self, &decision);
        let proof = Envelope::sign_statement(&statement, signer);
        let request = Self {
            version: self.version + 1,
            status: decision.decision.status(),
            decision: Some(decision.clone()),
            proof: Some(proof),
            ..self.clone()
        };
        Transition {
            event: Event::decided(&request, &decision),
            request,
        }
    }
}

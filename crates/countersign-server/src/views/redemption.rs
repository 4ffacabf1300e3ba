//! What `redeem_proof` takes and answers: the proof, the exact action, and the used
//! approval.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ApproverView, ProofView};

/// `redeem_proof`'s input: the proof and the exact action about to be performed.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RedeemProofInput {
    /// The DSSE envelope returned with the decision.
    pub proof: ProofView,
    /// The action you are about to perform, exactly: the proof must be for it.
    pub action_description: String,
    #[serde(default)]
    pub action_details: BTreeMap<String, String>,
}

impl RedeemProofInput {
    pub fn action(&self) -> countersign_core::Action {
        countersign_core::Action::new(self.action_description.clone(), self.action_details.clone())
    }
}

/// `redeem_proof`'s result: the approval is now used, by you, for this action.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RedeemOutput {
    /// Always true: a proof that cannot be redeemed is an error with the reason.
    pub redeemed: bool,
    pub request_id: String,
    pub action_digest: String,
    /// Who approved it, with their channel and authentication.
    pub approvers: Vec<ApproverView>,
    /// Structured reply fields from the approver (e.g. a PO number).
    pub fields: BTreeMap<String, String>,
    pub valid_until: String,
    /// The executor that redeemed it (you).
    pub redeemed_by: String,
    pub redeemed_at: String,
    pub message: String,
}

impl RedeemOutput {
    pub fn new(redeemed: &crate::gate::Redeemed) -> Self {
        let request = &redeemed.request;
        let by = request.redemption.as_ref();
        Self {
            redeemed: true,
            request_id: request.id.clone(),
            action_digest: request.action_digest.to_string(),
            approvers: redeemed
                .statement
                .approvers
                .iter()
                .map(ApproverView::of)
                .collect(),
            fields: redeemed.statement.fields.clone(),
            valid_until: redeemed.statement.valid_until.to_string(),
            redeemed_by: by.map(|r| r.redeemed_by.clone()).unwrap_or_default(),
            redeemed_at: by.map(|r| r.redeemed_at.to_string()).unwrap_or_default(),
            message: "Redeemed: the approval is now used, by you, for exactly this action. Perform it now, once; nobody can redeem it or record an action under it again.".into(),
        }
    }
}

//! The shapes of the evidence calls: record_outcome, record_decision, record_review and
//! an evidence bundle's verification.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::enum_str;

/// `record_outcome`'s input.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecordOutcomeInput {
    pub request_id: String,
    /// succeeded, failed or partial.
    pub status: String,
    /// One line on what happened.
    #[serde(default)]
    pub summary: Option<String>,
    #[serde(default)]
    pub details: BTreeMap<String, String>,
}

/// The model that made an autonomous decision.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelInput {
    #[serde(default)]
    pub provider: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub version: Option<String>,
}

/// `record_decision`'s input: a decision an agent or system made on its own.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecordDecisionInput {
    /// What was decided, in words.
    pub decision: String,
    #[serde(default)]
    pub rationale: Option<String>,
    #[serde(default)]
    pub model: Option<ModelInput>,
    /// The authority it acted under, e.g. {"policy": "refunds-under-50"}.
    #[serde(default)]
    pub authority: BTreeMap<String, String>,
    #[serde(default)]
    pub details: BTreeMap<String, String>,
    /// An approval request this decision relates to.
    #[serde(default)]
    pub related_request: Option<String>,
}

impl From<RecordDecisionInput> for countersign_core::evidence::DecisionRecordInput {
    fn from(input: RecordDecisionInput) -> Self {
        Self {
            decision: input.decision,
            rationale: input.rationale,
            model: input.model.map(|m| countersign_core::evidence::ModelInfo {
                provider: m.provider,
                name: m.name,
                version: m.version,
            }),
            authority: input.authority,
            details: input.details,
            related_request: input.related_request,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RecordDecisionOutput {
    /// The recorded decision's id (`dec_...`): pass it to get_evidence.
    pub record_id: String,
    /// Its position in the transparency log.
    pub log_index: u64,
    pub message: String,
}

/// `record_review`'s input. The reviewer is set by the operator, never here.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecordReviewInput {
    pub request_id: String,
    /// accepted or flagged.
    pub verdict: String,
    #[serde(default)]
    pub notes: Option<String>,
}

/// The result of verifying an evidence bundle.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct BundleReportView {
    /// Everything checks out under this server's trusted keys and the bundle is proven
    /// complete.
    pub valid: bool,
    /// The manifest is signed by a trusted key: the bundle holds every entry of its
    /// subject up to its tree size (never for a v1 bundle, which is unsigned).
    #[serde(default)]
    pub complete: bool,
    /// The key that signed the manifest.
    #[serde(default)]
    pub manifest_signed_by: Option<String>,
    /// Every problem found; empty when valid.
    pub reasons: Vec<String>,
    pub subject: Option<String>,
    /// redacted or full.
    pub mode: Option<String>,
    pub log_origin: Option<String>,
    pub tree_size: Option<u64>,
    /// The verified entries' types, in log order.
    pub events: Vec<String>,
    pub decisions: usize,
}

impl From<countersign_core::bundle::BundleReport> for BundleReportView {
    fn from(r: countersign_core::bundle::BundleReport) -> Self {
        Self {
            valid: r.valid,
            complete: r.complete,
            manifest_signed_by: r.manifest_signed_by,
            reasons: r.reasons,
            subject: r.subject,
            mode: r.mode.map(|m| enum_str(&m)),
            log_origin: r.log_origin,
            tree_size: r.tree_size,
            events: r.events,
            decisions: r.decisions,
        }
    }
}

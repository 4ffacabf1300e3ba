//! Evidence tools: record an autonomous decision or a review, export an evidence bundle
//! and verify one; and recording an outcome, which belongs with the requester's tools.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{Json, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{McpService, ToolError};
use crate::error::GateError;
use crate::views::ApprovalView;

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GetEvidenceInput {
    /// A request id (req_...) or a recorded decision id (dec_...).
    pub id: String,
    /// redacted (default: payload values replaced by salted commitments) or full (needs
    /// the operator to allow raw payload export).
    #[serde(default)]
    pub mode: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct EvidenceOutput {
    pub id: String,
    pub mode: String,
    pub filename: String,
    /// Hex SHA-256 of the ZIP.
    pub sha256: String,
    pub size: usize,
    /// The ZIP, standard base64. Verify it offline with `countersign verify-bundle`.
    pub bundle_base64: String,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VerifyEvidenceInput {
    /// An evidence bundle (ZIP), standard base64, as get_evidence returns it.
    pub bundle_base64: String,
}

#[tool_router(router = evidence_router, vis = "pub(crate)")]
impl McpService {
    #[tool(
        description = "Record a decision you (or your system) made on your own, with no human approval: what was decided, why, the model and the authority it acted under. It goes into the tamper-evident log; returns a record_id for get_evidence.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn record_decision(
        &self,
        Parameters(input): Parameters<crate::views::RecordDecisionInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<crate::views::RecordDecisionOutput>, ToolError> {
        let who = self.caller(&ctx)?;
        let (record_id, log_index) = self.gate.record_decision(&who, input.into()).await?;
        Ok(Json(crate::views::RecordDecisionOutput {
            message: format!("Recorded as {record_id} at log index {log_index}."),
            record_id,
            log_index,
        }))
    }

    #[tool(
        description = "Export the evidence bundle of a request or recorded decision: a ZIP with its log entries, their Merkle inclusion proofs, the signed checkpoint, the signed decision proof and the public keys. Anyone can verify it offline.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn get_evidence(
        &self,
        Parameters(input): Parameters<GetEvidenceInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<EvidenceOutput>, ToolError> {
        use base64::Engine;
        let who = self.caller(&ctx)?;
        let mode = crate::views::parse_mode(input.mode.as_deref())?;
        let zip = self.gate.evidence(&who, &input.id, mode).await?;
        Ok(Json(EvidenceOutput {
            filename: format!("{}.evidence.zip", input.id),
            sha256: hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&zip)),
            size: zip.len(),
            bundle_base64: base64::engine::general_purpose::STANDARD.encode(&zip),
            mode: input.mode.unwrap_or_else(|| "redacted".into()),
            id: input.id,
        }))
    }

    #[tool(
        description = "Verify an evidence bundle against this server's published keys: every file hash, signature, inclusion proof and the checkpoint. Returns valid and every problem found.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn verify_evidence(
        &self,
        Parameters(input): Parameters<VerifyEvidenceInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<crate::views::BundleReportView>, ToolError> {
        use base64::Engine;
        self.caller(&ctx)?;
        let zip = base64::engine::general_purpose::STANDARD
            .decode(input.bundle_base64.trim())
            .map_err(|e| {
                GateError::BadInput(format!("bundle_base64 is not standard base64: {e}"))
            })?;
        let report = self.gate.verify_evidence(zip).await?;
        Ok(Json(report.into()))
    }
}

#[tool_router(router = outcome_router, vis = "pub(crate)")]
impl McpService {
    #[tool(
        description = "Record what came of an approved action after record_action: status succeeded, failed or partial, a summary and details. Once per request.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn record_outcome(
        &self,
        Parameters(input): Parameters<crate::views::RecordOutcomeInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ApprovalView>, ToolError> {
        let who = self.caller(&ctx)?;
        let status = input.status.parse()?;
        let request = self
            .gate
            .record_outcome(
                &who,
                &input.request_id,
                status,
                input.summary,
                input.details,
            )
            .await?;
        Ok(Json(ApprovalView::new(&request)))
    }
}

#[tool_router(router = review_router, vis = "pub(crate)")]
impl McpService {
    #[tool(
        description = "Record your review of how a decided request was handled (verdict accepted or flagged, with notes), once per request. Only the reviewer the operator named may; the reply shows the review as recorded.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn record_review(
        &self,
        Parameters(input): Parameters<crate::views::RecordReviewInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<crate::views::ReviewOutput>, ToolError> {
        let who = self.caller(&ctx)?;
        let verdict = input.verdict.parse()?;
        let request = self
            .gate
            .record_review(&who, &input.request_id, verdict, input.notes)
            .await?;
        Ok(Json(crate::views::ReviewOutput::new(&request, &who.id)))
    }
}

//! Proof tools: verify a proof (anyone who may), and redeem one (the executor that is
//! about to carry out the approved action): two groups, since they need two scopes.

use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{Json, RoleServer, tool, tool_router};

use super::{McpService, ToolError};
use crate::views::{RedeemOutput, RedeemProofInput, VerifyOutput, VerifyProofInput};

#[tool_router(router = verify_router, vis = "pub(crate)")]
impl McpService {
    #[tool(
        description = "Verify a countersign proof: the signature against the published keys, that it is an approval, not expired and not used, and (when the action is given) that it is for exactly that action. Returns valid, bound (whether the action was checked) and every reason it is not valid. Without the action, valid says nothing about which action it approves (see warning): to act on a proof, redeem it.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn verify_proof(
        &self,
        Parameters(input): Parameters<VerifyProofInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<VerifyOutput>, ToolError> {
        self.caller(&ctx)?;
        let action = input.action()?;
        let report = self
            .gate
            .verify_proof(&input.proof.into(), action.as_ref())
            .await?;
        Ok(Json(report.into()))
    }
}

#[tool_router(router = redeem_router, vis = "pub(crate)")]
impl McpService {
    #[tool(
        description = "Redeem a countersign proof for the exact action you are about to perform, consuming the approval: it works once, only for exactly the approved action, only while the approval is valid. Call it before you act and act only if it succeeds; otherwise it is refused with the reason (already_used, action_mismatch, not_approved, approval_expired, invalid_proof, not_found).",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn redeem_proof(
        &self,
        Parameters(input): Parameters<RedeemProofInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<RedeemOutput>, ToolError> {
        let who = self.caller(&ctx)?;
        let action = input.action();
        let redeemed = self
            .gate
            .redeem_proof(&who, &input.proof.into(), &action)
            .await?;
        Ok(Json(RedeemOutput::new(&redeemed)))
    }
}

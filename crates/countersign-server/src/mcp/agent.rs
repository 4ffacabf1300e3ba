//! The agent's tools: ask for approval, check and wait for the decision, record the
//! action (using the approval up), withdraw a request.

use std::time::Duration;

use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{Json, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{McpService, ToolError};
use crate::error::GateError;
use crate::gate::{DEFAULT_WAIT_SECONDS, wait_time};
use crate::views::{ApprovalView, RecordActionInput, RequestApprovalInput, RequestApprovalOutput};

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestIdInput {
    pub request_id: String,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitInput {
    pub request_id: String,
    /// Seconds to wait for a decision before returning the still-pending status
    /// (default 45, at most 300). Call again to keep waiting.
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RecordActionOutput {
    pub request_id: String,
    pub tool: String,
    pub recorded_at: String,
    pub message: String,
}

#[tool_router(router = agent_router, vis = "pub(crate)")]
impl McpService {
    #[tool(
        description = "Ask a human to approve an action before you perform it. Returns at once with a request_id and status pending; do NOT act until wait_for_approval or check_approval reports approved.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn request_approval(
        &self,
        Parameters(input): Parameters<RequestApprovalInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<RequestApprovalOutput>, ToolError> {
        let who = self.caller(&ctx)?;
        let quorum = input.quorum();
        let requested = self
            .gate
            .request_approval_with(&who, input.into(), quorum)
            .await?;
        Ok(Json(RequestApprovalOutput::new(
            &requested.request,
            requested.existing,
        )))
    }

    #[tool(
        description = "The current status of an approval request; once decided, the decision and its signed proof.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn check_approval(
        &self,
        Parameters(input): Parameters<RequestIdInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ApprovalView>, ToolError> {
        let who = self.caller(&ctx)?;
        let request = self.gate.get(&who, &input.request_id).await?;
        Ok(Json(ApprovalView::new(&request)))
    }

    #[tool(
        description = "Wait until a human decides the request, or until timeout_seconds pass (default 45, max 300), then return the same result as check_approval. Returns the moment the decision is made. If still pending, call again.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn wait_for_approval(
        &self,
        Parameters(input): Parameters<WaitInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ApprovalView>, ToolError> {
        let who = self.caller(&ctx)?;
        let timeout = wait_time(input.timeout_seconds, DEFAULT_WAIT_SECONDS)?;
        let mut report = super::progress_reporter(&ctx, timeout.as_secs_f64());
        let mut progress =
            move |waited: Duration| report(waited.as_secs_f64(), "waiting for a human decision");
        let wait = self
            .gate
            .wait(&who, &input.request_id, timeout, &mut progress);
        let request = tokio::select! {
            result = wait => result?,
            _ = ctx.ct.cancelled() => {
                return Err(GateError::BadInput("the wait was cancelled by the client".into()).into());
            }
        };
        Ok(Json(ApprovalView::new(&request)))
    }

    #[tool(
        description = "Record that you are performing the approved action now. This uses up the approval: it works once, only while the approval is valid, and is refused with the reason otherwise.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn record_action(
        &self,
        Parameters(input): Parameters<RecordActionInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<RecordActionOutput>, ToolError> {
        let who = self.caller(&ctx)?;
        let request = self
            .gate
            .record_action(&who, &input.request_id, input.tool, input.details)
            .await?;
        let used = request.action_record.as_ref();
        Ok(Json(RecordActionOutput {
            request_id: request.id.clone(),
            tool: used.map(|u| u.tool.clone()).unwrap_or_default(),
            recorded_at: used.map(|u| u.recorded_at.to_string()).unwrap_or_default(),
            message: "Recorded. The approval is now used; perform the action exactly as approved."
                .into(),
        }))
    }

    #[tool(
        description = "Withdraw a pending approval request you no longer need.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn cancel_approval(
        &self,
        Parameters(input): Parameters<RequestIdInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ApprovalView>, ToolError> {
        let who = self.caller(&ctx)?;
        let request = self.gate.cancel(&who, &input.request_id).await?;
        Ok(Json(ApprovalView::new(&request)))
    }
}

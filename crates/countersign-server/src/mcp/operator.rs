//! The operator tools: list what is pending, approve, reject, as the approver whose token
//! calls them. Off unless the operator enables them, and never for an agent credential.

use countersign_core::{Channel, DecisionInput, Status, Verdict};
use countersign_store::RequestQuery;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::service::RequestContext;
use rmcp::{Json, RoleServer, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

use super::{McpService, ToolError};
use crate::views::ApprovalView;

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListPendingInput {
    /// At most this many, newest first (default 50).
    #[serde(default)]
    pub limit: Option<usize>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct PendingList {
    pub requests: Vec<ApprovalView>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct OperatorDecisionInput {
    pub request_id: String,
    /// A comment for the record (for a rejection, the reason returned to the agent).
    #[serde(default)]
    pub comment: Option<String>,
    /// Structured reply fields that go into the signed proof (e.g. a PO number).
    #[serde(default)]
    pub fields: BTreeMap<String, String>,
}

#[tool_router(router = operator_router, vis = "pub(crate)")]
impl McpService {
    #[tool(
        description = "Operator: list the approval requests waiting for a decision, newest first.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_pending_approvals(
        &self,
        Parameters(input): Parameters<ListPendingInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<PendingList>, ToolError> {
        let decider = self.decider(&ctx)?;
        let query = RequestQuery {
            status: Some(Status::Pending),
            requested_by: None,
            limit: input.limit.unwrap_or(50).clamp(1, 500),
        };
        let requests = self.gate.list(&decider, &query).await?;
        Ok(Json(PendingList {
            requests: requests.iter().map(ApprovalView::new).collect(),
        }))
    }

    #[tool(
        description = "Operator: approve a pending request as yourself (the identity of your approver token).",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn approve(
        &self,
        Parameters(input): Parameters<OperatorDecisionInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ApprovalView>, ToolError> {
        self.operator_decide(input, Verdict::Approved, &ctx).await
    }

    #[tool(
        description = "Operator: reject a pending request as yourself; the comment is returned to the agent as the reason.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn reject(
        &self,
        Parameters(input): Parameters<OperatorDecisionInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ApprovalView>, ToolError> {
        self.operator_decide(input, Verdict::Rejected, &ctx).await
    }
}

impl McpService {
    async fn operator_decide(
        &self,
        input: OperatorDecisionInput,
        verdict: Verdict,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Json<ApprovalView>, ToolError> {
        let decider = self.decider(ctx)?;
        let request = self
            .gate
            .decide(
                &decider,
                &input.request_id,
                verdict,
                DecisionInput {
                    comment: input.comment,
                    fields: input.fields,
                },
                Channel::Mcp,
            )
            .await?;
        Ok(Json(ApprovalView::new(&request)))
    }
}

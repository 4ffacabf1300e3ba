//! The MCP adapter: countersign's tools over rmcp, for stdio and Streamable HTTP alike.
//! rmcp moves fast, so everything that touches it stays in this module. Approvals live
//! in the store, never in an MCP request's lifetime: a client that disconnects and
//! comes back finds its request where it left it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use countersign_core::{Channel, DecisionInput, Principal, Status, Verdict};
use countersign_store::RequestQuery;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities,
    ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, Json, RoleServer, ServerHandler, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::GateError;
use crate::gate::{Decider, Gate};
use crate::views::{
    ApprovalView, DecisionBody, RecordActionInput, RequestApprovalInput, RequestApprovalOutput,
    VerifyOutput, VerifyProofInput,
};

/// Default and maximum time `wait_for_approval` blocks.
pub const DEFAULT_WAIT_SECONDS: u64 = 45;
pub const MAX_WAIT_SECONDS: u64 = 300;

const INSTRUCTIONS: &str = "countersign is an approval gate. Before any consequential action \
(payments, deploys, deletions, emails to customers, shell commands with side effects), call \
request_approval with a clear description and the exact details, then wait_for_approval. Act \
only if the status is approved, only on exactly the approved details, only once, and before \
valid_until; call record_action when you act. Never act on pending, rejected, timed_out or \
cancelled.";

/// Who the MCP caller is.
#[derive(Debug, Clone)]
pub enum Identity {
    /// A stdio process: one fixed principal for the whole session.
    Fixed(Principal),
    /// Streamable HTTP: the principal the authentication middleware attached to each
    /// HTTP request.
    PerRequest,
}

#[derive(Clone)]
pub struct McpService {
    gate: Arc<Gate>,
    identity: Identity,
    operator_tools_enabled: bool,
    agent_router: Arc<ToolRouter<Self>>,
    operator_router: Arc<ToolRouter<Self>>,
}

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

fn tool_error(err: GateError) -> CallToolResult {
    if err.code() == "internal" {
        tracing::error!(%err, "tool call failed");
    }
    CallToolResult::error(vec![ContentBlock::text(format!(
        "{}: {}",
        err.code(),
        err.public_message()
    ))])
}

impl McpService {
    pub fn new(gate: Arc<Gate>, identity: Identity, operator_tools_enabled: bool) -> Self {
        Self {
            gate: gate.clone(),
            identity,
            operator_tools_enabled,
            agent_router: Arc::new({
                let mut router = Self::agent_router() + Self::evidence_router();
                if gate.settings().reviewer.is_some() {
                    router += Self::review_router();
                }
                router
            }),
            operator_router: Arc::new(Self::operator_router()),
        }
    }

    fn caller(&self, ctx: &RequestContext<RoleServer>) -> Result<Principal, CallToolResult> {
        match &self.identity {
            Identity::Fixed(p) => Ok(p.clone()),
            Identity::PerRequest => ctx
                .extensions
                .get::<http::request::Parts>()
                .and_then(|parts| parts.extensions.get::<Principal>())
                .cloned()
                .ok_or_else(|| {
                    tool_error(GateError::Unauthenticated(
                        "no authenticated principal on this request".into(),
                    ))
                }),
        }
    }

    /// Whether this caller gets the operator tools: enabled by the operator, and only
    /// ever for a principal that may decide.
    fn operator_allowed(&self, ctx: &RequestContext<RoleServer>) -> bool {
        self.operator_tools_enabled
            && self
                .caller(ctx)
                .map(|p| p.role.may_decide())
                .unwrap_or(false)
    }

    fn decider(&self, ctx: &RequestContext<RoleServer>) -> Result<Decider, CallToolResult> {
        if !self.operator_tools_enabled {
            return Err(tool_error(GateError::Forbidden(
                "the operator tools are off on this server".into(),
            )));
        }
        Decider::new(self.caller(ctx)?).map_err(tool_error)
    }
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
    ) -> Result<Json<RequestApprovalOutput>, CallToolResult> {
        let who = self.caller(&ctx)?;
        let requested = self
            .gate
            .request_approval(&who, input.into())
            .await
            .map_err(tool_error)?;
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
    ) -> Result<Json<ApprovalView>, CallToolResult> {
        let who = self.caller(&ctx)?;
        let request = self
            .gate
            .get(&who, &input.request_id)
            .await
            .map_err(tool_error)?;
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
    ) -> Result<Json<ApprovalView>, CallToolResult> {
        let who = self.caller(&ctx)?;
        let seconds = input.timeout_seconds.unwrap_or(DEFAULT_WAIT_SECONDS);
        if seconds > MAX_WAIT_SECONDS {
            return Err(tool_error(GateError::BadInput(format!(
                "timeout_seconds is {seconds}; at most {MAX_WAIT_SECONDS} is allowed (call again to keep waiting)"
            ))));
        }
        let token = ctx.meta.get_progress_token();
        let peer = ctx.peer.clone();
        let mut progress = move |waited: Duration| {
            if let Some(token) = token.clone() {
                let peer = peer.clone();
                let param = ProgressNotificationParam::new(token, waited.as_secs_f64())
                    .with_total(seconds as f64)
                    .with_message("waiting for a human decision");
                tokio::spawn(async move {
                    let _ = peer.notify_progress(param).await;
                });
            }
        };
        let wait = self.gate.wait(
            &who,
            &input.request_id,
            Duration::from_secs(seconds),
            &mut progress,
        );
        let request = tokio::select! {
            result = wait => result.map_err(tool_error)?,
            _ = ctx.ct.cancelled() => {
                return Err(tool_error(GateError::BadInput("the wait was cancelled by the client".into())));
            }
        };
        Ok(Json(ApprovalView::new(&request)))
    }

    #[tool(
        description = "Verify a countersign proof: the signature against the published keys, that it is an approval, not expired and not used, and (when the action is given) that it is for exactly that action. Returns valid and every reason it is not.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn verify_proof(
        &self,
        Parameters(input): Parameters<VerifyProofInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<VerifyOutput>, CallToolResult> {
        self.caller(&ctx)?;
        let action = input.action().map_err(tool_error)?;
        let report = self
            .gate
            .verify_proof(&input.proof.into(), action.as_ref())
            .await
            .map_err(tool_error)?;
        Ok(Json(report.into()))
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
    ) -> Result<Json<RecordActionOutput>, CallToolResult> {
        let who = self.caller(&ctx)?;
        let request = self
            .gate
            .record_action(&who, &input.request_id, input.tool, input.details)
            .await
            .map_err(tool_error)?;
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
    ) -> Result<Json<ApprovalView>, CallToolResult> {
        let who = self.caller(&ctx)?;
        let request = self
            .gate
            .cancel(&who, &input.request_id)
            .await
            .map_err(tool_error)?;
        Ok(Json(ApprovalView::new(&request)))
    }
}

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
    ) -> Result<Json<crate::views::RecordDecisionOutput>, CallToolResult> {
        let who = self.caller(&ctx)?;
        let (record_id, log_index) = self
            .gate
            .record_decision(&who, input.into())
            .await
            .map_err(tool_error)?;
        Ok(Json(crate::views::RecordDecisionOutput {
            message: format!("Recorded as {record_id} at log index {log_index}."),
            record_id,
            log_index,
        }))
    }

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
    ) -> Result<Json<ApprovalView>, CallToolResult> {
        let who = self.caller(&ctx)?;
        let status = input
            .status
            .parse()
            .map_err(|e: countersign_core::CoreError| tool_error(e.into()))?;
        let request = self
            .gate
            .record_outcome(
                &who,
                &input.request_id,
                status,
                input.summary,
                input.details,
            )
            .await
            .map_err(tool_error)?;
        Ok(Json(ApprovalView::new(&request)))
    }

    #[tool(
        description = "Export the evidence bundle of a request or recorded decision: a ZIP with its log entries, their Merkle inclusion proofs, the signed checkpoint, the signed decision proof and the public keys. Anyone can verify it offline.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn get_evidence(
        &self,
        Parameters(input): Parameters<GetEvidenceInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<EvidenceOutput>, CallToolResult> {
        use base64::Engine;
        let who = self.caller(&ctx)?;
        let mode = crate::views::parse_mode(input.mode.as_deref()).map_err(tool_error)?;
        let zip = self
            .gate
            .evidence(&who, &input.id, mode)
            .await
            .map_err(tool_error)?;
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
    ) -> Result<Json<crate::views::BundleReportView>, CallToolResult> {
        use base64::Engine;
        self.caller(&ctx)?;
        let zip = base64::engine::general_purpose::STANDARD
            .decode(input.bundle_base64.trim())
            .map_err(|e| {
                tool_error(GateError::BadInput(format!(
                    "bundle_base64 is not standard base64: {e}"
                )))
            })?;
        let report = self.gate.verify_evidence(&zip).await.map_err(tool_error)?;
        Ok(Json(report.into()))
    }
}

#[tool_router(router = review_router, vis = "pub(crate)")]
impl McpService {
    #[tool(
        description = "Record a review of how a decided request was handled (verdict accepted or flagged, with notes). The reviewer recorded is the one the operator configured.",
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
    ) -> Result<Json<ApprovalView>, CallToolResult> {
        let who = self.caller(&ctx)?;
        let verdict = input
            .verdict
            .parse()
            .map_err(|e: countersign_core::CoreError| tool_error(e.into()))?;
        let request = self
            .gate
            .record_review(&who, &input.request_id, verdict, input.notes)
            .await
            .map_err(tool_error)?;
        Ok(Json(ApprovalView::new(&request)))
    }
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
    ) -> Result<Json<PendingList>, CallToolResult> {
        let decider = self.decider(&ctx)?;
        let query = RequestQuery {
            status: Some(Status::Pending),
            requested_by: None,
            limit: input.limit.unwrap_or(50).clamp(1, 500),
        };
        let requests = self.gate.list(&decider, &query).await.map_err(tool_error)?;
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
    ) -> Result<Json<ApprovalView>, CallToolResult> {
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
    ) -> Result<Json<ApprovalView>, CallToolResult> {
        self.operator_decide(input, Verdict::Rejected, &ctx).await
    }
}

impl McpService {
    async fn operator_decide(
        &self,
        input: OperatorDecisionInput,
        verdict: Verdict,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Json<ApprovalView>, CallToolResult> {
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
            .await
            .map_err(tool_error)?;
        Ok(Json(ApprovalView::new(&request)))
    }
}

/// Parses a REST decision body's verdict (shared with the REST adapter).
pub(crate) fn parse_decision(body: &DecisionBody) -> Result<Verdict, GateError> {
    body.decision.parse::<Verdict>().map_err(GateError::from)
}

impl ServerHandler for McpService {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "countersign",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut tools = self.agent_router.list_all();
        if self.operator_allowed(&context) {
            tools.extend(self.operator_router.list_all());
        }
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        if self.operator_router.has_route(&request.name) {
            if !self.operator_allowed(&context) {
                return Err(ErrorData::invalid_params(
                    format!(
                        "tool {} is an operator tool: it needs operator_tools = true in the server's config and an approver or admin token",
                        request.name
                    ),
                    None,
                ));
            }
            let tcc = ToolCallContext::new(self, request, context);
            return self.operator_router.call(tcc).await;
        }
        let tcc = ToolCallContext::new(self, request, context);
        self.agent_router.call(tcc).await
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.agent_router
            .get(name)
            .or_else(|| self.operator_router.get(name))
            .cloned()
    }
}

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
    room_admin_router: Arc<ToolRouter<Self>>,
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
                let mut router =
                    Self::agent_router() + Self::evidence_router() + Self::rooms_router();
                if gate.settings().reviewer.is_some() {
                    router += Self::review_router();
                }
                router
            }),
            operator_router: Arc::new(Self::operator_router()),
            room_admin_router: Arc::new(Self::room_admin_router()),
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
    fn may_decide(&self, ctx: &RequestContext<RoleServer>) -> bool {
        self.caller(ctx)
            .map(|p| p.role.may_decide())
            .unwrap_or(false)
    }

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

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PostMessageInput {
    /// The room's name (created on first use), e.g. "release-train".
    pub room: String,
    pub text: String,
    /// note (default), question, progress or done. Blockers go through report_blocker.
    #[serde(default, rename = "type")]
    pub kind: Option<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadMessagesInput {
    pub room: String,
    /// Only messages after this seq (the `next_since` of a previous read).
    #[serde(default)]
    pub since: Option<u64>,
    /// At most this many (default 50, max 500).
    #[serde(default)]
    pub limit: Option<usize>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WaitMessageInput {
    pub room: String,
    #[serde(default)]
    pub since: Option<u64>,
    /// Seconds to wait (default 30, max 300).
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct MessagesOutput {
    pub messages: Vec<crate::rooms::MessageView>,
    /// Pass as `since` to read or wait for what comes next.
    pub next_since: u64,
    /// True when a wait ended without a new message.
    pub timed_out: bool,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RoomInput {
    pub room: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct MemberView {
    pub id: String,
    pub display_name: String,
    /// working, waiting, blocked, done or idle.
    pub status: String,
    pub note: Option<String>,
    pub last_activity: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RoomOutput {
    pub room: String,
    pub title: String,
    pub members: Vec<MemberView>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PresenceInput {
    pub room: String,
    /// working, waiting, blocked, done or idle.
    pub status: String,
    #[serde(default)]
    pub note: Option<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FeedbackInput {
    pub room: String,
    pub question: String,
    /// Seconds to wait for an answer before proceeding (default 30, max 300).
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct FeedbackOutput {
    pub question_id: String,
    pub answered: bool,
    pub answer: Option<String>,
    pub answered_by: Option<String>,
    pub message: String,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BlockerInput {
    pub room: String,
    /// What stops you, and what you need from a person.
    pub description: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct BlockerOutput {
    pub blocker_id: String,
    pub message: String,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResolutionInput {
    pub room: String,
    pub blocker_id: String,
    /// Seconds to wait (default 45, max 300). Call again to keep waiting.
    #[serde(default)]
    pub timeout_seconds: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct ResolutionOutput {
    pub blocker_id: String,
    pub resolved: bool,
    pub reply: Option<String>,
    pub resolved_by: Option<String>,
    pub message: String,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KickInput {
    pub room: String,
    /// The member's id, as listed by join_room (e.g. token:deploy-bot).
    pub member: String,
}

fn wait_seconds(given: Option<u64>, default: u64) -> Result<Duration, CallToolResult> {
    let seconds = given.unwrap_or(default);
    if seconds > MAX_WAIT_SECONDS {
        return Err(tool_error(GateError::BadInput(format!(
            "timeout_seconds is {seconds}; at most {MAX_WAIT_SECONDS} is allowed (call again to keep waiting)"
        ))));
    }
    Ok(Duration::from_secs(seconds))
}

fn messages_output(
    messages: Vec<crate::rooms::MessageView>,
    since: u64,
    timed_out: bool,
) -> MessagesOutput {
    MessagesOutput {
        next_since: messages.iter().map(|m| m.seq).max().unwrap_or(since),
        messages,
        timed_out,
    }
}

#[tool_router(router = rooms_router, vis = "pub(crate)")]
impl McpService {
    #[tool(
        description = "Post a message to a room where people and other agents follow the work: type note (default), question, progress or done. To stop until a person helps, use report_blocker; to ask and wait briefly, wait_for_feedback.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn post_message(
        &self,
        Parameters(input): Parameters<PostMessageInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<crate::rooms::MessageView>, CallToolResult> {
        let who = self.caller(&ctx)?;
        let message = self
            .gate
            .post_message(
                &who,
                &input.room,
                &input.text,
                input.kind.as_deref().unwrap_or("note"),
            )
            .await
            .map_err(tool_error)?;
        Ok(Json(message))
    }

    #[tool(
        description = "Read a room's messages, oldest first; pass next_since back as since to read what comes next.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn read_messages(
        &self,
        Parameters(input): Parameters<ReadMessagesInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<MessagesOutput>, CallToolResult> {
        self.caller(&ctx)?;
        let since = input.since.unwrap_or(0);
        if self
            .gate
            .room(&input.room)
            .await
            .map_err(tool_error)?
            .is_none()
        {
            return Err(tool_error(GateError::NotFound(format!(
                "room {}",
                input.room
            ))));
        }
        let messages = self
            .gate
            .messages(&input.room, since, input.limit.unwrap_or(50).clamp(1, 500))
            .await
            .map_err(tool_error)?;
        Ok(Json(messages_output(messages, since, false)))
    }

    #[tool(
        description = "Wait until a new message arrives in a room (after since), or until timeout_seconds pass (default 30, max 300). Returns the moment a message is posted.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn wait_for_message(
        &self,
        Parameters(input): Parameters<WaitMessageInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<MessagesOutput>, CallToolResult> {
        self.caller(&ctx)?;
        let timeout = wait_seconds(input.timeout_seconds, 30)?;
        let since = input.since.unwrap_or(0);
        let messages = self
            .gate
            .wait_for_message(&input.room, since, timeout)
            .await
            .map_err(tool_error)?;
        let timed_out = messages.is_empty();
        Ok(Json(messages_output(messages, since, timed_out)))
    }

    #[tool(
        description = "Join a room (created if it does not exist) and see who is in it.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn join_room(
        &self,
        Parameters(input): Parameters<RoomInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<RoomOutput>, CallToolResult> {
        let who = self.caller(&ctx)?;
        let (room, _) = self
            .gate
            .join_room(&who, &input.room)
            .await
            .map_err(tool_error)?;
        self.room_output(room).await
    }

    #[tool(
        description = "Leave a room.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn leave_room(
        &self,
        Parameters(input): Parameters<RoomInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<RoomOutput>, CallToolResult> {
        let who = self.caller(&ctx)?;
        self.gate
            .leave_room(&who, &input.room)
            .await
            .map_err(tool_error)?;
        let room = self
            .gate
            .room(&input.room)
            .await
            .map_err(tool_error)?
            .ok_or_else(|| tool_error(GateError::NotFound(format!("room {}", input.room))))?;
        self.room_output(room).await
    }

    #[tool(
        description = "Say what you are doing in a room: working, waiting, blocked, done or idle (with an optional note). People see it in the room's roster.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn set_presence(
        &self,
        Parameters(input): Parameters<PresenceInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<MemberView>, CallToolResult> {
        let who = self.caller(&ctx)?;
        let status = input
            .status
            .parse()
            .map_err(|e: countersign_core::CoreError| tool_error(e.into()))?;
        let member = self
            .gate
            .set_presence(&who, &input.room, status, input.note)
            .await
            .map_err(tool_error)?;
        Ok(Json(member_view(&member)))
    }

    #[tool(
        description = "Ask the people in a room a question and wait up to timeout_seconds (default 30) for an answer. A soft gate: if nobody answers in time, you get answered=false and may proceed with your best judgement.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn wait_for_feedback(
        &self,
        Parameters(input): Parameters<FeedbackInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<FeedbackOutput>, CallToolResult> {
        let who = self.caller(&ctx)?;
        let timeout = wait_seconds(input.timeout_seconds, 30)?;
        let (asked, answer) = self
            .gate
            .ask(&who, &input.room, &input.question, timeout)
            .await
            .map_err(tool_error)?;
        Ok(Json(match answer {
            Some(a) => FeedbackOutput {
                question_id: asked.id,
                answered: true,
                message: format!("{} answered.", a.author.clone().unwrap_or_default()),
                answer: a.text,
                answered_by: a.author,
            },
            None => FeedbackOutput {
                question_id: asked.id,
                answered: false,
                answer: None,
                answered_by: None,
                message: format!(
                    "No answer within {} seconds: you may proceed with your best judgement. The question stays open in the room.",
                    timeout.as_secs()
                ),
            },
        }))
    }

    #[tool(
        description = "Report that you are blocked and need a person. STOP working on the blocked task: call wait_for_resolution with the blocker_id until a person resolves it. Only a person can resolve a blocker.",
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn report_blocker(
        &self,
        Parameters(input): Parameters<BlockerInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<BlockerOutput>, CallToolResult> {
        let who = self.caller(&ctx)?;
        let blocker = self
            .gate
            .report_blocker(&who, &input.room, &input.description)
            .await
            .map_err(tool_error)?;
        Ok(Json(BlockerOutput {
            message: format!(
                "Blocked. Do not continue the blocked work: call wait_for_resolution with room {} and blocker_id {} until a person resolves it.",
                input.room, blocker.id
            ),
            blocker_id: blocker.id,
        }))
    }

    #[tool(
        description = "Wait until a person resolves your blocker (or timeout_seconds pass, default 45, max 300; call again to keep waiting). Returns their reply.",
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn wait_for_resolution(
        &self,
        Parameters(input): Parameters<ResolutionInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<ResolutionOutput>, CallToolResult> {
        self.caller(&ctx)?;
        let timeout = wait_seconds(input.timeout_seconds, 45)?;
        let reply = self
            .gate
            .wait_for_reply(&input.room, &input.blocker_id, timeout)
            .await
            .map_err(tool_error)?;
        Ok(Json(match reply {
            Some(r) => ResolutionOutput {
                blocker_id: input.blocker_id,
                resolved: true,
                message: "Resolved: follow the reply, then continue.".into(),
                reply: r.text,
                resolved_by: r.author,
            },
            None => ResolutionOutput {
                blocker_id: input.blocker_id,
                resolved: false,
                reply: None,
                resolved_by: None,
                message: "Still blocked: do not continue; call wait_for_resolution again.".into(),
            },
        }))
    }
}

#[tool_router(router = room_admin_router, vis = "pub(crate)")]
impl McpService {
    #[tool(
        description = "Room admin: remove a member from a room.",
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = true,
            open_world_hint = false
        )
    )]
    async fn kick(
        &self,
        Parameters(input): Parameters<KickInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Json<RoomOutput>, CallToolResult> {
        let decider = Decider::new(self.caller(&ctx)?).map_err(tool_error)?;
        self.gate
            .kick(&decider, &input.room, &input.member)
            .await
            .map_err(tool_error)?;
        let room = self
            .gate
            .room(&input.room)
            .await
            .map_err(tool_error)?
            .ok_or_else(|| tool_error(GateError::NotFound(format!("room {}", input.room))))?;
        self.room_output(room).await
    }
}

fn member_view(m: &crate::rooms::Member) -> MemberView {
    MemberView {
        id: m.id.clone(),
        display_name: m.display_name.clone(),
        status: match serde_json::to_value(m.status) {
            Ok(serde_json::Value::String(s)) => s,
            _ => String::new(),
        },
        note: m.note.clone(),
        last_activity: m.last_activity.to_string(),
    }
}

impl McpService {
    async fn room_output(
        &self,
        room: crate::rooms::Room,
    ) -> Result<Json<RoomOutput>, CallToolResult> {
        let members = self.gate.members(&room.name).await.map_err(tool_error)?;
        Ok(Json(RoomOutput {
            room: room.name,
            title: room.title,
            members: members.iter().map(member_view).collect(),
        }))
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
        if self.may_decide(&context) {
            tools.extend(self.room_admin_router.list_all());
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
        if self.room_admin_router.has_route(&request.name) {
            if !self.may_decide(&context) {
                return Err(ErrorData::invalid_params(
                    format!(
                        "tool {} is for room admins: it needs an approver or admin token",
                        request.name
                    ),
                    None,
                ));
            }
            let tcc = ToolCallContext::new(self, request, context);
            return self.room_admin_router.call(tcc).await;
        }
        let tcc = ToolCallContext::new(self, request, context);
        self.agent_router.call(tcc).await
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.agent_router
            .get(name)
            .or_else(|| self.operator_router.get(name))
            .or_else(|| self.room_admin_router.get(name))
            .cloned()
    }
}

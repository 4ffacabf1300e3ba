//! The approval-gate profile: approval-gate-mcp's tools, with their names and shapes,
//! for operators who move from it (docs/bridge.md). `list_pending_approvals` numbers the
//! bridged proposals awaiting a decision, `approve(index)` and `reject(index)` decide
//! one by its number, `record_summary(n)` and `record_dashboard` read the processes'
//! records. Served by `countersign mcp --profile approval-gate` (stdio) and at
//! `/mcp/profile/approval-gate` (Streamable HTTP); the native tools at `/mcp` stay as
//! they are.
//!
//! Every tool is an operator's: it needs an approver or admin credential with the
//! `decide` scope (an approver token over HTTP; over stdio, `--token-file` of one), and
//! an agent is neither shown them nor let through. The rules are `bridge::proposals`
//! and `bridge::records`; this file only speaks MCP.

use std::sync::Arc;

use countersign_core::{Decider, Principal, Verdict};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::{IntoCallToolResult, ToolCallContext, schema_for_output};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, tool, tool_router};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Identity, ToolError, http_principal};
use crate::bridge::BridgeConfig;
use crate::bridge::proposals::{self, DecidedProposal, Listings, PendingProposals};
use crate::bridge::records::{self, RecordsReport, RecordsView};
use crate::error::GateError;
use crate::gate::Gate;
use crate::operate::Operations;

/// The profile's name, in `--profile` and `/mcp/profile/<name>`.
pub const PROFILE: &str = "approval-gate";

const INSTRUCTIONS: &str = "countersign's approval-gate profile: the operator's console for \
long-running processes gated through countersign's bridges (approval-gate-mcp's tools). \
list_pending_approvals shows every proposal awaiting a decision, numbered #0, #1, ...; \
approve(index) and reject(index) decide the proposal your last listing showed under that \
number, and refuse if it is no longer awaiting a decision (list again then). Decide only what \
the operator asked you to. record_summary(n) and record_dashboard summarize the processes' \
records.json.";

/// A tool's answer: the seed's text for people and models, and the same as structured
/// content for programs.
pub(crate) struct Shown<T> {
    pub(crate) text: String,
    pub(crate) value: T,
}

impl<T: Serialize> IntoCallToolResult for Shown<T> {
    fn into_call_tool_result(self) -> Result<CallToolResponse, ErrorData> {
        let value = serde_json::to_value(&self.value).map_err(|e| {
            ErrorData::internal_error(format!("could not encode the answer: {e}"), None)
        })?;
        let mut result = CallToolResult::structured(value);
        result.content = vec![ContentBlock::text(self.text)];
        Ok(result.into())
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListInput {
    /// Only this bridge's proposals (default: every bridge's).
    #[serde(default)]
    pub bridge: Option<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IndexInput {
    /// The proposal's number in your last list_pending_approvals.
    pub index: usize,
    /// A comment for the record (for a rejection, the reason).
    #[serde(default)]
    pub comment: Option<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SummaryInput {
    /// How many of the most recent records to show (default 10, at most 500).
    #[serde(default)]
    pub n: Option<usize>,
    /// Only this bridge's records (default: every bridge's).
    #[serde(default)]
    pub bridge: Option<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DashboardInput {
    /// Only this bridge's records (default: every bridge's).
    #[serde(default)]
    pub bridge: Option<String>,
}

/// Who calls the profile's tools.
#[derive(Debug, Clone)]
enum Caller {
    /// One fixed principal (stdio, no token given).
    Fixed(Principal),
    /// The bearer token of a stdio process (`--token-file`), authenticated at every call
    /// so that a revoked or expired token stops working mid-session.
    Token(Arc<str>),
    /// Streamable HTTP: the principal the authentication middleware attached.
    PerRequest,
}

#[derive(Clone)]
pub struct ApprovalGateService {
    gate: Arc<Gate>,
    caller: Caller,
    bridges: Arc<Vec<BridgeConfig>>,
    listings: Arc<Listings>,
    /// The process operations, parameters and probes (`mcp/operate.rs`), when configured.
    pub(super) ops: Option<Arc<Operations>>,
    router: ToolRouter<ApprovalGateService>,
}

impl ApprovalGateService {
    /// The profile for `bridges` (whose records it reads). Over stdio (`Identity::Fixed`)
    /// a listing lives in this process; over HTTP in the store, so that any instance
    /// resolves a number alike.
    pub fn new(gate: Arc<Gate>, identity: Identity, bridges: Vec<BridgeConfig>) -> Self {
        let caller = match identity {
            Identity::Fixed(p) => Caller::Fixed(p),
            Identity::PerRequest => Caller::PerRequest,
        };
        Self::build(gate, caller, bridges)
    }

    /// The profile over stdio for the holder of `token` (`--token-file`): checked at
    /// every call, its listing kept in this process.
    pub fn with_token(gate: Arc<Gate>, token: String, bridges: Vec<BridgeConfig>) -> Self {
        Self::build(gate, Caller::Token(token.into()), bridges)
    }

    fn build(gate: Arc<Gate>, caller: Caller, bridges: Vec<BridgeConfig>) -> Self {
        let listings = match caller {
            Caller::Fixed(_) | Caller::Token(_) => Listings::memory(),
            Caller::PerRequest => Listings::Stored,
        };
        Self {
            gate,
            caller,
            bridges: Arc::new(bridges),
            listings: Arc::new(listings),
            ops: None,
            router: Self::profile_router(),
        }
    }

    /// Adds the process tools of `ops`: `process_status`, `process_logs`,
    /// `restart_process` and `run_command` when a `[[process]]` is configured, the
    /// parameter tools when `[params]` is, and each `[[probe]]` by its name.
    pub fn with_operations(mut self, ops: Arc<Operations>) -> Self {
        let mut router = Self::profile_router();
        if !ops.processes().is_empty() {
            router += Self::process_router();
        }
        if ops.has_params() {
            router += Self::params_router();
        }
        self.router = router;
        self.ops = Some(ops);
        self
    }

    /// The configured probe `name`, if it is one.
    fn is_probe(&self, name: &str) -> bool {
        self.ops
            .as_ref()
            .is_some_and(|ops| ops.config().probes.iter().any(|p| p.name == name))
    }

    async fn caller(&self, ctx: &RequestContext<RoleServer>) -> Result<Principal, GateError> {
        match &self.caller {
            Caller::Fixed(p) => Ok(p.clone()),
            Caller::Token(token) => self.gate.authenticate(token).await,
            Caller::PerRequest => http_principal(ctx).ok_or_else(|| {
                GateError::Unauthenticated("no authenticated principal on this request".into())
            }),
        }
    }

    /// The caller as an operator, or why it is not one.
    pub(super) async fn operator(
        &self,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Decider, GateError> {
        let who = self.caller(ctx).await?;
        Decider::new(who.clone()).map_err(|_| GateError::Forbidden(refusal(&who)))
    }
}

/// What an agent (or a credential without the decide scope) is told.
fn refusal(who: &Principal) -> String {
    format!(
        "the approval-gate tools are an operator's: deciding and reading the processes' records need an approver or admin credential with the decide scope, and {} is a {} credential with {}. Over HTTP use an approver token; over stdio run `countersign mcp --profile approval-gate --token-file FILE` with an approver token in FILE",
        who.id, who.role, who.scopes
    )
}

#[tool_router(router = profile_router, vis = "pub(crate)")]
impl ApprovalGateService {
    #[tool(
        description = "List every proposal awaiting approval, with all its fields, numbered #0, #1, ... (oldest first), across every bridged process you may see; each says which bridge it is from. approve(index) and reject(index) take these numbers.",
        output_schema = schema_for_output::<PendingProposals>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn list_pending_approvals(
        &self,
        Parameters(input): Parameters<ListInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Shown<PendingProposals>, ToolError> {
        let decider = self.operator(&ctx).await?;
        let listed = proposals::list(
            &self.gate,
            &self.listings,
            &decider,
            input.bridge.as_deref(),
        )
        .await?;
        Ok(Shown {
            text: listed.to_text(),
            value: listed,
        })
    }

    #[tool(
        description = "Approve one proposal: the one your last list_pending_approvals numbered `index`. It is queued for execution (the process picks it up from approved.json on its next cycle). Refused, deciding nothing, if that proposal is no longer awaiting a decision.",
        output_schema = schema_for_output::<DecidedProposal>(),
        annotations(
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn approve(
        &self,
        Parameters(input): Parameters<IndexInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Shown<DecidedProposal>, ToolError> {
        self.decide(input, Verdict::Approved, &ctx).await
    }

    #[tool(
        description = "Reject one proposal: the one your last list_pending_approvals numbered `index`. It is removed from the process's pending proposals. Refused, deciding nothing, if that proposal is no longer awaiting a decision.",
        output_schema = schema_for_output::<DecidedProposal>(),
        annotations(
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn reject(
        &self,
        Parameters(input): Parameters<IndexInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Shown<DecidedProposal>, ToolError> {
        self.decide(input, Verdict::Rejected, &ctx).await
    }

    #[tool(
        description = "Summarize the processes' records.json: totals, resolved against open, a breakdown by record_type, and the n most recent entries (default 10), each joined with the countersign request it came from.",
        output_schema = schema_for_output::<RecordsReport>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn record_summary(
        &self,
        Parameters(input): Parameters<SummaryInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Shown<RecordsReport>, ToolError> {
        let decider = self.operator(&ctx).await?;
        let view = RecordsView::Summary {
            recent: input.n.unwrap_or(10),
        };
        let report = records::report(
            &self.gate,
            &decider,
            &self.bridges,
            input.bridge.as_deref(),
            view,
        )
        .await?;
        Ok(Shown {
            text: report.summary_text(),
            value: report,
        })
    }

    #[tool(
        description = "The wider view of the processes' records: totals, the breakdown by record_type, a table of the latest records, and the records open now with their exposure (the sum of cost of open records).",
        output_schema = schema_for_output::<RecordsReport>(),
        annotations(read_only_hint = true, open_world_hint = false)
    )]
    async fn record_dashboard(
        &self,
        Parameters(input): Parameters<DashboardInput>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<Shown<RecordsReport>, ToolError> {
        let decider = self.operator(&ctx).await?;
        let report = records::report(
            &self.gate,
            &decider,
            &self.bridges,
            input.bridge.as_deref(),
            RecordsView::Dashboard,
        )
        .await?;
        Ok(Shown {
            text: report.dashboard_text(),
            value: report,
        })
    }
}

impl ApprovalGateService {
    async fn decide(
        &self,
        input: IndexInput,
        verdict: Verdict,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<Shown<DecidedProposal>, ToolError> {
        let decider = self.operator(ctx).await?;
        let decided = proposals::decide(
            &self.gate,
            &self.listings,
            &decider,
            input.index,
            verdict,
            input.comment,
        )
        .await?;
        Ok(Shown {
            text: decided.message.clone(),
            value: decided,
        })
    }
}

impl ServerHandler for ApprovalGateService {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "countersign-approval-gate",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = match (self.operator(&context).await, &self.ops) {
            (Ok(_), Some(ops)) => {
                let mut tools = self.router.list_all();
                tools.extend(super::operate::probe_tools(ops));
                tools
            }
            (Ok(_), None) => self.router.list_all(),
            (Err(_), _) => Vec::new(),
        };
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let probe = self.is_probe(&request.name);
        if !probe && !self.router.has_route(&request.name) {
            return Err(ErrorData::invalid_params(
                format!(
                    "there is no tool {} in the {PROFILE} profile (the native tools are at /mcp, or `countersign mcp` without --profile)",
                    request.name
                ),
                None,
            ));
        }
        if let Err(err) = self.operator(&context).await {
            return Err(ErrorData::invalid_params(
                format!("tool {}: {}", request.name, err.public_message()),
                None,
            ));
        }
        if probe {
            if request.arguments.as_ref().is_some_and(|a| !a.is_empty()) {
                return Err(ErrorData::invalid_params(
                    format!("probe {} takes no arguments", request.name),
                    None,
                ));
            }
            return self
                .call_probe(&request.name, &context)
                .await
                .into_call_tool_result();
        }
        self.router
            .call(ToolCallContext::new(self, request, context))
            .await
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.router.get(name).cloned().or_else(|| {
            let ops = self.ops.as_ref()?;
            super::operate::probe_tools(ops)
                .into_iter()
                .find(|t| t.name == name)
        })
    }
}

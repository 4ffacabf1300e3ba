//! The MCP adapter: countersign's tools over rmcp, for stdio and Streamable HTTP alike.
//! rmcp moves fast, so everything that touches it stays in this module: the service and
//! its `ServerHandler` here, one file per tool group (`agent`, `proofs`, `evidence`,
//! `rooms`, `operator`). A tool returns `Result<Json<T>, ToolError>`, so `?` turns a
//! domain error into a tool error. Approvals live in the store, never in an MCP
//! request's lifetime: a client that disconnects and comes back finds its request where
//! it left it.
//!
//! Every tool belongs to one group, and each group says what a caller needs (a scope,
//! and for some more than that): `tools/list` shows a caller only the tools it may call,
//! and a call to any other is refused. A tool in no group cannot be called at all.

mod agent;
pub mod approval_gate;
pub mod chatroom;
pub use operate::TOOL_NAMES as APPROVAL_GATE_TOOLS;
mod evidence;
pub mod gateway;
pub mod looppause;
mod operate;
mod operator;
mod proofs;
mod rooms;
mod tasks;
mod upstream;

use std::sync::Arc;

use countersign_core::{CoreError, Decider, Principal, Scope};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CancelTaskParams, ContentBlock, GetTaskParams,
    GetTaskResult, Implementation, IntoContents, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Tool, UpdateTaskParams,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};

use crate::error::{ErrorKind, GateError};
use crate::gate::Gate;

const INSTRUCTIONS: &str = "countersign is an approval gate. Before any consequential action \
(payments, deploys, deletions, emails to customers, shell commands with side effects), call \
request_approval with a clear description and the exact details, then wait_for_approval. Act \
only if the status is approved, only on exactly the approved details, only once, and before \
valid_until; call record_action when you act. Never act on pending, rejected, timed_out or \
cancelled.";

#[derive(Debug, Clone)]
pub enum Identity {
    /// A stdio process: one fixed principal for the whole session.
    Fixed(Principal),
    /// Streamable HTTP: the principal the authentication middleware attached to each
    /// HTTP request.
    PerRequest,
}

/// What a caller needs to be offered a group of tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Need {
    /// The scope, nothing more.
    Scope(Scope),
    /// The decide scope, and the operator's `operator_tools = true`.
    OperatorTools,
    /// The rooms and decide scopes and, like the operator tools, `operator_tools =
    /// true` (removing members over MCP, as docs/rooms.md says).
    RoomAdmin,
    /// To be the reviewer the operator named (with the evidence scope).
    Reviewer,
}

/// A group of tools and what calling them needs.
struct Group {
    router: ToolRouter<McpService>,
    need: Need,
}

#[derive(Clone)]
pub struct McpService {
    gate: Arc<Gate>,
    identity: Identity,
    operator_tools_enabled: bool,
    groups: Arc<Vec<Group>>,
    instructions: &'static str,
    /// The chatroom profile: `request_approval` blocks (or, as a task, follows its
    /// timeout rules).
    blocking_requests: bool,
}

/// A tool's failure, shown to the model as `code: message` (internal details stay in
/// the server's log).
#[derive(Debug)]
pub struct ToolError(GateError);

impl From<GateError> for ToolError {
    fn from(err: GateError) -> Self {
        ToolError(err)
    }
}

impl From<CoreError> for ToolError {
    fn from(err: CoreError) -> Self {
        ToolError(err.into())
    }
}

impl IntoContents for ToolError {
    fn into_contents(self) -> Vec<ContentBlock> {
        let err = self.0;
        if err.kind() == ErrorKind::Internal {
            tracing::error!(%err, "tool call failed");
        }
        vec![ContentBlock::text(format!(
            "{}: {}",
            err.code(),
            err.public_message()
        ))]
    }
}

/// The principal the HTTP authentication attached to the request behind `ctx` (none over
/// stdio).
pub(crate) fn http_principal(ctx: &RequestContext<RoleServer>) -> Option<Principal> {
    ctx.extensions
        .get::<http::request::Parts>()
        .and_then(|parts| parts.extensions.get::<Principal>())
        .cloned()
}

/// Sends the client a progress notification (when it asked for them with a progress
/// token) each time it is called: the seconds waited, out of `total`, and a message.
pub(crate) fn progress_reporter(
    ctx: &RequestContext<RoleServer>,
    total: f64,
) -> impl FnMut(f64, &str) + Send + use<> {
    let token = ctx.meta.get_progress_token();
    let peer = ctx.peer.clone();
    move |waited: f64, message: &str| {
        if let Some(token) = token.clone() {
            let peer = peer.clone();
            let param = rmcp::model::ProgressNotificationParam::new(token, waited)
                .with_total(total)
                .with_message(message.to_string());
            tokio::spawn(async move {
                let _ = peer.notify_progress(param).await;
            });
        }
    }
}

impl McpService {
    pub fn new(gate: Arc<Gate>, identity: Identity, operator_tools_enabled: bool) -> Self {
        let group = |router, need| Group { router, need };
        let groups = vec![
            group(
                Self::agent_router() + Self::outcome_router(),
                Need::Scope(Scope::Request),
            ),
            group(Self::verify_router(), Need::Scope(Scope::Verify)),
            group(Self::redeem_router(), Need::Scope(Scope::Redeem)),
            group(Self::evidence_router(), Need::Scope(Scope::Evidence)),
            group(Self::review_router(), Need::Reviewer),
            group(Self::rooms_router(), Need::Scope(Scope::Rooms)),
            group(Self::room_admin_router(), Need::RoomAdmin),
            group(Self::operator_router(), Need::OperatorTools),
        ];
        Self {
            gate,
            identity,
            operator_tools_enabled,
            groups: Arc::new(groups),
            instructions: INSTRUCTIONS,
            blocking_requests: false,
        }
    }

    /// The chatroom profile ([`chatroom`]): the agent tools with the seed's blocking
    /// `request_approval` in place of countersign's, and the room tools. No operator,
    /// evidence or room-admin tools: those are countersign's, at `/mcp`.
    pub fn chatroom(gate: Arc<Gate>, identity: Identity) -> Self {
        let mut agent = Self::agent_router();
        agent.remove_route("request_approval");
        let group = |router, need| Group { router, need };
        let groups = vec![
            group(
                agent + Self::chatroom_router() + Self::outcome_router(),
                Need::Scope(Scope::Request),
            ),
            group(Self::verify_router(), Need::Scope(Scope::Verify)),
            group(Self::rooms_router(), Need::Scope(Scope::Rooms)),
        ];
        Self {
            gate,
            identity,
            operator_tools_enabled: false,
            groups: Arc::new(groups),
            instructions: chatroom::INSTRUCTIONS,
            blocking_requests: true,
        }
    }

    /// Who calls: the stdio process's principal, or the one the HTTP authentication
    /// attached to this request.
    fn caller(&self, ctx: &RequestContext<RoleServer>) -> Result<Principal, ToolError> {
        match &self.identity {
            Identity::Fixed(p) => Ok(p.clone()),
            Identity::PerRequest => http_principal(ctx).ok_or_else(|| {
                GateError::Unauthenticated("no authenticated principal on this request".into())
                    .into()
            }),
        }
    }

    /// Whether `who` may call the tools of a group that needs `need`.
    fn allows(&self, need: Need, who: &Principal) -> bool {
        match need {
            Need::Scope(scope) => who.may(scope),
            Need::OperatorTools => self.operator_tools_enabled && who.may(Scope::Decide),
            Need::RoomAdmin => {
                self.operator_tools_enabled && who.may(Scope::Rooms) && who.may(Scope::Decide)
            }
            Need::Reviewer => self.gate.is_reviewer(who),
        }
    }

    /// What to tell a caller who may not call a tool of a group that needs `need`.
    fn refusal(need: Need, who: &Principal) -> String {
        match need {
            Need::Scope(scope) => format!(
                "needs the {scope} scope, and {} ({} token) has {}",
                who.id, who.role, who.scopes
            ),
            Need::OperatorTools => "is an operator tool: it needs operator_tools = true in the server's config and an approver or admin token with the decide scope".into(),
            Need::RoomAdmin => "is for room admins: it needs operator_tools = true in the server's config and an approver or admin token with the rooms and decide scopes".into(),
            Need::Reviewer => "is for the reviewer the operator named in [review] reviewer".into(),
        }
    }

    fn decider(&self, ctx: &RequestContext<RoleServer>) -> Result<Decider, ToolError> {
        if !self.operator_tools_enabled {
            return Err(
                GateError::Forbidden("the operator tools are off on this server".into()).into(),
            );
        }
        Ok(Decider::new(self.caller(ctx)?)?)
    }
}

impl ServerHandler for McpService {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tasks()
                .build(),
        )
        .with_server_info(Implementation::new(
            "countersign",
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions(self.instructions)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = match self.caller(&context) {
            Ok(who) => self
                .groups
                .iter()
                .filter(|g| self.allows(g.need, &who))
                .flat_map(|g| g.router.list_all())
                .collect(),
            Err(_) => Vec::new(),
        };
        Ok(ListToolsResult::with_all_items(tools))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(group) = self
            .groups
            .iter()
            .find(|g| g.router.has_route(&request.name))
        else {
            return Err(ErrorData::invalid_params(
                format!("there is no tool {}", request.name),
                None,
            ));
        };
        let who = self
            .caller(&context)
            .map_err(|_| ErrorData::invalid_params("no authenticated principal", None))?;
        if !self.allows(group.need, &who) {
            return Err(ErrorData::invalid_params(
                format!("tool {} {}", request.name, Self::refusal(group.need, &who)),
                None,
            ));
        }
        // A client that takes tasks gets one for a request: it polls tasks/get instead
        // of holding a call open while a person decides (tasks.rs).
        if request.name == "request_approval" && tasks::wants_task(&context) {
            return self.request_as_task(request, context).await;
        }
        group
            .router
            .call(ToolCallContext::new(self, request, context))
            .await
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.groups.iter().find_map(|g| g.router.get(name)).cloned()
    }

    async fn get_task(
        &self,
        request: GetTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetTaskResult, ErrorData> {
        self.task_state(&request.task_id, &context).await
    }

    async fn cancel_task(
        &self,
        request: CancelTaskParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        self.cancel_task_of(&request.task_id, &context).await
    }

    async fn update_task(
        &self,
        request: UpdateTaskParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Err(ErrorData::invalid_params(
            format!(
                "task {} asks for no input: it waits for a person's decision",
                request.task_id
            ),
            None,
        ))
    }
}

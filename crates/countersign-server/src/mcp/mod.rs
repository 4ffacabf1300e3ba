//! The MCP adapter: countersign's tools over rmcp, for stdio and Streamable HTTP alike.
//! rmcp moves fast, so everything that touches it stays in this module: the service and
//! its `ServerHandler` here, one file per tool group (`agent`, `evidence`, `rooms`,
//! `operator`). A tool returns `Result<Json<T>, ToolError>`, so `?` turns a domain
//! error into a tool error. Approvals live in the store, never in an MCP request's
//! lifetime: a client that disconnects and comes back finds its request where it left it.

mod agent;
mod evidence;
mod operator;
mod rooms;

use std::sync::Arc;

use countersign_core::{CoreError, Decider, Principal};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::tool::ToolCallContext;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ContentBlock, Implementation, IntoContents,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
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

#[derive(Clone)]
pub struct McpService {
    gate: Arc<Gate>,
    identity: Identity,
    operator_tools_enabled: bool,
    agent_router: Arc<ToolRouter<Self>>,
    operator_router: Arc<ToolRouter<Self>>,
    room_admin_router: Arc<ToolRouter<Self>>,
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

    /// Who calls: the stdio process's principal, or the one the HTTP authentication
    /// attached to this request.
    fn caller(&self, ctx: &RequestContext<RoleServer>) -> Result<Principal, ToolError> {
        match &self.identity {
            Identity::Fixed(p) => Ok(p.clone()),
            Identity::PerRequest => ctx
                .extensions
                .get::<http::request::Parts>()
                .and_then(|parts| parts.extensions.get::<Principal>())
                .cloned()
                .ok_or_else(|| {
                    GateError::Unauthenticated("no authenticated principal on this request".into())
                        .into()
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
        // The guarded groups: who may call them, and what to say to anyone else.
        let guarded = [
            (
                &self.operator_router,
                self.operator_allowed(&context),
                "is an operator tool: it needs operator_tools = true in the server's config and an approver or admin token",
            ),
            (
                &self.room_admin_router,
                self.may_decide(&context),
                "is for room admins: it needs an approver or admin token",
            ),
        ];
        for (router, allowed, refusal) in guarded {
            if router.has_route(&request.name) {
                if !allowed {
                    return Err(ErrorData::invalid_params(
                        format!("tool {} {refusal}", request.name),
                        None,
                    ));
                }
                return router
                    .call(ToolCallContext::new(self, request, context))
                    .await;
            }
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

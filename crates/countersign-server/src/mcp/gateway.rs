//! The MCP gateway: countersign in front of upstream MCP servers. The agent's client
//! sees the upstreams' tools (names, schemas and annotations kept; prefixed with the
//! upstream's name when several are combined), and every `tools/call` goes through the
//! held-call flow ([`crate::held`]): it passes, is refused, or waits for a decision, and
//! an approved call is forwarded once, exactly as approved. Resources and prompts pass
//! through unchanged. docs/gateway.md is the user's guide.

use std::sync::Arc;
use std::time::Duration;

use countersign_core::evidence::OutcomeStatus;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, GetPromptRequestParams,
    GetPromptResponse, Implementation, ListPromptsResult, ListResourceTemplatesResult,
    ListResourcesResult, ListToolsResult, PaginatedRequestParams, ReadResourceRequestParams,
    ReadResourceResponse, ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::{RequestContext, RunningService};
use rmcp::{ErrorData, RoleClient, RoleServer, ServerHandler};
use tokio::sync::RwLock;

use crate::gate::GatewayCall;
use crate::held::{self, Approvals, Verdict};

/// The separator between an upstream's name and a tool's when several are combined.
pub const PREFIX_SEPARATOR: &str = "__";
/// How much of an upstream's answer the outcome's summary keeps.
const SUMMARY_CHARS: usize = 200;

/// One upstream MCP server, connected.
pub struct Upstream {
    pub name: String,
    /// Its `readOnlyHint` is believed: a read-only tool passes when no policy speaks.
    pub trusted: bool,
    client: RunningService<RoleClient, ()>,
    tools: RwLock<Vec<Tool>>,
}

impl Upstream {
    /// An upstream behind the connected `client`; its tools are listed now.
    pub async fn new(
        name: String,
        trusted: bool,
        client: RunningService<RoleClient, ()>,
    ) -> Result<Self, String> {
        let tools = client
            .list_all_tools()
            .await
            .map_err(|e| format!("upstream {name}: could not list its tools: {e}"))?;
        Ok(Self {
            name,
            trusted,
            client,
            tools: RwLock::new(tools),
        })
    }

    async fn refresh(&self) -> Result<Vec<Tool>, ErrorData> {
        let tools =
            self.client.list_all_tools().await.map_err(|e| {
                ErrorData::internal_error(format!("upstream {}: {e}", self.name), None)
            })?;
        *self.tools.write().await = tools.clone();
        Ok(tools)
    }

    async fn tool(&self, name: &str) -> Result<Option<Tool>, ErrorData> {
        if let Some(tool) = self.tools.read().await.iter().find(|t| t.name == name) {
            return Ok(Some(tool.clone()));
        }
        Ok(self.refresh().await?.into_iter().find(|t| t.name == name))
    }

    /// Stops the upstream (for a child process: closes its stdin and waits for it).
    pub async fn close(self) {
        let _ = self.client.cancel().await;
    }
}

/// How the gateway holds calls.
#[derive(Debug, Clone)]
pub struct GatewaySettings {
    /// How long a call may wait for a decision before it fails closed.
    pub hold: Duration,
    /// This process, as the claims of its forwards name it.
    pub instance: String,
    /// The session retries join within (stdio: one per process).
    pub session: String,
    /// How long an approved call may take upstream; past it, its outcome is `unknown`.
    pub forward_timeout: Duration,
}

/// The gateway's MCP server.
#[derive(Clone)]
pub struct GatewayService {
    upstreams: Arc<Vec<Upstream>>,
    gate: Arc<dyn Approvals>,
    settings: GatewaySettings,
}

impl GatewayService {
    pub fn new(
        upstreams: Vec<Upstream>,
        gate: Arc<dyn Approvals>,
        settings: GatewaySettings,
    ) -> Self {
        Self {
            upstreams: Arc::new(upstreams),
            gate,
            settings,
        }
    }

    /// The upstreams, once every session is done (to close them).
    pub fn into_upstreams(self) -> Option<Vec<Upstream>> {
        Arc::try_unwrap(self.upstreams).ok()
    }

    fn prefixed(&self) -> bool {
        self.upstreams.len() > 1
    }

    /// The name the client sees for `upstream`'s tool or prompt `name`.
    fn exposed(&self, upstream: &Upstream, name: &str) -> String {
        if self.prefixed() {
            format!("{}{PREFIX_SEPARATOR}{name}", upstream.name)
        } else {
            name.to_string()
        }
    }

    /// The upstream and its own tool name for the name the client called.
    fn route(&self, name: &str) -> Option<(&Upstream, String)> {
        if !self.prefixed() {
            return self.upstreams.first().map(|u| (u, name.to_string()));
        }
        let (upstream, tool) = name.split_once(PREFIX_SEPARATOR)?;
        self.upstreams
            .iter()
            .find(|u| u.name == upstream)
            .map(|u| (u, tool.to_string()))
    }

    async fn forward(
        &self,
        upstream: &Upstream,
        mut request: CallToolRequestParams,
        tool: String,
        held: Option<String>,
    ) -> Result<CallToolResponse, ErrorData> {
        request.name = tool.into();
        let answer = tokio::time::timeout(
            self.settings.forward_timeout,
            upstream.client.call_tool(request),
        )
        .await
        .unwrap_or_else(|_| {
            Err(rmcp::ServiceError::Timeout {
                timeout: self.settings.forward_timeout,
            })
        });
        let Some(id) = held else {
            return match answer {
                Ok(result) => Ok(CallToolResponse::Complete(result)),
                Err(err) => Ok(tool_error(format!(
                    "upstream {} did not answer: {err}",
                    upstream.name
                ))),
            };
        };
        let (status, summary, response) = match answer {
            Ok(result) => {
                let status = if result.is_error == Some(true) {
                    OutcomeStatus::Failed
                } else {
                    OutcomeStatus::Succeeded
                };
                (
                    status,
                    summary_of(&result),
                    CallToolResponse::Complete(result),
                )
            }
            // The call went out and no answer came back: it may have run. Never again.
            Err(err) => (
                OutcomeStatus::Unknown,
                format!("no answer from upstream {}: {err}", upstream.name),
                tool_error(format!(
                    "the approved call was sent to {} but no answer came back ({err}); whether it ran is unknown, and it will not be sent again (request {id})",
                    upstream.name
                )),
            ),
        };
        if let Err(err) = self.gate.outcome(&id, status, summary).await {
            tracing::warn!(request = %id, %err, "could not record the outcome of a forwarded call");
        }
        Ok(response)
    }
}

fn tool_error(text: String) -> CallToolResponse {
    CallToolResponse::Complete(CallToolResult::error(vec![ContentBlock::text(text)]))
}

/// The first text of an upstream's answer, shortened, as the outcome's summary.
fn summary_of(result: &CallToolResult) -> String {
    let text = result
        .content
        .iter()
        .find_map(|c| c.as_text().map(|t| t.text.clone()))
        .unwrap_or_default();
    let mut summary: String = text.chars().take(SUMMARY_CHARS).collect();
    if text.chars().count() > SUMMARY_CHARS {
        summary.push('…');
    }
    summary
}

impl ServerHandler for GatewayService {
    fn get_info(&self) -> ServerConfig {
        let mut capabilities = ServerCapabilities::builder().enable_tools().build();
        for upstream in self.upstreams.iter() {
            if let Some(info) = upstream.client.peer_info() {
                if capabilities.resources.is_none() {
                    capabilities.resources = info.capabilities.resources.clone();
                }
                if capabilities.prompts.is_none() {
                    capabilities.prompts = info.capabilities.prompts.clone();
                }
            }
        }
        let names: Vec<&str> = self.upstreams.iter().map(|u| u.name.as_str()).collect();
        ServerConfig::new(capabilities)
            .with_server_info(Implementation::new(
                "countersign-gateway",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(format!(
                "countersign gateway in front of {}. Some tool calls are held until a person approves them; a held call answers once decided. A refused call returns a tool error with the reason: do not retry it in another way.",
                names.join(", ")
            ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let mut all = Vec::new();
        for upstream in self.upstreams.iter() {
            for mut tool in upstream.refresh().await? {
                tool.name = self.exposed(upstream, &tool.name).into();
                all.push(tool);
            }
        }
        Ok(ListToolsResult::with_all_items(all))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some((upstream, tool)) = self.route(&request.name) else {
            return Ok(tool_error(format!("no tool named {:?}", request.name)));
        };
        let Some(described) = upstream.tool(&tool).await? else {
            return Ok(tool_error(format!(
                "upstream {} has no tool named {tool:?}",
                upstream.name
            )));
        };
        let read_only = upstream.trusted
            && described
                .annotations
                .as_ref()
                .and_then(|a| a.read_only_hint)
                .unwrap_or(false);
        let call = GatewayCall {
            upstream: upstream.name.clone(),
            tool: tool.clone(),
            arguments: request.arguments.clone().unwrap_or_default(),
            read_only,
            session: self.settings.session.clone(),
            hold: self.settings.hold,
            description: None,
        };
        let mut progress = super::progress_reporter(&context, self.settings.hold.as_secs_f64());
        let cancelled = context.ct.clone();
        let verdict = held::ask(
            &*self.gate,
            &call,
            &self.settings.instance,
            &mut progress,
            async move { cancelled.cancelled().await },
        )
        .await;
        match verdict {
            Ok(Verdict::Forward { request: held }) => {
                self.forward(upstream, request, tool, held).await
            }
            Ok(Verdict::Refused { reason }) => Ok(tool_error(reason)),
            Err(err) => Ok(tool_error(format!(
                "{}: {} (the call was not made)",
                err.code(),
                err.public_message()
            ))),
        }
    }

    async fn list_resources(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let mut all = ListResourcesResult::default();
        for upstream in self.with(|c| c.resources.is_some()) {
            let listed = upstream
                .client
                .list_resources(request.clone())
                .await
                .map_err(upstream_error(upstream))?;
            all.resources.extend(listed.resources);
        }
        Ok(all)
    }

    async fn list_resource_templates(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let mut all = ListResourceTemplatesResult::default();
        for upstream in self.with(|c| c.resources.is_some()) {
            let listed = upstream
                .client
                .list_resource_templates(request.clone())
                .await
                .map_err(upstream_error(upstream))?;
            all.resource_templates.extend(listed.resource_templates);
        }
        Ok(all)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let mut last = ErrorData::resource_not_found(format!("no resource {}", request.uri), None);
        for upstream in self.with(|c| c.resources.is_some()) {
            match upstream.client.read_resource_once(request.clone()).await {
                Ok(answer) => return Ok(answer),
                Err(err) => last = upstream_error(upstream)(err),
            }
        }
        Err(last)
    }

    async fn list_prompts(
        &self,
        request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let mut all = ListPromptsResult::default();
        for upstream in self.with(|c| c.prompts.is_some()) {
            let listed = upstream
                .client
                .list_prompts(request.clone())
                .await
                .map_err(upstream_error(upstream))?;
            for mut prompt in listed.prompts {
                prompt.name = self.exposed(upstream, &prompt.name);
                all.prompts.push(prompt);
            }
        }
        Ok(all)
    }

    async fn get_prompt(
        &self,
        mut request: GetPromptRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let Some((upstream, name)) = self.route(&request.name) else {
            return Err(ErrorData::invalid_params(
                format!("no prompt named {:?}", request.name),
                None,
            ));
        };
        request.name = name;
        upstream
            .client
            .get_prompt_once(request)
            .await
            .map_err(upstream_error(upstream))
    }
}

impl GatewayService {
    /// The upstreams whose capabilities pass `test`.
    fn with(&self, test: impl Fn(&ServerCapabilities) -> bool) -> Vec<&Upstream> {
        self.upstreams
            .iter()
            .filter(|u| u.client.peer_info().is_some_and(|i| test(&i.capabilities)))
            .collect()
    }
}

fn upstream_error(upstream: &Upstream) -> impl Fn(rmcp::ServiceError) -> ErrorData + '_ {
    move |err| match err {
        rmcp::ServiceError::McpError(data) => data,
        other => ErrorData::internal_error(format!("upstream {}: {other}", upstream.name), None),
    }
}

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
    ReadResourceResponse, ResultType, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};

pub use super::upstream::{Transport, Upstream};
use crate::gate::{Gate, GatewayCall};
use crate::held::{self, Approvals, LocalGate, Verdict};

/// The separator between an upstream's name and a tool's when several are combined.
pub const PREFIX_SEPARATOR: &str = "__";
/// How long a held call waits for a decision, by default (a person has this long).
pub const DEFAULT_HOLD_SECONDS: u64 = 600;
/// How long an approved call may take upstream, by default.
pub const DEFAULT_FORWARD_SECONDS: u64 = 300;
/// How much of an upstream's answer the outcome's summary keeps.
const SUMMARY_CHARS: usize = 200;

/// A gateway as the config names it (`[[gateway]]`, docs/gateway.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayConfig {
    /// Served at `/mcp/gateway/<name>`; `countersign proxy --gateway <name>`.
    pub name: String,
    pub upstreams: Vec<UpstreamConfig>,
    /// How long a call may wait for a decision.
    pub hold: Duration,
    /// How long an approved call may take upstream.
    pub forward_timeout: Duration,
}

/// One upstream of a configured gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamConfig {
    pub name: String,
    pub trusted: bool,
    pub transport: Transport,
}

impl GatewayConfig {
    /// Its upstreams, not connected yet.
    pub fn upstreams(&self) -> Vec<Arc<Upstream>> {
        self.upstreams
            .iter()
            .map(|u| {
                Arc::new(Upstream::new(
                    u.name.clone(),
                    u.trusted,
                    u.transport.clone(),
                ))
            })
            .collect()
    }
}

/// How the gateway holds calls.
#[derive(Debug, Clone)]
pub struct GatewaySettings {
    /// How long a call may wait for a decision before it fails closed.
    pub hold: Duration,
    /// This process, as the claims of its forwards name it.
    pub instance: String,
    /// The session retries join within (stdio: one per process; over HTTP, where the
    /// protocol has no sessions, the caller's credential is the session).
    pub session: String,
    /// How long an approved call may take upstream; past it, its outcome is `unknown`.
    pub forward_timeout: Duration,
}

/// Whom the gateway asks, and as whom.
#[derive(Clone)]
pub enum Asks {
    /// One gate for the whole process, acting as one agent: `countersign proxy` (a local
    /// data directory, or a remote `serve` through a gateway token).
    Fixed(Arc<dyn Approvals>),
    /// This server's gate, acting as the agent whose token authenticated each HTTP
    /// request (`/mcp/gateway/<name>` on `serve`): the server is the gateway.
    Served(Arc<Gate>),
}

/// The gateway's MCP server.
#[derive(Clone)]
pub struct GatewayService {
    upstreams: Arc<Vec<Arc<Upstream>>>,
    asks: Asks,
    settings: GatewaySettings,
    /// The outcomes of forwarded calls still being recorded: the agent has its answer
    /// before the outcome's commit (the claim, durable before the call went out, is
    /// what keeps it from running twice; a lost outcome is swept as `unknown`).
    outcomes: Outcomes,
}

/// Outcomes being recorded after their call's answer went back, by call.
#[derive(Clone, Default)]
struct Outcomes {
    tasks: tokio_util::task::TaskTracker,
    /// Per call (upstream, tool, arguments): held while its outcome is recorded, so that
    /// the same call made again waits for it and is a new request, rather than joining
    /// the one whose outcome is not written yet (which refuses it).
    recording:
        Arc<std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>>,
}

impl Outcomes {
    fn key(call: &GatewayCall) -> String {
        let arguments = countersign_core::jcs::to_vec(&call.arguments).unwrap_or_default();
        format!(
            "{}\n{}\n{}",
            call.upstream,
            call.tool,
            String::from_utf8_lossy(&arguments)
        )
    }

    /// Waits until no outcome of `call` is being recorded.
    async fn settled(&self, call: &GatewayCall) {
        let lock = match self.recording.lock() {
            Ok(map) => map.get(&Self::key(call)).cloned(),
            Err(_) => None,
        };
        if let Some(lock) = lock {
            drop(lock.lock().await);
        }
    }

    /// Records `call`'s outcome in the background (`record`), holding its call's lock.
    fn record(
        &self,
        call: &GatewayCall,
        record: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let key = Self::key(call);
        let lock = match self.recording.lock() {
            Ok(mut map) => map.entry(key.clone()).or_default().clone(),
            Err(_) => Arc::default(),
        };
        // Taken before the answer goes back, so a call made after it always waits.
        let Ok(guard) = lock.clone().try_lock_owned() else {
            // Another outcome of the same call is being recorded: wait behind it.
            let recording = self.recording.clone();
            self.tasks.spawn(async move {
                let _guard = lock.lock_owned().await;
                record.await;
                forget(&recording, &key);
            });
            return;
        };
        let recording = self.recording.clone();
        self.tasks.spawn(async move {
            record.await;
            drop(guard);
            forget(&recording, &key);
        });
    }
}

/// Drops `key`'s lock once nobody holds or waits for it.
fn forget(
    recording: &std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    key: &str,
) {
    if let Ok(mut map) = recording.lock()
        && map
            .get(key)
            .is_some_and(|lock| Arc::strong_count(lock) == 1)
    {
        map.remove(key);
    }
}

impl GatewayService {
    pub fn new(upstreams: Vec<Arc<Upstream>>, asks: Asks, settings: GatewaySettings) -> Self {
        Self {
            upstreams: Arc::new(upstreams),
            asks,
            settings,
            outcomes: Outcomes::default(),
        }
    }

    /// Waits (up to `within`) for the outcomes still being recorded, before the
    /// process stops; true when none is left.
    pub async fn settle(&self, within: Duration) -> bool {
        self.outcomes.tasks.close();
        tokio::time::timeout(within, self.outcomes.tasks.wait())
            .await
            .is_ok()
    }

    pub fn upstreams(&self) -> &[Arc<Upstream>] {
        &self.upstreams
    }

    pub fn settings(&self) -> &GatewaySettings {
        &self.settings
    }

    /// The gate this call is asked of, as the caller.
    fn approvals(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Result<Arc<dyn Approvals>, String> {
        match &self.asks {
            Asks::Fixed(approvals) => Ok(approvals.clone()),
            Asks::Served(gate) => {
                let who = super::http_principal(context)
                    .ok_or("no authenticated principal on this request")?
                    .through_served_gateway()
                    .map_err(|e| e.to_string())?;
                Ok(Arc::new(LocalGate {
                    gate: gate.clone(),
                    who,
                }))
            }
        }
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
            return self.upstreams.first().map(|u| (&**u, name.to_string()));
        }
        let (upstream, tool) = name.split_once(PREFIX_SEPARATOR)?;
        self.upstreams
            .iter()
            .find(|u| u.name == upstream)
            .map(|u| (&**u, tool.to_string()))
    }

    async fn forward(
        &self,
        gate: Arc<dyn Approvals>,
        call: &GatewayCall,
        upstream: &Upstream,
        mut request: CallToolRequestParams,
        held: Option<String>,
    ) -> Result<CallToolResponse, ErrorData> {
        let tool = call.tool.clone();
        request.name = tool.into();
        let peer = match upstream.peer().await {
            Ok(peer) => peer,
            Err(reason) => {
                // Nothing was sent: the call did not run.
                if let Some(id) = &held {
                    let summary = format!("not sent: {reason}");
                    if let Err(err) = gate.outcome(id, OutcomeStatus::Failed, summary).await {
                        tracing::warn!(request = %id, %err, "could not record the outcome of an unsent call");
                    }
                }
                return Ok(tool_error(format!(
                    "the call was not made: {reason}{}",
                    held.map(|id| format!(" (request {id} is used up: ask again)"))
                        .unwrap_or_default()
                )));
            }
        };
        let answer = tokio::time::timeout(self.settings.forward_timeout, peer.call_tool(request))
            .await
            .unwrap_or_else(|_| {
                Err(rmcp::ServiceError::Timeout {
                    timeout: self.settings.forward_timeout,
                })
            })
            .map(|mut result| {
                complete(&mut result.result_type);
                result
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
        // The answer goes back now; the outcome is written beside it.
        self.outcomes.record(call, async move {
            if let Err(err) = gate.outcome(&id, status, summary).await {
                tracing::warn!(request = %id, %err, "could not record the outcome of a forwarded call");
            }
        });
        Ok(response)
    }
}

/// Marks an upstream's result as complete: an upstream on an older protocol leaves the
/// discriminator out, which a client on 2026-07-28 requires (rmcp strips it again for a
/// client on an older protocol).
fn complete(result_type: &mut Option<ResultType>) {
    result_type.get_or_insert(ResultType::COMPLETE);
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
            if let Some(theirs) = upstream.capabilities() {
                if capabilities.resources.is_none() {
                    capabilities.resources = theirs.resources;
                }
                if capabilities.prompts.is_none() {
                    capabilities.prompts = theirs.prompts;
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
        let gate = match self.approvals(&context) {
            Ok(gate) => gate,
            Err(reason) => return Ok(tool_error(format!("forbidden: {reason}"))),
        };
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
            // Set by the held-call flow, for this instance.
            claim_for: None,
        };
        // The same call made just before may still be having its outcome recorded.
        self.outcomes.settled(&call).await;
        let mut progress = super::progress_reporter(&context, self.settings.hold.as_secs_f64());
        let cancelled = context.ct.clone();
        let verdict = held::ask(
            &*gate,
            &call,
            &self.settings.instance,
            &mut progress,
            async move { cancelled.cancelled().await },
        )
        .await;
        match verdict {
            Ok(Verdict::Forward { request: held }) => {
                self.forward(gate, &call, upstream, request, held).await
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
            let listed = peer_of(upstream)
                .await?
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
            let listed = peer_of(upstream)
                .await?
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
            let Ok(peer) = upstream.peer().await else {
                continue;
            };
            match peer.read_resource_once(request.clone()).await {
                Ok(mut answer) => {
                    if let ReadResourceResponse::Complete(result) = &mut answer {
                        complete(&mut result.result_type);
                    }
                    return Ok(answer);
                }
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
            let listed = peer_of(upstream)
                .await?
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
        let mut answer = peer_of(upstream)
            .await?
            .get_prompt_once(request)
            .await
            .map_err(upstream_error(upstream))?;
        if let GetPromptResponse::Complete(result) = &mut answer {
            complete(&mut result.result_type);
        }
        Ok(answer)
    }
}

impl GatewayService {
    /// The upstreams whose capabilities pass `test`.
    fn with(&self, test: impl Fn(&ServerCapabilities) -> bool) -> Vec<&Upstream> {
        self.upstreams
            .iter()
            .filter(|u| u.capabilities().is_some_and(|c| test(&c)))
            .map(|u| &**u)
            .collect()
    }
}

async fn peer_of(upstream: &Upstream) -> Result<rmcp::service::Peer<rmcp::RoleClient>, ErrorData> {
    upstream
        .peer()
        .await
        .map_err(|e| ErrorData::internal_error(e, None))
}

fn upstream_error(upstream: &Upstream) -> impl Fn(rmcp::ServiceError) -> ErrorData + '_ {
    move |err| match err {
        rmcp::ServiceError::McpError(data) => data,
        other => ErrorData::internal_error(format!("upstream {}: {other}", upstream.name), None),
    }
}

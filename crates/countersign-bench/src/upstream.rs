//! The upstream MCP server the gateway benchmark fronts (`countersign-bench upstream`,
//! hidden): two tools and nothing else, over stdio, or over Streamable HTTP with
//! `--listen`. `echo` says it only reads (`readOnlyHint: true`) and returns its `text`;
//! `write` does not say so, counts the call in memory and returns "ok". It does as little
//! as an MCP server can, so that what the benchmark measures is the transport and the
//! gateway, not the tool.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::{Value, json};

/// The read-only tool: answers its `text`.
pub(crate) const ECHO: &str = "echo";
/// The tool that is not read-only: answers [`WRITTEN`].
pub(crate) const WRITE: &str = "write";
/// What `write` answers.
pub(crate) const WRITTEN: &str = "ok";

#[derive(Clone)]
struct Upstream {
    tools: Arc<Vec<Tool>>,
    writes: Arc<AtomicU64>,
}

impl Upstream {
    fn new() -> Upstream {
        let schema = |description: &str| -> JsonObject {
            match json!({
                "type": "object",
                "properties": {"text": {"type": "string", "description": description}},
                "required": ["text"],
            }) {
                Value::Object(map) => map,
                _ => JsonObject::new(),
            }
        };
        let echo = Tool::new(ECHO, "Returns its text.", schema("the text to return"))
            .annotate(ToolAnnotations::new().read_only(true));
        let write = Tool::new(
            WRITE,
            "Writes its text (counts it in memory) and returns \"ok\".",
            schema("the text to write"),
        )
        .annotate(
            ToolAnnotations::new()
                .read_only(false)
                .destructive(false)
                .idempotent(false),
        );
        Upstream {
            tools: Arc::new(vec![echo, write]),
            writes: Arc::new(AtomicU64::new(0)),
        }
    }
}

/// The call's `text` argument.
fn text_of(request: &CallToolRequestParams) -> Option<&str> {
    request
        .arguments
        .as_ref()
        .and_then(|a| a.get("text"))
        .and_then(Value::as_str)
}

impl ServerHandler for Upstream {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build()).with_server_info(
            Implementation::new("countersign-bench-upstream", env!("CARGO_PKG_VERSION")),
        )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools.to_vec()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let Some(text) = text_of(&request) else {
            let missing = ContentBlock::text("the argument `text` is missing");
            return Ok(CallToolResult::error(vec![missing]).into());
        };
        let answer = match &*request.name {
            ECHO => text.to_string(),
            WRITE => {
                self.writes.fetch_add(1, Ordering::Relaxed);
                WRITTEN.to_string()
            }
            other => {
                return Err(ErrorData::invalid_params(
                    format!("there is no tool {other}"),
                    None,
                ));
            }
        };
        Ok(CallToolResult::success(vec![ContentBlock::text(answer)]).into())
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tools.iter().find(|t| t.name == name).cloned()
    }
}

/// Serves the upstream: over stdio until the client closes it, or with `listen` over
/// Streamable HTTP at `/mcp` (stateless, JSON answers) until killed, after printing
/// `listening on http://ADDRESS` to standard error.
pub(crate) async fn serve(listen: Option<&str>) -> anyhow::Result<()> {
    let upstream = Upstream::new();
    let Some(listen) = listen else {
        let running = upstream
            .serve(rmcp::transport::stdio())
            .await
            .context("the MCP client did not complete the handshake")?;
        running.waiting().await?;
        return Ok(());
    };
    let config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true);
    let service = StreamableHttpService::new(
        move || Ok(upstream.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    let router = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    eprintln!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router).await?;
    Ok(())
}

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use countersign_server::{Identity, McpService};
use rmcp::ServiceExt;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::runtime;

#[derive(Debug, Args)]
pub struct McpArgs {
    /// The name this agent's requests are recorded under (default: the OS user).
    #[arg(long, value_name = "NAME")]
    pub agent_name: Option<String>,
}

/// Serves the agent tools over stdin/stdout as the local agent. Operator tools are never
/// offered here: a stdio process is an agent, and agents do not decide.
pub async fn run(config: &Config, args: &McpArgs) -> anyhow::Result<ExitCode> {
    if let Some(name) = &args.agent_name {
        countersign_core::token::validate_token_name(name)
            .map_err(|e| anyhow::anyhow!("--agent-name: {e}"))?;
    }
    let gate = runtime::open(config).await?;
    let shutdown = CancellationToken::new();
    tokio::spawn(gate.clone().run_expiry(shutdown.clone()));
    tokio::spawn(
        gate.log()
            .clone()
            .run(gate.feed().clone(), shutdown.clone()),
    );
    let principal = runtime::stdio_agent(args.agent_name.as_deref());
    tracing::info!(agent = %principal.id, data_dir = %config.data_dir.display(), "serving MCP over stdio");
    let service = McpService::new(gate, Identity::Fixed(principal), false);
    let running = service
        .serve(rmcp::transport::stdio())
        .await
        .context("the MCP client did not complete the handshake")?;
    running.waiting().await.context("the MCP session failed")?;
    shutdown.cancel();
    Ok(ExitCode::SUCCESS)
}

use std::process::ExitCode;

use anyhow::Context;
use clap::Args;
use countersign_server::{Identity, McpService};
use rmcp::ServiceExt;

use crate::config::Config;
use crate::remote::{Remote, RemoteArgs};
use crate::runtime;

#[derive(Debug, Args)]
pub struct McpArgs {
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// The name this agent's requests are recorded under (default: the OS user).
    #[arg(long, value_name = "NAME")]
    pub agent_name: Option<String>,
}

/// Serves the agent tools over stdin/stdout as the local agent. Operator tools are never
/// offered here: a stdio process is an agent, and agents do not decide. With `--server`,
/// relays the stdio client to that server's `/mcp` instead, as the token's agent.
pub async fn run(config: &Config, args: &McpArgs) -> anyhow::Result<ExitCode> {
    if let Some(remote) = Remote::from_args(&args.remote, args.agent_name.as_deref())? {
        tracing::info!(server = %remote.describe(), "relaying MCP over stdio");
        crate::remote::relay(remote).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let (gate, principal, shutdown) =
        runtime::open_agent(config, args.agent_name.as_deref(), true).await?;
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

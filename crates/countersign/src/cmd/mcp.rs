use std::process::ExitCode;
use std::time::Duration;

use std::sync::Arc;

use anyhow::Context;
use clap::{Args, ValueEnum};
use countersign_server::mcp::approval_gate::{self, ApprovalGateService};
use countersign_server::mcp::looppause::{self, LoopPauseService};
use countersign_server::operate::Operations;
use countersign_server::{Identity, McpService};
use rmcp::ServiceExt;

use crate::cmd::serve::OPERATION_MARGIN;
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
    /// Serve another system's tools instead of countersign's own: `approval-gate`, the
    /// operator's tools of approval-gate-mcp over the configured bridges
    /// (docs/bridge.md; they need an approver's token: --token-file FILE, with or
    /// without --server); `chatroom`, the agent chatroom's tools, with a blocking
    /// request_approval (docs/rooms.md); `looppause`, LoopPause's request_approval,
    /// check_approval and verify_proof (docs/migrating.md): as the local agent, as
    /// --token-file's token, or relayed to --server's /mcp/profile/looppause;
    /// LOOPPAUSE_API_URL and LOOPPAUSE_API_KEY stand for --server and the token.
    #[arg(long, value_enum, value_name = "PROFILE")]
    pub profile: Option<Profile>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Profile {
    ApprovalGate,
    Chatroom,
    Looppause,
}

/// Serves the agent tools over stdin/stdout as the local agent. Operator tools are never
/// offered here: a stdio process is an agent, and agents do not decide. With `--server`,
/// relays the stdio client to that server's `/mcp` instead, as the token's agent. With
/// `--profile approval-gate`, serves that profile instead (below).
pub async fn run(config: &Config, args: &McpArgs) -> anyhow::Result<ExitCode> {
    if args.profile == Some(Profile::ApprovalGate) {
        return approval_gate(config, args).await;
    }
    if args.profile == Some(Profile::Looppause) {
        return looppause_profile(config, args).await;
    }
    let chatroom = args.profile == Some(Profile::Chatroom);
    if let Some(remote) = Remote::from_args(&args.remote, args.agent_name.as_deref())? {
        tracing::info!(server = %remote.describe(), "relaying MCP over stdio");
        let path = if chatroom {
            format!("mcp/profile/{}", countersign_server::mcp::chatroom::PROFILE)
        } else {
            "mcp".to_string()
        };
        crate::remote::relay(remote, &path).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let (gate, principal, shutdown) =
        runtime::open_agent(config, args.agent_name.as_deref(), true).await?;
    tracing::info!(agent = %principal.id, data_dir = %config.data_dir.display(), "serving MCP over stdio");
    tokio::spawn(warn_if_nobody_notifies(
        config.clone(),
        gate.keys().signer().kid().to_string(),
    ));
    let service = if chatroom {
        McpService::chatroom(gate, Identity::Fixed(principal))
    } else {
        McpService::new(gate, Identity::Fixed(principal), false)
    };
    let running = service
        .serve(rmcp::transport::stdio())
        .await
        .context("the MCP client did not complete the handshake")?;
    running.waiting().await.context("the MCP session failed")?;
    shutdown.cancel();
    Ok(ExitCode::SUCCESS)
}

/// `--profile approval-gate`: the caller is who `--token-file`'s token names, checked
/// against the local data directory at every call (a revoked token stops working
/// mid-session), or relayed to `--server`'s `/mcp/profile/approval-gate` as that token.
/// Without a token the caller is the local agent, as for the native tools, and an agent
/// is refused every tool of this profile: the MCP client that launched this process is
/// a model, and approving is the operator's act, so the operator's credential must be
/// one they chose to give it.
async fn approval_gate(config: &Config, args: &McpArgs) -> anyhow::Result<ExitCode> {
    let path = format!("mcp/profile/{}", approval_gate::PROFILE);
    if args.remote.server.is_some()
        && let Some(remote) = Remote::from_args(&args.remote, args.agent_name.as_deref())?
    {
        tracing::info!(server = %remote.describe(), "relaying the approval-gate profile over stdio");
        crate::remote::relay(remote, &path).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let (gate, agent, shutdown) =
        runtime::open_agent(config, args.agent_name.as_deref(), true).await?;
    let gate_for_ops = gate.clone();
    let service = match &args.remote.token_file {
        Some(file) => {
            if args.agent_name.is_some() {
                anyhow::bail!(
                    "give --agent-name or --token-file, not both: the token names the caller"
                );
            }
            let token = crate::remote::read_token_file(file)?;
            let who = gate.authenticate(&token).await.map_err(|e| {
                anyhow::anyhow!("the token in {}: {}", file.display(), e.public_message())
            })?;
            tracing::info!(caller = %who.id, "serving the approval-gate profile over stdio");
            ApprovalGateService::with_token(gate, token, config.bridges.clone())
        }
        None => {
            tracing::warn!(caller = %agent.id, "no --token-file: serving the approval-gate profile as the local agent, which may call none of its tools (they need an approver's token)");
            ApprovalGateService::new(gate, Identity::Fixed(agent), config.bridges.clone())
        }
    };
    let service = if config.operate.is_empty() {
        service
    } else {
        let ops = Arc::new(Operations::new(
            gate_for_ops,
            Arc::new(config.operate.clone()),
            format!("mcp-{}", std::process::id()),
        ));
        // Without a `serve`, nothing else records `unknown` for an operation whose
        // claimer died; a claim is only swept once its run must have ended.
        match ops.sweep(OPERATION_MARGIN).await {
            Ok(0) => {}
            Ok(swept) => tracing::warn!(
                swept,
                "operations claimed by a process that stopped before recording their outcome are recorded as unknown"
            ),
            Err(err) => tracing::warn!(%err, "could not sweep the operations"),
        }
        service.with_operations(ops)
    };
    let running = service
        .serve(rmcp::transport::stdio())
        .await
        .context("the MCP client did not complete the handshake")?;
    running.waiting().await.context("the MCP session failed")?;
    shutdown.cancel();
    Ok(ExitCode::SUCCESS)
}

/// `--profile looppause`: LoopPause's tools. The caller is `--server`'s token's agent
/// (relayed to `/mcp/profile/looppause`), `--token-file`'s token checked against the
/// local data directory at every call, or the local agent. LoopPause's own variables
/// stand in where countersign's are not given: LOOPPAUSE_API_URL for `--server` and
/// LOOPPAUSE_API_KEY for the token (it must be a countersign agent token; a LoopPause
/// `sk_live_` key is refused by the server like any unknown token).
async fn looppause_profile(config: &Config, args: &McpArgs) -> anyhow::Result<ExitCode> {
    let path = format!("mcp/profile/{}", looppause::PROFILE);
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let server = args
        .remote
        .server
        .clone()
        .or_else(|| env("LOOPPAUSE_API_URL"));
    let key = match &args.remote.token_file {
        Some(file) => Some(crate::remote::read_token_file(file)?),
        None => env("LOOPPAUSE_API_KEY").map(|k| k.trim().to_string()),
    };
    if let Some(server) = server {
        let Some(token) = key else {
            anyhow::bail!(
                "--server (or LOOPPAUSE_API_URL) needs a token: --token-file FILE or LOOPPAUSE_API_KEY"
            );
        };
        let remote = Remote::with_token(&server, token)?;
        tracing::info!(server = %remote.describe(), "relaying the looppause profile over stdio");
        crate::remote::relay(remote, &path).await?;
        return Ok(ExitCode::SUCCESS);
    }
    let (gate, agent, shutdown) =
        runtime::open_agent(config, args.agent_name.as_deref(), true).await?;
    let service = match key {
        Some(token) => {
            if args.agent_name.is_some() {
                anyhow::bail!(
                    "give --agent-name or a token (--token-file, LOOPPAUSE_API_KEY), not both: the token names the caller"
                );
            }
            let who = gate
                .authenticate(&token)
                .await
                .map_err(|e| anyhow::anyhow!("the token: {}", e.public_message()))?;
            tracing::info!(caller = %who.id, "serving the looppause profile over stdio");
            LoopPauseService::with_token(gate, token)
        }
        None => {
            tracing::info!(agent = %agent.id, "serving the looppause profile over stdio");
            tokio::spawn(warn_if_nobody_notifies(
                config.clone(),
                gate.keys().signer().kid().to_string(),
            ));
            LoopPauseService::new(gate, Identity::Fixed(agent))
        }
    };
    let running = service
        .serve(rmcp::transport::stdio())
        .await
        .context("the MCP client did not complete the handshake")?;
    running.waiting().await.context("the MCP session failed")?;
    shutdown.cancel();
    Ok(ExitCode::SUCCESS)
}

/// Slack, email, webhooks and reminders are sent by `serve` alone: a stdio `mcp` with
/// channels configured and no `serve` of this installation (the same signing key) at the
/// configured listen address would notify nobody of its requests, silently. Says so
/// once, on stderr.
async fn warn_if_nobody_notifies(config: Config, kid: String) {
    if config.notify.is_empty() && config.notify.reminders.is_none() {
        return;
    }
    let at = crate::cmd::healthcheck::loopback_for(config.listen);
    let served_here = crate::cmd::healthcheck::ask(&format!("http://{at}"), Duration::from_secs(2))
        .await
        .is_ok_and(|(_, body)| body["kid"] == kid.as_str());
    if !served_here {
        crate::cmd::announce(
            "WARN",
            &format!(
                "channels (Slack, email, webhooks, reminders) are configured, but they are sent only by `countersign serve`, and no serve of this data directory answers at {at}: nobody is notified of the requests made here until one runs (`countersign serve --data-dir {}`)",
                config.data_dir.display()
            ),
        );
    }
}

//! `countersign proxy -- CMD ARGS...`: the MCP gateway in front of one stdio upstream,
//! served over stdio to the agent's client (which launches this command instead of the
//! upstream's); `countersign proxy --gateway NAME`: a gateway of the config's
//! `[[gateway]]` sections, with all its upstreams, served the same way. docs/gateway.md.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use countersign_server::held::MAX_HOLD_SECONDS;
use countersign_server::mcp::gateway::{
    Asks, DEFAULT_FORWARD_SECONDS, DEFAULT_HOLD_SECONDS, GatewayService, GatewaySettings,
    Transport, Upstream,
};
use rmcp::ServiceExt;

use crate::config::Config;
use crate::remote::RemoteArgs;
use crate::runtime;

#[derive(Debug, Args)]
pub struct ProxyArgs {
    #[command(flatten)]
    pub remote: RemoteArgs,
    /// The name this agent's requests are recorded under (default: the OS user).
    #[arg(long, value_name = "NAME")]
    pub agent_name: Option<String>,
    /// Serve the gateway of this name from the config's `[[gateway]]` sections (its
    /// upstreams, trust and timeouts), instead of one upstream given after `--`.
    #[arg(long, value_name = "NAME", conflicts_with_all = ["name", "untrusted", "command", "hold", "forward_timeout"])]
    pub gateway: Option<String>,
    /// The upstream's name in requests and policies (`Server::"<name>"`; default: the
    /// command's file name).
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Do not believe the upstream's readOnlyHint: every call is asked for unless a
    /// policy decides it.
    #[arg(long)]
    pub untrusted: bool,
    /// Seconds a held call waits for a decision before it is refused (and its request
    /// times out).
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_HOLD_SECONDS)]
    pub hold: u64,
    /// Seconds an approved call may take upstream; past it, its outcome is recorded as
    /// unknown (it is never sent again). Forwards of an earlier gateway left without an
    /// outcome for this long are recorded as unknown when this one starts.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_FORWARD_SECONDS)]
    pub forward_timeout: u64,
    /// The upstream MCP server to launch, and its arguments (after `--`).
    #[arg(last = true, required_unless_present = "gateway", value_name = "CMD")]
    pub command: Vec<String>,
}

pub async fn run(config: &Config, args: &ProxyArgs) -> anyhow::Result<ExitCode> {
    let (upstreams, hold, forward_timeout) = match &args.gateway {
        Some(name) => {
            let gateway = config
                .gateways
                .iter()
                .find(|g| &g.name == name)
                .with_context(|| {
                    let known: Vec<&str> =
                        config.gateways.iter().map(|g| g.name.as_str()).collect();
                    format!(
                        "--gateway {name}: the config has no [[gateway]] of that name ({})",
                        if known.is_empty() {
                            "it has none".to_string()
                        } else {
                            format!("it has {}", known.join(", "))
                        }
                    )
                })?;
            (gateway.upstreams(), gateway.hold, gateway.forward_timeout)
        }
        None => {
            if args.hold == 0 || args.hold > MAX_HOLD_SECONDS {
                anyhow::bail!("--hold: give between 1 and {MAX_HOLD_SECONDS} seconds");
            }
            let transport = Transport::Stdio {
                command: args.command.clone(),
                cwd: None,
                env: Default::default(),
                // The agent's client launched this process as its user: the upstream
                // gets the environment it would have had without the gateway.
                inherit_env: true,
            };
            let upstream = Upstream::new(upstream_name(args)?, !args.untrusted, transport);
            (
                vec![Arc::new(upstream)],
                Duration::from_secs(args.hold),
                Duration::from_secs(args.forward_timeout.max(1)),
            )
        }
    };
    let (gate, who, shutdown) =
        runtime::open_gateway(config, &args.remote, args.agent_name.as_deref(), true).await?;
    for upstream in &upstreams {
        upstream.peer().await.map_err(anyhow::Error::msg)?;
    }
    let instance = format!("proxy-{}", random_hex()?);
    let settings = GatewaySettings {
        hold,
        session: instance.clone(),
        instance,
        forward_timeout,
    };
    for upstream in &upstreams {
        tracing::info!(%who, upstream = %upstream.name, "gateway serving MCP over stdio");
        let swept = gate
            .sweep(&upstream.name, settings.forward_timeout)
            .await
            .map_err(|e| anyhow::anyhow!("{}: {}", e.code(), e.public_message()))?;
        if swept > 0 {
            tracing::warn!(upstream = %upstream.name, swept, "forwards left without an outcome by an earlier gateway are recorded as unknown");
        }
    }
    let service = GatewayService::new(upstreams, Asks::Fixed(gate), settings);
    let running = service
        .clone()
        .serve(rmcp::transport::stdio())
        .await
        .context("the MCP client did not complete the handshake")?;
    let ended = running.waiting().await;
    // The outcomes of the last calls may still be being written.
    if !service.settle(Duration::from_secs(10)).await {
        tracing::warn!(
            "some outcomes were not written before the gateway stopped; they will be swept as unknown"
        );
    }
    shutdown.cancel();
    for upstream in service.upstreams() {
        upstream.close().await;
    }
    ended.context("the MCP session failed")?;
    Ok(ExitCode::SUCCESS)
}

/// The upstream's name: `--name`, else the command's file name, as a token name.
fn upstream_name(args: &ProxyArgs) -> anyhow::Result<String> {
    let name = match &args.name {
        Some(name) => name.clone(),
        None => {
            // A launcher (python, node, npx...) names nothing: its script or package does.
            const LAUNCHERS: [&str; 12] = [
                "python", "python3", "node", "npx", "uv", "uvx", "deno", "bun", "bunx", "sh",
                "bash", "pipx",
            ];
            let stem = |arg: &str| {
                std::path::Path::new(arg)
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .unwrap_or("upstream")
                    .to_string()
            };
            let program = stem(args.command.first().map(String::as_str).unwrap_or(""));
            let base = if LAUNCHERS.contains(&program.as_str()) {
                args.command[1..]
                    .iter()
                    .find(|a| !a.starts_with('-') && *a != "run")
                    .map_or(program, |a| {
                        // npm's "@scope/name@version": the name.
                        let bare = a.strip_prefix('@').unwrap_or(a);
                        stem(bare.split('@').next().unwrap_or(bare))
                    })
            } else {
                program
            };
            base.chars()
                .map(|c| {
                    if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                        c
                    } else {
                        '-'
                    }
                })
                .collect()
        }
    };
    countersign_core::token::validate_token_name(&name)
        .map_err(|e| anyhow::anyhow!("--name {name:?}: {e}"))?;
    Ok(name)
}

fn random_hex() -> anyhow::Result<String> {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
    Ok(hex::encode(bytes))
}
